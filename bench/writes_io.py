#!/usr/bin/python3
"""bench/writes.sh's client: the small files and the checkpoint, the writers timed, and the checks.

    writes_io.py gen DIR FILES SEED        FILES files of 1-40 KiB (incompressible) in DIR, 50 a
                                           folder; prints {"files": ..., "bytes": ...}
    writes_io.py tar TAR DEST              GNU tar extracting TAR into DEST (`tar -xf TAR -C DEST`)
    writes_io.py extract TAR DEST [--fsync]
                                           tarfile.extractall(DEST) (Python's tar x; --fsync: each
                                           file fsynced before it is closed)
    writes_io.py copytree SRC DEST [--fsync]
                                           shutil.copytree(SRC, DEST) (--fsync: each file copied,
                                           fsynced, closed, then its times and mode set, as copy2)
    writes_io.py ckpt PATH MB              the MB-megabyte checkpoint of bench/checkpoint_io.py
                                           (the bytes torch.save of a state dict writes, 1 MiB
                                           writes, then close) written to PATH; its SHA-256 and the
                                           64 MiB block its chunks are cut from are made before the
                                           clock starts: only the writes and the close are timed
    writes_io.py copy SRC DEST             SRC copied to DEST (sendfile), then DEST and its folder
                                           fsynced: what a local store's commit makes durable
Each of these prints {"seconds": the writer's time, ...}. With `--upload SRC STORE` (before the
command) it then polls until every file under SRC is under STORE with its size and no
.granary-writing-* file is left there (SRC a number of bytes: STORE is one file of that size), and
adds {"upload_seconds": from the writer's end to that} (null, exit 1, after 600 s).

    writes_io.py verify SRC DEST           every file under SRC has the same bytes under DEST;
                                           prints {"files": compared, "wrong": [...]} (exit 1 if any)
    writes_io.py sha PATH                  the file's SHA-256
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_io import payload_chunks  # noqa: E402 - the same bytes as bench/checkpoint.sh

UPLOAD_TIMEOUT_S = 600


def tree(root):
    """{relative path: size} of the regular files under root."""
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            try:
                files[os.path.relpath(p, root)] = os.stat(p).st_size
            except FileNotFoundError:  # a temporary file renamed away meanwhile
                pass
    return files


def fsync_path(path, flags=os.O_RDONLY):
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FsyncTar(tarfile.TarFile):
    """tarfile with each extracted file fsynced before its descriptor is closed."""

    def makefile(self, tarinfo, targetpath):
        with self.extractfile(tarinfo) as source, open(targetpath, "wb") as target:
            shutil.copyfileobj(source, target)
            target.flush()
            os.fsync(target.fileno())


def copy_fsync(src, dst):
    with open(src, "rb") as s, open(dst, "wb") as d:
        shutil.copyfileobj(s, d)
        d.flush()
        os.fsync(d.fileno())
    shutil.copystat(src, dst)
    return dst


def uploaded(src, store):
    """Whether the store has every file of src with its size, and no temporary file of a commit
    under way; src a number: the store is one file, of that many bytes."""
    if src.isdigit():
        try:
            return os.stat(store).st_size == int(src)
        except FileNotFoundError:
            return False
    have = tree(store) if os.path.isdir(store) else {}
    if any(os.path.basename(p).startswith(".granary-writing-") for p in have):
        return False
    return all(have.get(p) == n for p, n in tree(src).items())


def write_ckpt(path, mb):
    """Writes the checkpoint; returns when the clock started and stopped, and what was written."""
    h = hashlib.sha256()
    for c in payload_chunks(mb):
        h.update(c)
    chunks = payload_chunks(mb)
    first = next(chunks)  # makes the 64 MiB block the chunks are cut from: not the writer's cost
    start = time.monotonic()
    with open(path, "wb", buffering=0) as f:
        f.write(first)
        for c in chunks:
            f.write(c)
    return start, time.monotonic(), {"bytes": mb << 20, "sha256": h.hexdigest()}


def main():
    args = sys.argv[1:]
    upload = None
    if args[:1] == ["--upload"]:
        upload, args = (args[1], args[2]), args[3:]
    cmd, args = args[0], args[1:]
    extra = {}
    start = time.monotonic()
    end = None
    if cmd == "gen":
        root, count, seed = args[0], int(args[1]), int(args[2])
        rng = random.Random(seed)
        total = 0
        for i in range(count):
            d = os.path.join(root, f"d{i // 50:02d}")
            os.makedirs(d, exist_ok=True)
            size = rng.randint(1024, 40 * 1024)
            with open(os.path.join(d, f"f{i:04d}.bin"), "wb") as f:
                f.write(rng.randbytes(size))
            total += size
        print(json.dumps({"files": count, "bytes": total}))
        return
    elif cmd == "tar":
        rc = subprocess.run(["tar", "-xf", args[0], "-C", args[1]]).returncode
        if rc != 0:
            sys.exit(f"tar exited with {rc}")
    elif cmd == "extract":
        with (FsyncTar if "--fsync" in args[2:] else tarfile.TarFile).open(args[0]) as t:
            t.extractall(args[1])
    elif cmd == "copytree":
        shutil.copytree(args[0], args[1], copy_function=copy_fsync if "--fsync" in args[2:] else shutil.copy2)
    elif cmd == "ckpt":
        start, end, extra = write_ckpt(args[0], int(args[1]))
    elif cmd == "copy":
        shutil.copyfile(args[0], args[1])
        fsync_path(args[1])
        fsync_path(os.path.dirname(os.path.abspath(args[1])), os.O_RDONLY | os.O_DIRECTORY)
    elif cmd == "verify":
        src, dest = args
        wrong = []
        files = tree(src)
        for p in sorted(files):
            try:
                with open(os.path.join(src, p), "rb") as a, open(os.path.join(dest, p), "rb") as b:
                    if a.read() != b.read():
                        wrong.append(p)
            except OSError as e:
                wrong.append(f"{p}: {e.strerror}")
        print(json.dumps({"files": len(files), "wrong": wrong[:10], "wrong_count": len(wrong)}))
        sys.exit(1 if wrong else 0)
    elif cmd == "sha":
        h = hashlib.sha256()
        with open(args[0], "rb") as f:
            for c in iter(lambda: f.read(8 << 20), b""):
                h.update(c)
        print(h.hexdigest())
        return
    else:
        sys.exit(__doc__)
    end = end or time.monotonic()
    result = {"seconds": end - start, **extra}
    if upload:
        while not uploaded(*upload):
            if time.monotonic() - end > UPLOAD_TIMEOUT_S:
                print(json.dumps({**result, "upload_seconds": None}))
                sys.exit(1)
            time.sleep(0.02)
        result["upload_seconds"] = time.monotonic() - end
    print(json.dumps(result))


if __name__ == "__main__":
    main()
