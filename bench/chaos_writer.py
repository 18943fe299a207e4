#!/usr/bin/env python3
"""A checkpoint writer for bench/chaos.sh: writes files into a writable mount (write=back or
write=through), one after another, each of a random size (64 KiB to 3 MiB) and seeded bytes, in
pieces of 1 MiB, then fsyncs now and then and closes. Like a trainer that keeps its last --keep
checkpoints, it writes over its own names in turn (open with O_TRUNC replaces a whole file), so
what a long run leaves in the store stays bounded (the test store is a 2 GiB memstore: a 30-minute
run writing new names filled it, and Ceph then held every PUT). A file whose close returned
without an error is acknowledged: its SHA-256 becomes the name's, and bench/chaos.sh later reads
every name back through another node's mount. A write or close that fails (granary-fuse killed
mid-write, the store refusing a write=through upload) is counted, never acknowledged: the
semantics allow it (docs/semantics.md, "Writes"), and the store may then hold either the name's
acknowledged bytes or the failed attempt's whole (kept in `maybe` until the next acknowledgement);
losing an acknowledged file, or any other bytes, is not allowed.

  chaos_writer.py --dir D --prefix P --status F --stop F2 [--seed N] [--keep K]

Status (JSON, every file and at the end): writes, errors, acks (acknowledged writes), acked
{name: sha256}, maybe {name: [sha256 of failed attempts since]}, first errors.
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
    ap.add_argument("--dir", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--status", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=int, default=64)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    st = {"writes": 0, "errors": 0, "acks": 0, "acked": {}, "maybe": {}, "first_errors": []}

    def dump():
        with open(a.status + ".tmp", "w") as f:
            json.dump(st, f)
        os.replace(a.status + ".tmp", a.status)

    dump()
    i = 0
    while not os.path.exists(a.stop):
        name = f"{a.prefix}{i % a.keep:05d}.ckpt"
        size = rng.randint(64 << 10, 3 << 20)
        data = rng.randbytes(size)
        path = os.path.join(a.dir, name)
        st["writes"] += 1
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for off in range(0, size, 1 << 20):
                    piece = data[off:off + (1 << 20)]
                    done = 0
                    while done < len(piece):
                        done += os.write(fd, piece[done:])
                if rng.random() < 0.2:
                    os.fsync(fd)
            finally:
                os.close(fd)  # the commit: an error here is not acknowledged
            st["acked"][name] = hashlib.sha256(data).hexdigest()
            st["maybe"].pop(name, None)
            st["acks"] += 1
        except OSError as e:
            st["errors"] += 1
            st["maybe"].setdefault(name, []).append(hashlib.sha256(data).hexdigest())
            if len(st["first_errors"]) < 10:
                st["first_errors"].append(f"{time.strftime('%H:%M:%S')} {name}: {e}")
        dump()
        i += 1
        time.sleep(rng.uniform(0.2, 1.0))
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
