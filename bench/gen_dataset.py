#!/usr/bin/env python3
"""Generate an ImageNet-like dataset: class folders of JPEG-sized files.

File sizes are log-normal with a median near 110 KB (ImageNet's average is ~110 KB), contents are
pseudo-random bytes, and everything is derived from --seed, so two runs give identical trees.
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
    a = p.parse_args()
    rng = random.Random(a.seed)
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
