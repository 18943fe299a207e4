#!/usr/bin/env python3
"""A training-like reader for bench/chaos.sh: epoch after epoch, every file of the dataset in a new
shuffled order, each read whole in one of three ways picked at random (read, pread in 64 KiB pieces
from random offsets, mmap), a stat first, and every byte compared with the source's SHA-256.

  chaos_reader.py --mount M --digests F --status F --stop F2 [--seed N] [--pace-ms 2]

F (digests): JSON {relative path: sha256 hex}. Writes the status file (JSON) every half second and
at the end: epochs, reads by way, errors (a call that failed), wrong (files whose bytes differ), the
longest stall (slowest stat+open+read of one file, seconds), the first errors. Stops when F2 exists.
"""
import argparse
import hashlib
import json
import mmap
import os
import random
import sys
import time


def read_whole(path, how, rng):
    if how == "read":
        with open(path, "rb") as f:
            return f.read()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if how == "pread":
            pieces = list(range(0, size, 65536))
            rng.shuffle(pieces)
            out = {}
            for off in pieces:
                out[off] = os.pread(fd, 65536, off)
            return b"".join(out[o] for o in sorted(out))
        if size == 0:
            return b""
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            return bytes(m)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--digests", required=True)
    ap.add_argument("--status", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pace-ms", type=float, default=2.0, help="pause after each file (a loader's own work)")
    a = ap.parse_args()
    with open(a.digests) as f:
        digest = json.load(f)
    names = sorted(digest)
    rng = random.Random(a.seed)
    st = {"epochs": 0, "reads": 0, "by_way": {"read": 0, "pread": 0, "mmap": 0}, "bytes": 0, "errors": 0,
          "wrong": 0, "longest_stall_s": 0.0, "first_errors": [], "files": len(names), "final": False}
    last = 0.0

    def dump():
        tmp = a.status + ".tmp"
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.replace(tmp, a.status)

    def note(msg):
        if len(st["first_errors"]) < 10:
            st["first_errors"].append(f"{time.strftime('%H:%M:%S')} {msg}")

    while not os.path.exists(a.stop):
        rng.shuffle(names)
        for n in names:
            if os.path.exists(a.stop):
                break
            how = rng.choice(("read", "pread", "mmap"))
            t = time.monotonic()
            path = os.path.join(a.mount, n)
            try:
                os.stat(path)
                data = read_whole(path, how, rng)
                st["bytes"] += len(data)
                if hashlib.sha256(data).hexdigest() != digest[n]:
                    st["wrong"] += 1
                    zeros = data.count(0)
                    note(f"{n}: wrong bytes by {how} ({len(data)} read, {zeros} zero bytes, "
                         f"first {data[:8].hex()})")
            except (OSError, ValueError) as e:
                st["errors"] += 1
                note(f"{n}: {how}: {e}")
            st["reads"] += 1
            st["by_way"][how] += 1
            took = time.monotonic() - t
            if took > st["longest_stall_s"]:
                st["longest_stall_s"] = took
                st["longest_stall_at"] = time.time() - took
                st["longest_stall_file"] = n
            if a.pace_ms > 0:
                time.sleep(a.pace_ms / 1000)
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
