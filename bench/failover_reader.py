#!/usr/bin/env python3
"""A training-like reader for bench/failover.sh: epoch after epoch, every file of the dataset in a
new shuffled order (the first epoch cold, the next warm), each read whole through the mount and
compared with the source's SHA-256; a stat of each first (a metadata call when the kernel's
attributes have expired).

  failover_reader.py --mount M --source S --status F --stop F2 [--seed N]

Writes F (JSON) every half second and at the end: epochs, reads, errors (a call that failed),
wrong (bytes that differ), the longest stall (the slowest stat+open+read of one file, seconds),
the first errors. Stops when F2 exists.
"""
import argparse
import hashlib
import json
import os
import random
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--status", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    digest = {}
    for d, _, fs in os.walk(a.source):
        for f in fs:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                digest[os.path.relpath(p, a.source)] = hashlib.sha256(fh.read()).digest()
    names = sorted(digest)
    rng = random.Random(a.seed)
    st = {"epochs": 0, "reads": 0, "errors": 0, "wrong": 0, "longest_stall_s": 0.0, "first_errors": [],
          "files": len(names), "final": False}
    last = 0.0

    def dump():
        tmp = a.status + ".tmp"
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.replace(tmp, a.status)

    while not os.path.exists(a.stop):
        rng.shuffle(names)
        for n in names:
            if os.path.exists(a.stop):
                break
            t = time.monotonic()
            path = os.path.join(a.mount, n)
            try:
                os.stat(path)
                with open(path, "rb") as f:
                    data = f.read()
                if hashlib.sha256(data).digest() != digest[n]:
                    st["wrong"] += 1
                    if len(st["first_errors"]) < 10:
                        st["first_errors"].append(f"{n}: wrong bytes ({len(data)} read)")
            except OSError as e:
                st["errors"] += 1
                if len(st["first_errors"]) < 10:
                    st["first_errors"].append(f"{n}: {e}")
            st["reads"] += 1
            st["longest_stall_s"] = max(st["longest_stall_s"], time.monotonic() - t)
            if time.monotonic() - last > 0.5:
                dump()
                last = time.monotonic()
        else:
            st["epochs"] += 1
    st["final"] = True
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
