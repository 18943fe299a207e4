#!/usr/bin/python3
"""The container image (issue 20): built here by scripts/image.sh (offline: the Debian base made
with debootstrap when no registry answers), and its roles run from it: master, worker, the FUSE
keeper and FUSE through granary-entrypoint with the example configuration
(deploy/kubernetes/base/granary.yaml, as the ConfigMap ships it), a dataset mounted from a local
directory and read through the FUSE role's mount point from the host, /readyz of each role, and
fuse-stop.

Where the machine can start real containers, the roles run in containers (host network, the FUSE
one privileged with its mount shared with the host). Where it cannot (no OCI runtime works: no
cgroup delegation, no CAP_SYS_RESOURCE for rlimits), they run from the image's own root file
system (podman mount) with chroot — the image's binaries, libraries, entrypoint and user, on this
kernel. The test says which it used.

Run by ctest (root) with GRANARY_SOURCE_DIR; slow the first time (the image build), quick when the
image's layers are cached.
"""
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

import yaml

from testlib import mounted, read, run, wait_for

SRC = os.environ.get("GRANARY_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = os.path.join(SRC, "deploy", "kubernetes", "base", "granary.yaml")
TAG = "granary:image-test"
UID = 10001  # the image's user (deploy/docker/Dockerfile)
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def readyz(addr):
    try:
        return urllib.request.urlopen(f"http://{addr}/readyz", timeout=5).status
    except Exception as e:  # noqa: BLE001 - reported as the failure
        return str(e)


class ChrootRunner:
    """Runs the image's commands from its root file system, mounted by podman, with chroot."""

    how = "chroot into the image's root file system (podman mount): no container runtime works here"

    def __init__(self, engine, image, work):
        self.engine, self.image, self.work = engine, image, work
        self.ctr = self.root = ""
        self.mounts = []  # ours inside root, innermost last

    def prepare(self):
        self.ctr = run([self.engine, "create", self.image], timeout=300).stdout.strip()
        assert self.ctr, f"{self.engine} create {self.image} failed"
        self.root = run([self.engine, "mount", self.ctr]).stdout.strip()
        assert self.root and os.path.isdir(self.root), f"{self.engine} mount {self.ctr}: no root file system"
        self._mount(["-t", "proc", "proc"], "proc")
        # /dev: a private tmpfs with the few devices the roles use (/dev/fuse among them) and a
        # /dev/shm for the MEM tier; nothing of the host's /dev/shm is shared.
        self._mount(["-t", "tmpfs", "-o", "mode=0755", "dev"], "dev")
        for d in ("null", "zero", "random", "urandom", "fuse"):
            open(os.path.join(self.root, "dev", d), "w").close()
            self._mount(["--bind", f"/dev/{d}"], f"dev/{d}")
        os.makedirs(os.path.join(self.root, "dev/shm"), mode=0o1777)
        os.chmod(os.path.join(self.root, "dev/shm"), 0o1777)
        self._mount(["-t", "tmpfs", "-o", "mode=1777", "shm"], "dev/shm")

    def _mount(self, args, rel):
        target = os.path.join(self.root, rel)
        if not os.path.exists(target):
            os.makedirs(target)
        r = run(["mount", *args, target])
        assert r.returncode == 0, f"mount {args} {target}: {r.stderr}"
        self.mounts.append(target)

    def path(self, p):
        """A path of the image seen from the host."""
        return os.path.join(self.root, p.lstrip("/"))

    def start(self, args, name, user=0, env=None):
        spec = [f"--userspec={user}:{user}"] if user else []
        e = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", **(env or {})}
        with open(os.path.join(self.work, name + ".log"), "w") as log:
            return subprocess.Popen([CHROOT, *spec, self.root, "/usr/local/bin/granary-entrypoint", *args],
                                    stdout=log, stderr=subprocess.STDOUT, env=e, start_new_session=True)

    def exec(self, args, user=0):
        spec = [f"--userspec={user}:{user}"] if user else []
        return run([CHROOT, *spec, self.root, *args], env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp"})

    def close(self):
        if not self.ctr:
            return
        if not self.root:
            run([self.engine, "rm", "-f", self.ctr])
            return
        # Every process still running from this root (a keeper spawned by a role, say).
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.readlink(f"/proc/{pid}/root") == self.root:
                        os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        with open("/proc/self/mountinfo") as f:
            below = [line.split()[4] for line in f if line.split()[4].startswith(self.root + "/")]
        for m in sorted(set(below) | set(self.mounts), key=len, reverse=True):
            run(["umount", "-l", m])
        run([self.engine, "umount", self.ctr])
        run([self.engine, "rm", "-f", self.ctr])


class ContainerRunner:
    """Runs the image's roles in real containers: host network, the directories the pods share as
    volumes bound from the host, the FUSE role privileged with its mount shared back to the host."""

    how = "real containers"
    VOLUMES = ("/etc/granary", "/etc/fluid", "/run/granary", "/run/granary-keeper", "/run/test", "/data",
               "/var/lib/granary/fuse")

    def __init__(self, engine, image, work):
        self.engine, self.image, self.work = engine, image, work
        self.prefix = "granary-image-test-" + secrets.token_hex(4)
        self.host = {v: os.path.join(work, "vol" + v.replace("/", "_")) for v in self.VOLUMES}
        self.shared = ""

    def prepare(self):
        for d in self.host.values():
            os.makedirs(d, exist_ok=True)
        # The FUSE mount made in the container shows on the host (Bidirectional in the pod).
        self.shared = self.host["/var/lib/granary/fuse"]
        for args in (["--bind", self.shared, self.shared], ["--make-rshared", self.shared]):
            r = run(["mount", *args])
            assert r.returncode == 0, f"mount {args}: {r.stderr}"

    def path(self, p):
        for v in sorted(self.VOLUMES, key=len, reverse=True):
            if p == v or p.startswith(v + "/"):
                return self.host[v] + p[len(v):]
        raise AssertionError(f"{p} is in no volume of the test's containers")

    def _run_args(self, user, privileged):
        vols = []
        for v, h in self.host.items():
            vols += ["-v", f"{h}:{v}" + (":rshared" if v == "/var/lib/granary/fuse" else "")]
        extra = ["--privileged", "--device", "/dev/fuse"] if privileged else []
        return ["--rm", "--network", "host", "--shm-size", "1g", "--user", f"{user}:{user}", *vols, *extra]

    def start(self, args, name, user=0, env=None):
        envs = [x for k, v in (env or {}).items() for x in ("-e", f"{k}={v}")]
        cmd = [self.engine, "run", "--name", f"{self.prefix}-{name}", *envs,
               *self._run_args(user, args[0] in ("fuse", "fluid-fuse")), self.image, *args]
        with open(os.path.join(self.work, name + ".log"), "w") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def exec(self, args, user=0):
        return run([self.engine, "run", *self._run_args(user, True), "--entrypoint", args[0], self.image, *args[1:]],
                   timeout=300)

    def close(self):
        r = run([self.engine, "ps", "-aq", "--filter", f"name={self.prefix}"])
        ids = r.stdout.split()
        if ids:
            run([self.engine, "rm", "-f", *ids], timeout=300)
        if self.shared:
            with open("/proc/self/mountinfo") as f:
                below = [line.split()[4] for line in f if line.split()[4].startswith(self.shared)]
            for m in sorted(set(below), key=len, reverse=True):
                run(["umount", "-l", m])


class ImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        t = time.monotonic()
        r = run(["bash", os.path.join(SRC, "scripts", "image.sh"), "--tag", TAG], timeout=3600)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        assert r.returncode == 0 and last.startswith("image: "), \
            f"scripts/image.sh failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        _, cls.image, size, cls.engine = last.split()
        cls.size = int(size)
        print(f"image {cls.image}: {cls.size / 1e6:.0f} MB, built with {cls.engine} in {time.monotonic() - t:.0f} s",
              flush=True)

    def containers_work(self):
        r = run([self.engine, "run", "--rm", "--network=host", "--entrypoint", "/bin/true", self.image], timeout=300)
        return r.returncode == 0

    def test_the_roles_run_from_the_image(self):
        self.work = tempfile.mkdtemp(prefix="granary-image-")
        self.addCleanup(shutil.rmtree, self.work, True)
        runner = ContainerRunner if self.containers_work() else ChrootRunner
        img = runner(self.engine, self.image, self.work)
        self.addCleanup(img.close)
        img.prepare()
        print("roles run with:", img.how, flush=True)
        self.roles_run(img)

    def roles_run(self, img):
        # Every library the binaries load is in the image.
        for b in ("granary", "granary-master", "granary-worker", "granary-fuse"):
            r = img.exec(["ldd", f"/usr/local/bin/{b}"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("not found", r.stdout, f"{b} loads a library the image lacks")
        # The example configuration, as the ConfigMap ships it, with its shared token.
        os.makedirs(img.path("/etc/granary/secrets"), exist_ok=True)
        shutil.copy(CONFIG, img.path("/etc/granary/granary.yaml"))
        token = img.path("/etc/granary/secrets/token")
        with open(token, "w") as f:
            f.write(secrets.token_hex(16))
        os.chown(token, UID, UID)
        os.chmod(token, 0o600)
        for d in ("/run/granary", "/run/granary-keeper", "/run/test"):  # the pods' hostPath and emptyDir volumes
            os.makedirs(img.path(d), exist_ok=True)
            os.chown(img.path(d), UID, UID)
        os.makedirs(img.path("/data/ds"), exist_ok=True)
        payload = os.urandom(700_000)
        with open(img.path("/data/ds/x.bin"), "wb") as f:
            f.write(payload)
        # Ports chosen by the OS on loopback (the example's fixed ports may be taken here).
        lo = "127.0.0.1:0"
        procs = []

        def start(args, name, user=0, env=None):
            p = img.start(args, name, user=user, env=env)
            procs.append(p)
            self.addCleanup(lambda: p.poll() is None and (p.kill() or p.wait(timeout=30)))
            return p

        def ready(name, p):
            path = img.path(f"/run/test/{name}.addr")
            wait_for(lambda: os.path.exists(path) or p.poll() is not None, timeout=60, what=f"{name} to be ready")
            self.assertIsNone(p.poll(), f"{name} exited:\n" + read(os.path.join(self.work, name + ".log")))
            return read(path).strip()

        m = start(["master", "--master.listen", lo, "--master.metrics_listen", lo, "--ufs.local_roots", "/data",
                   "--ready-file", "/run/test/master.addr"], "master", user=UID)  # the image's user, as in its pod
        master = ready("master", m)
        w = start(["worker", "--master.address", master, "--worker.listen", lo, "--worker.metrics_listen", lo,
                   "--ufs.local_roots", "/data",
                   "--ready-file", "/run/test/worker.addr"], "worker")  # root, as in its pod
        worker = ready("worker", w)
        k = start(["fuse-keeper"], "keeper", user=UID)  # the FUSE pod's sidecar
        wait_for(lambda: os.path.exists(img.path("/run/granary-keeper/keeper.sock")) or k.poll() is not None,
                 what="the keeper's socket")
        r = img.exec(["granary", "--config", "/etc/granary/granary.yaml", "--master", master,
                      "mount", "/ds", "file:///data/ds"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        f = start(["fuse", "--master.address", master, "--fuse.worker", worker, "--fuse.metrics_listen", lo,
                   "--ready-file", "/run/test/fuse.addr"], "fuse")
        ready("fuse", f)
        mp = img.path("/var/lib/granary/fuse/granary")
        self.assertTrue(mounted(mp), "the FUSE role's mount point, seen from the host")
        with open(os.path.join(mp, "ds", "x.bin"), "rb") as fh:
            self.assertEqual(fh.read(), payload, "bytes read from the host through the image's FUSE mount")
        for name in ("master", "worker", "fuse"):
            addr = read(img.path(f"/run/test/{name}.addr.metrics")).strip()
            self.assertEqual(readyz(addr), 200, name)
        # The token is in force: a CLI without it is refused.
        r = img.exec(["granary", "--master", master, "mounts"])
        self.assertNotEqual(r.returncode, 0, "the master answered a CLI without the shared token")
        stop = img.exec(["/usr/local/bin/granary-entrypoint", "fuse-stop"])
        self.assertEqual(stop.returncode, 0, stop.stdout + stop.stderr)
        wait_for(lambda: not mounted(mp), what="the unmount")
        wait_for(lambda: f.poll() is not None, what="granary-fuse to exit after fuse-stop")

        # Fluid's FUSE pod as the ThinRuntimeProfile starts it (issue 54: it had no token and the
        # master refused it): its command and args, its env, the token Secret at the path its volume
        # mounts, Fluid's config.json where Fluid writes it, and no Granary config file.
        with open(os.path.join(SRC, "deploy", "fluid", "thinruntimeprofile.yaml")) as fh:
            profile = next(x for x in yaml.safe_load_all(fh) if x and x["kind"] == "ThinRuntimeProfile")
        pf = profile["spec"]["fuse"]
        self.assertEqual([v["mountPath"] for v in pf["volumeMounts"]], ["/etc/granary/secrets"])
        target = "/var/lib/granary/fuse/fluid/thin-fuse"
        os.makedirs(img.path(target), exist_ok=True)
        os.makedirs(img.path("/etc/fluid/config"), exist_ok=True)
        with open(img.path("/etc/fluid/config/config.json"), "w") as fh:
            json.dump({"mounts": [{"mountPoint": "file:///data/ds", "name": "ds"}], "targetPath": target,
                       "runtimeOptions": {"granary.fuse.worker": worker, "granary.fuse.metrics_listen": lo},
                       "accessModes": ["ReadOnlyMany"]}, fh)
        env = {e["name"]: e["value"] for e in pf.get("env", [])}
        env.update({"GRANARY_MASTER": master, "GRANARY_CONFIG": "/etc/fluid/no-granary-config.yaml"})
        self.assertEqual(pf["command"], ["/usr/local/bin/granary-entrypoint", "fluid-fuse"])
        fl = start([*pf["command"][1:], *pf.get("args", [])], "fluid", env=env)
        fmp = img.path(target)
        wait_for(lambda: mounted(fmp) or fl.poll() is not None, timeout=60, what="the Fluid FUSE pod's mount")
        self.assertTrue(mounted(fmp), read(os.path.join(self.work, "fluid.log")))
        with open(os.path.join(fmp, "x.bin"), "rb") as fh:
            self.assertEqual(fh.read(), payload, "read through the Fluid pod's mount, from a master that wants the token")
        fl.send_signal(signal.SIGTERM)
        self.assertEqual(fl.wait(timeout=60), 0, read(os.path.join(self.work, "fluid.log")))
        wait_for(lambda: not mounted(fmp), what="the Fluid mount to go")
        for name, p in (("worker", w), ("master", m), ("keeper", k)):
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=60), 0, name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
