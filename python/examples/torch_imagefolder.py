#!/usr/bin/env python3
"""A torch Dataset over granary:// (docs/python.md): torchvision's ImageFolder layout
(root/<class>/<image>), listed and read through fsspec, decoded with PIL.

    python3 torch_imagefolder.py granary:///imagenet/train --workers 2 --batch 32

reads one epoch with a DataLoader and prints images/s and a digest of every decoded image (in the
dataset's order), so two roots holding the same files — granary:// and a local copy — can be
compared: their digests are equal. Any fsspec URL or a local path works as the root.

With DataLoader workers (forked processes), each worker makes its own connection to the worker's
socket on first use (GranaryFileSystem notices the fork); with the "spawn" start method the
filesystem is pickled by its options and made again in each worker.
"""
import argparse
import hashlib
import os
import sys
import time

import fsspec
import torch
import torch.utils.data
from PIL import Image

try:  # registers granary:// when the package is on PYTHONPATH but not installed (its entry point)
    import granary  # noqa: F401
except ImportError:
    pass

EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".webp")


class GranaryImageFolder(torch.utils.data.Dataset):
    """ImageFolder over fsspec: samples are (path, class index); __getitem__ returns
    (transform(image), class index). `root`: granary:///ns/path (or any fsspec URL or local path);
    storage options (socket=..., metadata_ttl=...) go to the filesystem."""

    def __init__(self, root, transform=None, extensions=EXTENSIONS, **storage_options):
        self.fs, self.root = fsspec.core.url_to_fs(root, **storage_options)
        self.transform = transform
        dirs = [e["name"] for e in self.fs.ls(self.root, detail=True) if e["type"] == "directory"]
        self.classes = sorted(os.path.basename(d.rstrip("/")) for d in dirs)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = []
        for c in self.classes:
            # One listing per class: the files' information comes with it, so opens ask nothing more.
            names = sorted(e["name"] for e in self.fs.ls(self.root.rstrip("/") + "/" + c, detail=True)
                           if e["type"] == "file" and e["name"].lower().endswith(extensions))
            self.samples += [(n, self.class_to_idx[c]) for n in names]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        with self.fs.open(path, "rb") as f:  # torchvision's pil_loader, through fsspec
            img = Image.open(f)
            img = img.convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, target


def to_tensor(img):
    """Resize to 224x224 and make a uint8 CHW tensor (torchvision.transforms without torchvision)."""
    img = img.resize((224, 224))
    t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return t.view(224, 224, 3).permute(2, 0, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="granary:///namespace/path, another fsspec URL, or a local directory")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--socket", help="the worker's local socket (default: $GRANARY_SOCKET or /run/granary)")
    a = ap.parse_args()
    opts = {"socket": a.socket} if a.socket and a.root.startswith("granary:") else {}
    ds = GranaryImageFolder(a.root, transform=to_tensor, **opts)
    if not len(ds):
        print("no images under %s" % a.root, file=sys.stderr)
        return 1
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=False, num_workers=a.workers)
    digest = hashlib.sha256()
    n = 0
    t = time.monotonic()
    for images, targets in loader:
        digest.update(images.numpy().tobytes())
        digest.update(targets.numpy().tobytes())
        n += len(targets)
    s = time.monotonic() - t
    print("%d images in %d classes, %.0f images/s, digest %s" % (n, len(ds.classes), n / s, digest.hexdigest()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
