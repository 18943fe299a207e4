#!/usr/bin/python3
"""Real writers read their own files back (issue 50, finding 5 and its check "a test with real
writers in both modes"): `granary local -o write=through`, then `-o write=back`, over a local
directory, and in each mode

  - files written with Python's open/write/close and read back whole right after close();
  - a 40 MiB file overwritten (O_TRUNC) and read back right after close(), 50 times in a row, every
    byte checked (each version differs from the one before at every offset, so an old version is
    told apart from a short read or wrong bytes);
  - numpy.save then np.load, h5py.File(p, "w") ... close then h5py.File(p, "r"), and torch.save then
    torch.load, when those modules import (each is skipped, saying why, when not installed);
    a zip archive written and read back with the standard library's zipfile (torch.save's format:
    members written, then the central directory, with seeks back to patch headers);
  - the store (the source directory) holds the last version's bytes (write=back: once uploaded).

docs/semantics.md, "Writes": after close() returns the writer's node reads the new version whole.
Each failure names what the reader got: a short read, an errno (ESTALE...), the previous version,
or the first wrong byte.

Run by ctest (tests/CMakeLists.txt) with GRANARY_BIN_DIR, as root (FUSE mounts). Every granary
local it starts is stopped, and its mount gone, when the test ends, also on failure or SIGTERM.
"""
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

