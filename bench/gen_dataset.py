#!/usr/bin/env python3
"""Generate a training dataset with a fixed seed (two runs give identical trees).

ImageNet-like (default): class folders of JPEG-sized files, log-normal sizes with a mean near
110 KB. Shard-like (--shards N): N TFRecord-style files of --shard-mb MB each, read sequentially.
"""
import argparse
import math
import os
import random


def write_jpeg(path, rng):
    """A 500x375 photo-like JPEG (ImageNet's typical size, about 110 KB): per channel, a gradient at
    a random angle blended with noise (noise alone compresses to far more, a gradient to far less)."""
    from PIL import Image

    w, h = 500, 375
    bands = []
    for _ in range(3):
        grad = Image.linear_gradient("L").resize((w, h)).rotate(rng.random() * 360, expand=False, fillcolor=128)
        noise = Image.frombytes("L", (w, h), rng.randbytes(w * h))
        bands.append(Image.blend(grad, noise, 0.25 + rng.random() * 0.1))
    Image.merge("RGB", bands).save(path, "JPEG", quality=90)
    return os.path.getsize(path)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="directory to create")
    p.add_argument("--files", type=int, default=2000, help="number of files")
    p.add_argument("--classes", type=int, default=100, help="number of class folders")
    p.add_argument("--mean-kb", type=float, default=110.0, help="mean file size in KB")
    p.add_argument("--sigma", type=float, default=0.5, help="log-normal sigma")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--shards", type=int, default=0, help="generate N large shards instead of images")
    p.add_argument("--shard-mb", type=float, default=56.0, help="shard size in MB (ImageNet TFRecords: ~56)")
    p.add_argument("--jpeg", action="store_true",
                   help="real JPEG images (PIL; ImageNet's typical 500x375, about 110 KB) for decoding loaders")
    a = p.parse_args()
    rng = random.Random(a.seed)
    if a.shards:
        os.makedirs(a.out, exist_ok=True)
        size = int(a.shard_mb * 1e6)
        for i in range(a.shards):
            with open(os.path.join(a.out, "train-%05d-of-%05d.tfrecord" % (i, a.shards)), "wb") as f:
                for off in range(0, size, 1 << 22):
                    f.write(rng.randbytes(min(1 << 22, size - off)))
        print("generated %d shards, %.1f MB, in %s" % (a.shards, a.shards * size / 1e6, a.out))
        return
    mu = math.log(a.mean_kb * 1000) - a.sigma ** 2 / 2  # so the mean is mean_kb
    total = 0
    for i in range(a.files):
        cls = "n%08d" % (1440764 + i % a.classes)
        d = os.path.join(a.out, cls)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "%s_%06d.JPEG" % (cls, i))
        if a.jpeg:
            total += write_jpeg(path, rng)
            continue
        size = max(1024, int(rng.lognormvariate(mu, a.sigma)))
        with open(path, "wb") as f:
            f.write(rng.randbytes(size))
        total += size
    print("generated %d files, %.1f MB, in %s" % (a.files, total / 1e6, a.out))


if __name__ == "__main__":
    main()
