#!/usr/bin/env python3
"""Generate a training dataset with a fixed seed (two runs give identical trees).

ImageNet-like (default): class folders of JPEG-sized files, log-normal sizes with a mean near
110 KB. Shard-like (--shards N): N TFRecord-style files of --shard-mb MB each, read sequentially.
"""
import argparse
import math
import os
import random


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
        size = max(1024, int(rng.lognormvariate(mu, a.sigma)))
        with open(os.path.join(d, "%s_%06d.JPEG" % (cls, i)), "wb") as f:
            f.write(rng.randbytes(size))
        total += size
    print("generated %d files, %.1f MB, in %s" % (a.files, total / 1e6, a.out))


if __name__ == "__main__":
    main()
