#!/usr/bin/env python3
"""granary:// through fsspec against a real worker, checked against the source directory.

Run by tests/integration/python_test.cc (as root, and as a reader of worker.local_socket_group):
    fsspec_check.py --socket S --source DIR --ns /ds [--reader]
Every expectation comes from the source tree as this user sees it: a file this user may read in
the source must read back byte for byte; one it may not must fail with PermissionError, as
through the mount. With --reader, requests a hostile process could send are tried too.
Exits 0 when every check holds; prints each failure.
"""
import argparse
import errno
import os
import random
import sys
import threading

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def expect_error(exc_type, fn, what):
    try:
        fn()
    except exc_type:
        return
    except Exception as e:  # noqa: BLE001 - the wrong error is the failure
        check(False, "%s: %s instead of %s" % (what, repr(e), exc_type.__name__))
        return
    check(False, "%s: no %s" % (what, exc_type.__name__))


def source_view(src):
    """(files, dirs) this user may read and list in src, and those it may not, by relative path."""
    readable, denied, dirs, denied_dirs = {}, [], [], []
    for root, dnames, fnames in os.walk(src, onerror=lambda e: None):
        rel_root = os.path.relpath(root, src)
        rel_root = "" if rel_root == "." else rel_root
        dirs.append(rel_root)
        for d in list(dnames):
            p = os.path.join(root, d)
            if not os.access(p, os.R_OK | os.X_OK):
                denied_dirs.append(os.path.join(rel_root, d))
        for f in fnames:
            rel = os.path.join(rel_root, f)
            try:
                with open(os.path.join(root, f), "rb") as fh:
                    readable[rel] = fh.read()
            except PermissionError:
                denied.append(rel)
    return readable, denied, dirs, denied_dirs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--ns", required=True)
    ap.add_argument("--reader", action="store_true")
    a = ap.parse_args()

    import fsspec
    import granary  # noqa: F401 - registers granary:// (an installed copy does it by entry point)
    from granary import _native

    os.environ["GRANARY_SOCKET"] = a.socket
    fs = fsspec.filesystem("granary")
    check(fs.socket == a.socket, "the socket comes from GRANARY_SOCKET")
    readable, denied, dirs, denied_dirs = source_view(a.source)
    check(len(readable) > 10, "the source has files to read (%d)" % len(readable))
    if a.reader:
        check(denied and denied_dirs, "the source has entries this reader may not read")
    ns = a.ns.rstrip("/")

    # Listings: names, types and sizes as in the source.
    for d in dirs:
        path = ns + ("/" + d if d else "")
        want = sorted(os.listdir(os.path.join(a.source, d)))
        got = fs.ls(path, detail=True)
        check(sorted(os.path.basename(e["name"]) for e in got) == want, "ls %s: %s != %s" % (path, got, want))
        for e in got:
            sp = os.path.join(a.source, d, os.path.basename(e["name"]))
            if os.path.isdir(sp):
                check(e["type"] == "directory", "type of %s" % e["name"])
            else:
                check(e["type"] == "file" and e["size"] == os.path.getsize(sp), "size of %s" % e["name"])
    for d in denied_dirs:
        expect_error(PermissionError, lambda: fs.ls(ns + "/" + d), "ls of a directory this user may not list: " + d)

    # Bytes: whole files three ways, ranges, seeks, readinto.
    rng = random.Random(7)
    for rel, data in sorted(readable.items()):
        url = "granary://" + ns + "/" + rel
        with fsspec.open(url, "rb") as f:
            check(f.read() == data, "fsspec.open(%s).read()" % url)
        check(fs.cat_file(ns + "/" + rel) == data, "cat_file " + rel)
        check(fs.info(ns + "/" + rel)["size"] == len(data), "info size " + rel)
        for _ in range(4):
            s = rng.randrange(0, len(data) + 2)
            e = rng.randrange(s, len(data) + 3)
            check(fs.cat_file(ns + "/" + rel, s, e) == data[s:e], "cat_file %s [%d, %d)" % (rel, s, e))
        if data:
            check(fs.cat_file(ns + "/" + rel, -10) == data[-10:], "cat_file %s last 10" % rel)
            with fs.open(ns + "/" + rel) as f:
                mid = len(data) // 2
                f.seek(mid)
                check(f.read(100) == data[mid:mid + 100], "seek+read " + rel)
                f.seek(-5, os.SEEK_END)
                check(f.read() == data[-5:], "seek end " + rel)
                f.seek(0)
                buf = bytearray(len(data) + 10)
                n = f.readinto(buf)
                check(n == len(data) and bytes(buf[:n]) == data, "readinto " + rel)
                check(f.read() == b"", "read at the end " + rel)
    for rel in denied:
        expect_error(PermissionError, lambda: fs.cat_file(ns + "/" + rel), "cat_file of a file this user may not read: " + rel)
        expect_error(PermissionError, lambda: fs.open(ns + "/" + rel).read(), "open of a file this user may not read: " + rel)

    # Text mode (fsspec wraps the binary reader), lines, iteration; a file object's own errors.
    uni = ns + "/with space/naïve café ü 日本.txt"
    with fs.open(uni, "r", encoding="utf-8") as f:
        check(f.read() == "unicode\n", "text mode read")
    with fsspec.open("granary://" + uni, "rt") as f:
        check(f.readlines() == ["unicode\n"], "fsspec.open text lines")
    many = ns + "/many-blocks.bin"
    with fs.open(many, "rb") as f:
        want = readable["many-blocks.bin"]
        nl = want.find(b"\n")
        check(f.readline() == want[:nl + 1], "readline")
        check(f.tell() == nl + 1, "tell after readline")
        check(b"".join(iter(f)) == want[nl + 1:], "iteration by line to the end")
        f.seek(64 * 1024 - 3)  # across a block boundary, through the read-ahead buffer
        check(f.read(6) == want[64 * 1024 - 3:64 * 1024 + 3], "a small read across a block boundary")
        expect_error(OSError, lambda: f.seek(-1), "a negative seek")
    expect_error(ValueError, lambda: f.read(), "a read of a closed file")

    # One file object shared by two threads: whatever the interleaving, bytes of the file, no crash.
    shared = fs.open(many, "rb", block_size=4096)
    stop = []

    def seeker():
        r = random.Random(3)
        while not stop:
            shared.seek(r.randrange(0, len(want) + 10))

    th = threading.Thread(target=seeker)
    th.start()
    odd = 0
    try:
        for _ in range(3000):
            buf = bytearray(50)
            n = shared.readinto(buf)
            for piece in (shared.read(100), shared.readline(300), bytes(buf[:n])):
                if piece and want.find(piece) < 0:
                    odd += 1
    finally:
        stop.append(1)
        th.join()
    check(odd == 0, "a file object shared by threads returned bytes not in the file (%d times)" % odd)

    # A path deeper than PATH_MAX: a clear error, not a crash.
    try:
        fs.info(ns + "/" + "a/" * 100000)
        check(False, "a 200 KB path was looked up")
    except OSError as e:
        check(e.errno == errno.ENAMETOOLONG, "a 200 KB path: ENAMETOOLONG, not %r" % e)

    # The helpers fsspec builds on ls and info.
    want_jpg = sorted(ns + "/" + r for r in readable if r.startswith("class_") and r.endswith(".jpg"))
    check(sorted(fs.glob(ns + "/class_*/*.jpg")) == want_jpg, "glob")
    check(fs.isdir(ns + "/a") and fs.isfile(ns + "/exact-block.bin") and not fs.exists(ns + "/nope"), "isdir/isfile/exists")

    # Bad input: clear errors.
    expect_error(FileNotFoundError, lambda: fs.cat_file(ns + "/no/such/file"), "a missing file")
    expect_error(NotADirectoryError, lambda: fs.cat_file(ns + "/exact-block.bin/x"), "a path through a file")
    expect_error(IsADirectoryError, lambda: fs.open(ns + "/a"), "open of a directory")
    try:
        fs.open(ns + "/new.bin", "wb")
        check(False, "open for writing succeeded")
    except OSError as e:
        check(e.errno == errno.EROFS, "open for writing: EROFS, not %r" % e)
    expect_error(FileNotFoundError, lambda: _native.Client(a.socket + ".nope"), "a socket that does not exist")

    # Threads: 8 readers of every file at once.
    items = sorted(readable.items())
    bad = []

    def reader(k):
        for rel, data in items[k::8] + items:
            if fs.cat_file(ns + "/" + rel) != data:
                bad.append(rel)

    ts = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(not bad, "8 threads read the bytes of the source (%s)" % bad[:3])

    # A forked child (a DataLoader worker) reads on its own connections.
    rel, data = items[len(items) // 2]
    before = fs.open(ns + "/" + rel)  # opened before the fork: the child may not use it
    pid = os.fork()
    if pid == 0:
        ok = all(fs.cat_file(ns + "/" + r) == d for r, d in items[:20])
        try:
            before.read()
            ok = False
        except OSError as e:
            ok = ok and e.errno == errno.EBADF
        os._exit(0 if ok else 1)
    check(before.read() == data, "the parent reads a file it opened before the fork")
    check(fs.cat_file(ns + "/" + rel) == data, "the parent reads while its child does")
    _, status = os.waitpid(pid, 0)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "a forked child reads the bytes")

    if a.reader:
        t = _native.testing
        c = fs.client
        some = sorted(readable)[0]
        secret = sorted(denied)[0]
        # A read needs the data grant of exactly the file it names.
        check(t.read_as(c, a.socket, ns + "/" + some, ns + "/" + some, "") == "OK", "a reader's own granted read")
        check(t.read_as(c, a.socket, ns + "/" + some, "", "") == "UNAUTHENTICATED", "a read with no grant")
        check(t.read_as(c, a.socket, ns + "/" + secret, ns + "/" + some, "") == "UNAUTHENTICATED",
              "a read of a file this user may not read, with another file's grant")
        check(t.read_as(c, a.socket, ns + "/" + some, ns + "/" + some, "../../../../etc/shadow") == "UNAUTHENTICATED",
              "a read of a path out of the mount")
        # The namespace needs the grant of the directory named.
        root_grant = t.grant_of(c, "/")
        ds_ino = fs.info(ns)["ino"]
        check(t.lookup_as(a.socket, ds_ino, t.grant_of(c, ns), "a") == "OK", "a granted lookup")
        check(t.lookup_as(a.socket, ds_ino, b"", "a") == "UNAUTHENTICATED", "a lookup with no grant")
        forged = bytes([7]) + t.grant_of(c, ns)[1:]
        check(t.lookup_as(a.socket, ds_ino, forged, "a") == "UNAUTHENTICATED", "a grant with its bits raised")
        check(t.lookup_as(a.socket, ds_ino, root_grant, "a") == "UNAUTHENTICATED", "another entry's grant")
        locked = sorted(denied_dirs)[0]
        locked_ino = fs.info(ns + "/" + locked)["ino"]
        check(t.lookup_as(a.socket, locked_ino, t.grant_of(c, ns + "/" + locked), "") == "PERMISSION_DENIED",
              "a listing of a directory this user may not read, with its own grant")
        check(t.write_as(a.socket) == "PERMISSION_DENIED", "a reader's write session")
        check(t.pipe_as(a.socket) == "PERMISSION_DENIED", "a reader's stream pipe (fetch buffers' pages)")

    print("%d failures; %d files read, %d refused as the source refuses them" % (len(failures), len(readable), len(denied)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