SRC = os.environ.get("GRANARY_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.environ.get("GRANARY_BIN_DIR", os.path.join(SRC, "build", "bin"))
MIB = 1 << 20


def wait_for(pred, timeout, what):
    """Polls `pred` until it holds; AssertionError naming `what` past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def read_log(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


LIVE = []  # the GranaryLocal instances running, for the signal handler


class GranaryLocal:
    """`granary local file://SRC MNT --dir STATE -o write=MODE`, the way the C++ tests start it
    (tests/integration/local_test.cc): its own state directory and GRANARY_HOME, every port chosen
    by the OS."""

    def __init__(self, root, mode):
        self.root, self.mode = root, mode
        self.src = os.path.join(root, "src")
        self.mnt = os.path.join(root, "mnt")
        self.log = os.path.join(root, "local.log")
        self.proc = None
        os.makedirs(self.src)
        os.makedirs(self.mnt)

    def start(self):
        env = dict(os.environ, GRANARY_HOME=os.path.join(self.root, "home"))
        argv = [os.path.join(BIN, "granary"), "local", "file://" + self.src, self.mnt,
                "--dir", os.path.join(self.root, "state"), "-o", "write=" + self.mode,
                # `granary local` puts these two on fixed loopback ports by default.
                "--master.metrics_listen", "127.0.0.1:0", "--worker.metrics_listen", "127.0.0.1:0"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL)
        LIVE.append(self)
        wait_for(lambda: mounted(self.mnt) or self.proc.poll() is not None, 60, "the mount")
        if not mounted(self.mnt):
            raise AssertionError(f"granary local did not mount (exit {self.proc.poll()}):\n{read_log(self.log)}")

    def stop(self):
        """Ctrl-C, then kill -9 if it does not exit within 30 s; the mount is removed either way."""
        p, self.proc = self.proc, None
        if self in LIVE:
            LIVE.remove(self)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if mounted(self.mnt):
            if subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        return p.returncode if p is not None else None


def version(base, i):
    """Version i of a file built from `base`: rotated by a different amount each time, and stamped,
    so consecutive versions differ at (practically) every offset."""
    k = (i * 40961) % len(base)
    data = bytearray(base[k:] + base[:k])
    data[0:8] = i.to_bytes(8, "little")
    return bytes(data)


def describe(got, want, previous=None):
    """What a read-back returned, against what was written."""
    if got == want:
        return "ok"
    if previous is not None and got == previous:
        return f"the previous version ({len(got)} bytes) instead of the new one"
    if len(got) != len(want):
        what = ""
        if got and got == want[:len(got)]:
            what = ", the new version's first bytes"
        elif got and previous is not None and got == previous[:len(got)]:
            what = ", the previous version's first bytes"
        return f"{len(got)} bytes of {len(want)}{what}"
    step = 1 << 16
    at = next(o for o in range(0, len(want), step) if got[o:o + step] != want[o:o + step])
    first = next(i for i in range(at, min(at + step, len(want))) if got[i] != want[i])
    return f"wrong bytes from offset {first} on (of {len(want)})"


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read_back(path):
    """The file's size (stat) and bytes, read whole with one open; an OSError is returned as text."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            return size, f.read()
    except OSError as e:
        return None, f"{errno.errorcode.get(e.errno, e.errno)} ({e.strerror}) from {e.filename or 'read'}"


class ReadYourWrites:
    """The checks, run by a subclass for one write mode (MODE)."""

    MODE = None

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root (FUSE mounts, as the other integration tests)")
        if not os.access(os.path.join(BIN, "granary"), os.X_OK):
            raise AssertionError(f"{BIN}/granary not found; build first (scripts/build.sh)")
        cls.tmp = tempfile.mkdtemp(prefix=f"granary-readback-{cls.MODE}-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.g = GranaryLocal(cls.tmp, cls.MODE)
        cls.addClassCleanup(cls.g.stop)  # runs also when start() fails
        cls.g.start()

    def setUp(self):
        self.dir = os.path.join(self.g.mnt, self._testMethodName)
        os.mkdir(self.dir)
        self.store = os.path.join(self.g.src, self._testMethodName)

    def check(self, problems, what):
        if problems:
            self.fail(f"write={self.MODE}: {what}: {len(problems)} wrong:\n  " + "\n  ".join(problems[:20]) +
                      f"\n--- granary local's log (last 3000 characters):\n{read_log(self.g.log)[-3000:]}")

    def assert_in_store(self, rel, want):
        """The store holds `want` at `rel` (write=back: once the upload is done)."""
        path = os.path.join(self.store, rel)

        def there():
            try:
                with open(path, "rb") as f:
                    return f.read() == want
            except OSError:
                return False
        wait_for(there, 5 if self.MODE == "through" else 60, f"{path} to hold the last version")

    def test_open_write_close_then_read_whole(self):
        problems = []
        for n, size in enumerate([1, 4096, 65537, MIB + 17, 9 * MIB + 3]):
            want = os.urandom(size)
            name = os.path.join(self.dir, f"f{n}.bin")
            write_file(name, want)
            st_size, got = read_back(name)
            if isinstance(got, str):
                problems.append(f"{size} bytes: the read-back failed: {got}")
                continue
            if st_size != size:
                problems.append(f"{size} bytes: stat right after close says {st_size}")
            if got != want:
                problems.append(f"{size} bytes: read {describe(got, want)}")
        self.check(problems, "new files read back right after close()")
        self.assert_in_store(f"f{n}.bin", want)

    def test_overwrite_40mib_read_back_50_times(self):
        base = os.urandom(40 * MIB)
        name = os.path.join(self.dir, "ckpt.bin")
        previous = None
        problems = []
        for i in range(51):  # the first version, then 50 overwrites
            what = "the first version" if i == 0 else f"overwrite {i}"
            want = version(base, i)
            write_file(name, want)  # open(O_WRONLY|O_CREAT|O_TRUNC), write, close
            st_size, got = read_back(name)
            if isinstance(got, str):
                problems.append(f"{what}: the read-back failed: {got}")
            else:
                if st_size != len(want):
                    problems.append(f"{what}: stat right after close says {st_size} bytes")
                if got != want:
                    problems.append(f"{what}: read {describe(got, want, previous)}")
            previous = want
        self.check(problems, "a 40 MiB file overwritten and read back right after close(), 50 times")
        self.assert_in_store("ckpt.bin", previous)

    def test_zipfile_write_then_read(self):
        # torch.save writes a zip archive (one member per tensor storage, then the central directory).
        name = os.path.join(self.dir, "model.zip")
        members = {f"archive/data/{i}": os.urandom(256 * 1024 + i) for i in range(12)}
        with zipfile.ZipFile(name, "w", compression=zipfile.ZIP_STORED) as z:
            for k, v in members.items():
                with z.open(k, "w", force_zip64=True) as m:  # written in parts, header patched after
                    m.write(v[:1000])
                    m.write(v[1000:])
        try:
            with zipfile.ZipFile(name) as z:
                got = {k: z.read(k) for k in z.namelist()}
        except (OSError, zipfile.BadZipFile) as e:
            self.check([f"zipfile could not read it back: {type(e).__name__}: {e}"], "a zip archive read back")
        bad = [k for k in members if got.get(k) != members[k]]
        self.check([f"member {k} differs" for k in bad], "a zip archive read back")

    def test_numpy_save_then_load(self):
        try:
            import numpy as np
        except ImportError as e:
            self.skipTest(f"numpy not installed ({e}; Debian: python3-numpy)")
        rng = np.random.default_rng(50)
        problems = []
        for i in range(5):
            arr = rng.standard_normal((1024, 1024 + i), dtype=np.float32)  # about 4 MiB
            name = os.path.join(self.dir, f"w{i}.npy")
            np.save(name, arr)
            try:
                back = np.load(name)
                if not np.array_equal(back, arr):
                    problems.append(f"{name}: np.load returned other values")
            except Exception as e:  # noqa: BLE001 - what np.load raised is the finding
                problems.append(f"{name}: np.load: {type(e).__name__}: {e}")
        self.check(problems, "numpy.save then np.load")

    def test_h5py_write_then_read(self):
        try:
            import h5py
            import numpy as np
        except ImportError as e:
            self.skipTest(f"h5py or numpy not installed ({e}; Debian: python3-h5py)")
        rng = np.random.default_rng(51)
        problems = []
        for i in range(3):
            weights = {f"layer{j}": rng.standard_normal((256, 512 + j), dtype=np.float32) for j in range(6)}
            name = os.path.join(self.dir, f"model{i}.h5")
            with h5py.File(name, "w") as f:  # HDF5 seeks back to patch its superblock and headers
                for k, v in weights.items():
                    f.create_dataset(k, data=v)
                f.attrs["epoch"] = i
            try:
                with h5py.File(name, "r") as f:
                    if int(f.attrs["epoch"]) != i:
                        problems.append(f"{name}: attribute epoch is {f.attrs['epoch']}")
                    for k, v in weights.items():
                        if not np.array_equal(f[k][()], v):
                            problems.append(f"{name}: dataset {k} differs")
            except Exception as e:  # noqa: BLE001 - what h5py raised is the finding
                problems.append(f"{name}: h5py.File(p, 'r'): {type(e).__name__}: {e}")
        self.check(problems, "h5py.File(p, 'w') then h5py.File(p, 'r')")

    def test_torch_save_then_load(self):
        try:
            import torch
        except ImportError as e:
            self.skipTest(f"torch not installed ({e}; Debian: python3-torch)")
        torch.manual_seed(52)
        problems = []
        for i in range(3):
            state = {f"layer{j}.weight": torch.randn(512, 1024 + j) for j in range(8)}  # about 16 MiB
            name = os.path.join(self.dir, f"ckpt{i}.pt")
            torch.save(state, name)
            try:
                back = torch.load(name)
                for k, v in state.items():
                    if not torch.equal(back[k], v):
                        problems.append(f"{name}: {k} differs")
            except Exception as e:  # noqa: BLE001 - what torch.load raised is the finding
                problems.append(f"{name}: torch.load: {type(e).__name__}: {e}")
        self.check(problems, "torch.save then torch.load")


class WriteThrough(ReadYourWrites, unittest.TestCase):
    MODE = "through"


class WriteBack(ReadYourWrites, unittest.TestCase):
    MODE = "back"


def main():
    # ctest's timeout (SIGTERM) and Ctrl-C: unittest would record an exception raised here as one
    # test's error and go on, so stop what was started here and exit.
    def stop(signum, _frame):
        for g in list(LIVE):
            g.stop()
            shutil.rmtree(g.root, ignore_errors=True)
        print(f"readback_test: signal {signum}: granary local stopped", file=sys.stderr)
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
