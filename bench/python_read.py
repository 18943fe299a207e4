#!/usr/bin/env python3
"""The Python reader of bench/python_read.sh: one row, printed as a JSON line.

    python_read.py --how open|mount|cat|fsspec-open --root R --source S [--threads 8] [--epochs 3]
                   [--warm 1] [--task read|decode] [--verify]

Reads every file under the source tree S (its relative paths, shuffled) from R: with `open` and
`mount`, R is a directory (plain open().read(); `mount` names the FUSE mount so the row says so);
with `cat` (fs.cat_file) and `fsspec-open` (with fs.open(p) as f: f.read()), R is a granary://
namespace path read through fsspec ($GRANARY_SOCKET). `--task decode` is a torchvision-style
loader instead: PIL.Image.open on the opened file, convert("RGB"), resize to 224x224 (the files
must be images). `--warm N` passes go first, untimed. `--verify` reads everything once more,
untimed, and counts files whose bytes differ from S's.
"""
import argparse
import concurrent.futures
import json
import os
import random
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--how", required=True, choices=["open", "mount", "cat", "fsspec-open"])
    ap.add_argument("--root", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--warm", type=int, default=1)
    ap.add_argument("--task", default="read", choices=["read", "decode"])
    ap.add_argument("--verify", action="store_true")
    a = ap.parse_args()

    rels = sorted(os.path.relpath(os.path.join(d, f), a.source) for d, _, fs in os.walk(a.source) for f in fs)
    random.Random(7).shuffle(rels)
    paths = [a.root.rstrip("/") + "/" + r for r in rels]

    if a.how in ("cat", "fsspec-open"):
        import fsspec
        import granary  # noqa: F401 - registers granary:// when the package is not installed

        fs = fsspec.filesystem("granary")
        opener = fs.open
        if a.how == "cat":
            read = fs.cat_file
        else:
            def read(p):
                with fs.open(p, "rb") as f:
                    return f.read()
    else:
        opener = open

        def read(p):
            with open(p, "rb") as f:
                return f.read()

    if a.task == "decode":
        from PIL import Image

        def one(p):
            with opener(p, "rb") as f:  # torchvision's pil_loader, through the opener
                img = Image.open(f)
                img = img.convert("RGB")
            return len(img.resize((224, 224)).tobytes())
    else:
        def one(p):
            return len(read(p))

    with concurrent.futures.ThreadPoolExecutor(a.threads) as ex:
        for _ in range(a.warm):
            sum(ex.map(one, paths))
        t = time.monotonic()
        total = 0
        for _ in range(a.epochs):
            total += sum(ex.map(one, paths))
        s = time.monotonic() - t
        mismatches = 0
        if a.verify:
            def differs(i):
                with open(os.path.join(a.source, rels[i]), "rb") as f:
                    want = f.read()
                return int(read(paths[i]) != want)

            mismatches = sum(ex.map(differs, range(len(paths))))
    n = len(paths) * a.epochs
    print(json.dumps({"how": a.how, "task": a.task, "ops": n, "bytes": total, "seconds": s, "ops_per_s": n / s,
                      "mb_per_s": total / s / 1e6, "mismatches": mismatches, "files": len(paths)}))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
