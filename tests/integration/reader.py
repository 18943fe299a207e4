#!/usr/bin/env python3
"""A training-like reader for the hand-over tests and bench: keeps files open and reads them in a
loop through read(), pread() and mmap, opens others anew each round, and checks every byte against
the source files.

  reader.py --mount M --source S --files a,b,c --status F --stop F2

Every second (and at the end) writes F: JSON with rounds done, error count, the first errors, and
the latencies of the slowest operations (the stall a reader saw). Stops when F2 exists. Exit code
0 when no error was seen.
"""
import argparse
import json
import mmap
import os
import random
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--files", required=True, help="comma-separated paths relative to both roots")
    ap.add_argument("--status", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--no-mmap", action="store_true")
    args = ap.parse_args()
    names = [n for n in args.files.split(",") if n]
    expect = {}
    for n in names:
        with open(os.path.join(args.source, n), "rb") as f:
            expect[n] = f.read()
    half = max(1, len(names) // 2)
    kept = names[:half]        # opened once, read for the whole run
    reopened = names[half:] or names  # opened anew every round
    fds = {n: os.open(os.path.join(args.mount, n), os.O_RDONLY) for n in kept}
    maps = {}
    if not args.no_mmap:
        for n in kept:
            if expect[n]:
                maps[n] = mmap.mmap(fds[n], 0, prot=mmap.PROT_READ)
    rounds = 0
    errors = []
    error_count = 0
    lat = []  # seconds per operation
    rng = random.Random(7)
    last_status = 0.0

    def fail(what):
        nonlocal error_count
        error_count += 1
        if len(errors) < 20:
            errors.append(what)

    def timed(fn):
        t = time.monotonic()
        try:
            return fn()
        finally:
            lat.append(time.monotonic() - t)

    def write_status(final):
        s = sorted(lat)
        pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else 0.0
        st = {"rounds": rounds, "errors": error_count, "first_errors": errors, "ops": len(s),
              "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": (s[-1] * 1000 if s else 0.0),
              "final": final}
        tmp = args.status + ".tmp"
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.replace(tmp, args.status)

    while not os.path.exists(args.stop):
        for n in kept:
            want = expect[n]
            try:
                got = timed(lambda: os.pread(fds[n], len(want) + 1, 0))
                if got != want:
                    fail(f"pread {n}: {len(got)} bytes differ from the source's {len(want)}")
                if want:
                    off = rng.randrange(len(want))
                    size = min(len(want) - off, 4096)
                    got = timed(lambda: os.pread(fds[n], size, off))
                    if got != want[off:off + size]:
                        fail(f"pread {n} at {off}: wrong bytes")
                os.lseek(fds[n], 0, os.SEEK_SET)
                got = timed(lambda: os.read(fds[n], len(want) + 1))
                if got != want:
                    fail(f"read {n}: wrong bytes")
                if n in maps:
                    off = rng.randrange(len(want))
                    got = timed(lambda: maps[n][off:off + 8192])
                    if got != want[off:off + 8192]:
                        fail(f"mmap {n} at {off}: wrong bytes")
            except OSError as e:
                fail(f"{n}: {e}")
        for n in reopened:
            try:
                def whole():
                    with open(os.path.join(args.mount, n), "rb") as f:
                        return f.read()
                got = timed(whole)
                if got != expect[n]:
                    fail(f"open+read {n}: wrong bytes")
            except OSError as e:
                fail(f"open {n}: {e}")
        rounds += 1
        if time.monotonic() - last_status > 0.2:
            write_status(False)
            last_status = time.monotonic()
    write_status(True)
    return 0 if error_count == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
