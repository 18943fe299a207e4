#!/usr/bin/env python3
"""The chaos epoch (bench/chaos.sh runs this): every fault at once under training reads and writes.

A cluster in network namespaces (scripts/netns.sh): a storage host running Ceph RGW behind our
fault-injecting proxy (bench/chaos_proxy.py) and a 3-member etcd; three granary-masters electing a
leader; NODES nodes, each with a worker (its cache on a tmpfs of its own, so it can be filled), a
granary-fuse (read modes kernel, daemon, passthrough in turn) and a training-like reader
(bench/chaos_reader.py: shuffled epochs, read/pread/mmap, every byte checked); nodes 1 and 2 also
run a writer (bench/chaos_writer.py) into a write=back and a write=through mount.

For --minutes, a seeded injector picks a fault every 1.5-5 s and never waits for one to end before
the next: kill -9 and restart of a worker, of granary-fuse (crash: the keeper holds the connection;
or an upgrade through the hand-over socket), of a master (the leader or a standby); a node's or a
master's link cut for 2-6 s; the store answering 503 SlowDown, resetting connections, stalling
mid-body or cutting bodies short for 3-8 s (a share of requests); a cache disk filled to ENOSPC for
4-10 s; a byte flipped in a cached block file (not on the passthrough node: there the kernel reads
the cache file itself, verified by the scrub, not per read — docs/configuration.md); `granary
load`, `free`, `pin` and `unpin` meanwhile.

Then every fault is undone, the cluster must come back whole (a leader with both standbys in sync,
every reader reading), the write=back backlog must drain, and every write a writer saw acknowledged
(close returned 0) must read back whole through another node's mount.

Prints operations, reader errors (must be 0), wrong bytes (0), the longest stall, the store's bytes
as a multiple of the dataset (what one cold read costs), faults by kind and the seed; last line:
    reader errors <n>, wrong bytes <n>, longest stall <s> s, faults <n>, seed <n>
Exit status 0 only when reader errors and wrong bytes are 0 and the cluster came back.
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Namespaces and addresses of its own (CHAOS_NETNS_PREFIX/SUBNET: two runs side by side).
PREFIX = os.environ.get("CHAOS_NETNS_PREFIX", "gch")
SUBNET = os.environ.get("CHAOS_NETNS_SUBNET", "10.235.0")
NETENV = dict(os.environ, NETNS_PREFIX=PREFIX, NETNS_SUBNET=SUBNET)
MODES = ["kernel", "daemon", "passthrough", "kernel"]  # node n's fuse.open: MODES[(n - 1) % len]; --modes


def log(msg):
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def ns_path(ns):
    return f"/run/netns/{ns}"


def ip_of(k):  # host k (1 = storage, 2.. = nodes then masters)
    return f"{SUBNET}.{k}"


class Chaos:
    def __init__(self, a):
        self.a = a
        self.bin = a.bin_dir
        self.work = tempfile.mkdtemp(prefix="granary-chaos-")
        self.procs = {}      # name -> Popen
        self.args = {}       # name -> (ns, argv, log)
        self.maddr = {}      # master i -> host:port
        self.waddr = {}      # worker n -> host:port
        self.faults = {}     # kind -> count
        self.undo = []       # (time, description, fn): faults to end
        self.cli_jobs = []   # (what, Popen)
        self.cli_results = {"ok": 0, "failed": 0}
        self.rng = random.Random(a.seed)
        self.events = open(os.path.join(self.work, "events.log"), "w")
        self.ok = False

    # ---- processes ----
    def start(self, name, ns, argv, ready=None, timeout=90):
        logf = os.path.join(self.work, f"{name}.log")
        if ready:
            try:
                os.unlink(ready)
            except FileNotFoundError:
                pass
        cmd = (["nsenter", f"--net={ns_path(ns)}"] if ns else []) + argv
        self.args[name] = (ns, argv, ready)
        self.procs[name] = subprocess.Popen(cmd, stdout=open(logf, "ab"), stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        if ready:
            self.wait_file(ready, timeout, name)
            with open(ready) as f:
                return f.read().strip()
        return None

    def restart(self, name):
        ns, argv, ready = self.args[name]
        return self.start(name, ns, argv, ready)

    def kill9(self, name):
        p = self.procs.get(name)
        if p and p.poll() is None:
            p.kill()
            p.wait()

    def wait_file(self, path, timeout, name):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(path) and os.path.getsize(path) > 0:
                return
            p = self.procs.get(name)
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}) before it was ready; see {self.work}/{name}.log")
            # Faults end on time meanwhile: a restart on a node whose link is cut must not keep the
            # link cut while it waits (its predecessor's hand-over drains requests that need it).
            self.run_undo()
            time.sleep(0.05)
        raise RuntimeError(f"{name} was not ready in {timeout} s; see {self.work}/{name}.log")

    def run(self, argv, ns=None, timeout=120, env=None, check=True):
        cmd = (["nsenter", f"--net={ns_path(ns)}"] if ns else []) + argv
        # The faults due to end meanwhile end on time: a command that waits on a cut link (the CLI
        # runs in node 1's namespace) must not keep that link cut until its own timeout.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + timeout
        while True:
            try:
                out, err = p.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    p.kill()
                    p.communicate()
                    raise subprocess.TimeoutExpired(cmd, timeout) from None
                self.run_undo()
        r = subprocess.CompletedProcess(cmd, p.returncode, out, err)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])}... failed ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
        return r

    def cli(self, *args, timeout=120, check=True):
        return self.run([f"{self.bin}/granary", "--config", self.cli_yaml, "--master", self.masters, *args],
                        ns=f"{PREFIX}-n1", timeout=timeout, check=check,
                        env=dict(os.environ, GRANARY_HOME=os.path.join(self.work, "home")))

    def cli_background(self, what, *args):
        cmd = ["nsenter", f"--net={ns_path(PREFIX + '-n1')}", f"{self.bin}/granary", "--config", self.cli_yaml,
               "--master", self.masters, *args]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.work, "cli.log"), "ab"),
                             env=dict(os.environ, GRANARY_HOME=os.path.join(self.work, "home")))
        self.cli_jobs.append((what, p))

    def reap_cli(self, wait=False):
        left = []
        for what, p in self.cli_jobs:
            if wait:
                try:
                    p.wait(timeout=180)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if p.poll() is None:
                left.append((what, p))
            else:
                self.cli_results["ok" if p.returncode == 0 else "failed"] += 1
        self.cli_jobs = left

    # ---- set-up ----
    def setup(self):
        a = self.a
        w = self.work
        self.nodes = a.nodes
        hosts = a.nodes + 3
        self.run(["bash", f"{ROOT}/scripts/netns.sh", "up", str(hosts), "1gbit"], env=NETENV)
        storage = f"{PREFIX}-storage"
        # etcd (3 members) for the masters' election, on the storage host.
        r = self.run(["ip", "netns", "exec", storage, "env", f"ETCD_HOST={ip_of(1)}", "bash",
                      f"{ROOT}/scripts/etcd.sh", "start", f"{w}/etcd", "3"], timeout=120)
        lines = r.stdout.strip().splitlines()
        self.etcd = next(l.split()[1] for l in lines if l.startswith("READY "))
        tls = next(l.split(None, 1)[1] for l in lines if l.startswith("TLS "))
        self.etcd_tls = ["--master.etcd_tls_ca", f"{tls}/ca.pem", "--master.etcd_tls_cert", f"{tls}/client.pem",
                         "--master.etcd_tls_key", f"{tls}/client-key.pem"]
        # RGW, then our proxy in front of it.
        r = self.run(["ip", "netns", "exec", storage, "env", f"S3_BIND={ip_of(1)}", "bash",
                      f"{ROOT}/scripts/s3-server.sh", "start", f"{w}/rgw"], timeout=240)
        ready = r.stdout[r.stdout.rfind("READY"):].split()
        rgw, ak, sk = ready[1], ready[2], ready[3]
        for n, v in (("ak", ak), ("sk", sk)):
            with open(f"{w}/{n}", "w") as f:
                f.write(v)
            os.chmod(f"{w}/{n}", 0o600)
        self.control = f"{w}/proxy.ctl"
        self.proxy_stats = f"{w}/proxy.json"
        rgw_hostport = rgw.split("://", 1)[1]
        proxy = self.start("proxy", storage, ["python3", f"{ROOT}/bench/chaos_proxy.py", "--listen", f"{ip_of(1)}:0",
                                              "--to", rgw_hostport, "--control", self.control, "--stats",
                                              self.proxy_stats, "--ready-file", f"{w}/proxy.addr",
                                              "--seed", str(a.seed)], ready=f"{w}/proxy.addr")
        self.endpoint = f"http://{proxy}"
        # The dataset, uploaded straight to RGW (not through the proxy).
        self.run(["python3", f"{ROOT}/bench/gen_dataset.py", "--out", f"{w}/src", "--files", str(a.files),
                  "--classes", "20", "--seed", "7"])
        digests, objects = {}, []
        self.dataset_bytes = 0
        for d, _, fs in os.walk(f"{w}/src"):
            for f in fs:
                p = os.path.join(d, f)
                rel = os.path.relpath(p, f"{w}/src")
                with open(p, "rb") as fh:
                    data = fh.read()
                digests[rel] = hashlib.sha256(data).hexdigest()
                self.dataset_bytes += len(data)
                objects.append({"key": "ds/" + rel, "file": p})
        self.digests = digests
        with open(f"{w}/digests.json", "w") as f:
            json.dump(digests, f)
        with open(f"{w}/spec.json", "w") as f:
            json.dump({"bucket": "chaos", "objects": objects}, f)
        self.run(["ip", "netns", "exec", storage, "python3", f"{ROOT}/tests/integration/s3_put.py", rgw, ak, sk,
                  f"{w}/spec.json"], timeout=600)
        # Masters, with a shared token as in a cluster.
        with open(f"{w}/token", "wb") as f:
            f.write(os.urandom(24).hex().encode())
        os.chmod(f"{w}/token", 0o600)
        self.auth = ["--rpc.token_file", f"{w}/token"]
        for i in (1, 2, 3):
            self.maddr[i] = self.start_master(i, f"{ip_of(a.nodes + 1 + i)}:0")
            # Restarts reuse the address the OS picked: everyone knows the masters by it.
            argv = self.args[f"m{i}"][1]
            argv[argv.index("--master.listen") + 1] = self.maddr[i]
        self.masters = ",".join(self.maddr[i] for i in (1, 2, 3))
        self.cli_yaml = f"{w}/cli.yaml"
        with open(self.cli_yaml, "w") as f:
            f.write(f"rpc:\n  master_wait: 60s\n  token_file: {w}/token\n")
        self.wait_healthy(180)
        # Workers, each with its cache on a tmpfs of its own (filled to ENOSPC by the injector).
        for n in range(1, a.nodes + 1):
            cache = f"{w}/cache{n}"
            os.makedirs(cache)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={a.cache_mb}m,mode=0700", "tmpfs", cache], check=True)
            self.waddr[n] = self.start(f"w{n}", f"{PREFIX}-n{n}", [
                f"{self.bin}/granary-worker", "--master.address", self.masters, "--worker.listen", f"{ip_of(n + 1)}:0",
                "--worker.cache_dir", cache, "--worker.cache_quota", f"{a.cache_mb * 3 // 4}Mi",
                "--worker.heartbeat_interval", "1s", "--worker.local_socket", f"{w}/w{n}.sock",
                "--worker.metrics_listen", "off", "--ufs.secrets_dir", w, *self.auth,
                "--ready-file", f"{w}/w{n}.addr"], ready=f"{w}/w{n}.addr")
            # Restarts reuse the address the OS picked.
            ns, argv, ready = self.args[f"w{n}"]
            argv[argv.index("--worker.listen") + 1] = self.waddr[n]
        creds = ["-o", f"endpoint={self.endpoint}", "-o", f"access_key_file={w}/ak", "-o", f"secret_key_file={w}/sk"]
        self.cli("mount", "/ds", "s3://chaos/ds", *creds)
        self.cli("mount", "/ckpt-back", "s3://chaos/ckpt-back", *creds, "-o", "write=back")
        self.cli("mount", "/ckpt-through", "s3://chaos/ckpt-through", *creds, "-o", "write=through")
        for n in range(1, a.nodes + 1):
            os.makedirs(f"{w}/mnt{n}")
            self.start(f"f{n}", f"{PREFIX}-n{n}", [
                f"{self.bin}/granary-fuse", "--master.address", self.masters, "--fuse.worker", self.waddr[n],
                "--fuse.mountpoint", f"{w}/mnt{n}", "--fuse.open", MODES[(n - 1) % len(MODES)],
                "--fuse.metrics_listen", "off", "--fuse.handover_socket", f"{w}/f{n}.sock",
                "--fuse.entry_timeout", "1s", "--fuse.attr_timeout", "1s", "--rpc.master_wait", "60s", *self.auth,
                "--ready-file", f"{w}/f{n}.addr"], ready=f"{w}/f{n}.addr")
        # Readers on every node; writers on nodes 1 (write=back) and 2 (write=through).
        for n in range(1, a.nodes + 1):
            self.start(f"r{n}", None, ["python3", f"{ROOT}/bench/chaos_reader.py", "--mount", f"{w}/mnt{n}/ds",
                                       "--digests", f"{w}/digests.json", "--status", f"{w}/r{n}.json",
                                       "--stop", f"{w}/stop", "--seed", str(a.seed * 100 + n)])
        self.writers = {1: "ckpt-back", 2: "ckpt-through"}
        for n, mnt in self.writers.items():
            self.start(f"wr{n}", None, ["python3", f"{ROOT}/bench/chaos_writer.py", "--dir", f"{w}/mnt{n}/{mnt}",
                                        "--prefix", f"n{n}-", "--status", f"{w}/wr{n}.json",
                                        "--stop", f"{w}/stop-writers", "--seed", str(a.seed * 100 + n)])
        self.reads_go_on(120)

    def start_master(self, i, listen):
        w = self.work
        return self.start(f"m{i}", f"{PREFIX}-n{self.a.nodes + i}", [
            f"{self.bin}/granary-master", "--master.listen", listen, "--master.data_dir", f"{w}/m{i}",
            "--master.etcd_endpoints", self.etcd, *self.etcd_tls, "--master.election_ttl", "5s", "--master.metrics_listen", "off",
            "--master.block_size", "1Mi", "--ufs.secrets_dir", w, *self.auth, "--ready-file", f"{w}/m{i}.addr"],
            ready=f"{w}/m{i}.addr")

    # ---- health ----
    def state(self):
        """(leader address or "", standbys in sync)"""
        try:
            r = self.cli("report", "--json", timeout=30, check=False)
            m = json.loads(r.stdout)["master"]
            return m.get("leader", ""), sum(1 for s in m.get("standbys", []) if s.get("in_sync"))
        except Exception:
            return "", 0

    def wait_healthy(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader, synced = self.state()
            if leader and synced == 2:
                return
            time.sleep(0.5)
        r = self.cli("report", "--json", timeout=30, check=False)
        try:
            master = json.dumps(json.loads(r.stdout)["master"])
        except Exception:
            master = (r.stdout + r.stderr)[-1000:]
        raise RuntimeError(f"no leader with both standbys in sync within {timeout} s; the masters: {master}")

    def reader_stats(self):
        out = []
        for n in range(1, self.a.nodes + 1):
            try:
                with open(f"{self.work}/r{n}.json") as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                out.append({"reads": 0})
        return out

    def reads_go_on(self, timeout, per_node=30):
        """Every reader reads `per_node` more files."""
        before = [s.get("reads", 0) for s in self.reader_stats()]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = [s.get("reads", 0) for s in self.reader_stats()]
            if all(b + per_node <= c for b, c in zip(before, now)):
                return True
            time.sleep(0.2)
        stuck = [n + 1 for n, (b, c) in enumerate(zip(before, now)) if b + per_node > c]
        raise RuntimeError(f"readers on nodes {stuck} did not go on within {timeout} s")

    # ---- faults ----
    def note(self, kind, what):
        self.faults[kind] = self.faults.get(kind, 0) + 1
        self.events.write(f"{time.time():.3f} {kind} {what}\n")
        self.events.flush()
        log(f"fault {kind}: {what}")

    def later(self, seconds, what, fn):
        self.undo.append((time.monotonic() + seconds, what, fn))

    def run_undo(self, all_now=False):
        # Taken off the list before they run: an undo that restarts a process waits for it
        # (wait_file), which runs the undos due meanwhile, and none may run twice.
        now = time.monotonic()
        due = [u for u in self.undo if all_now or now >= u[0]]
        if not due:
            return
        self.undo = [u for u in self.undo if not any(u is d for d in due)]
        for t, what, fn in due:
            try:
                fn()
            except Exception as e:  # an undo must not stop the run; the end checks the cluster
                log(f"undo {what} failed: {e}")

    def busy(self, key):
        return any(what == key for _, what, _ in self.undo)

    def inject(self):
        r = self.rng
        kinds = ["worker_kill", "fuse_crash", "fuse_upgrade", "master_kill", "link_cut", "store_slowdown",
                 "store_reset", "store_stall", "store_truncate", "enospc", "flip", "cli_load", "cli_free",
                 "cli_pin"]
        kind = r.choice(kinds)
        n = r.randint(1, self.nodes)
        w = self.work
        if kind == "worker_kill":
            self.kill9(f"w{n}")
            self.restart(f"w{n}")
            self.note(kind, f"worker {n} killed -9 and restarted")
        elif kind in ("fuse_crash", "fuse_upgrade"):
            if kind == "fuse_crash":
                self.kill9(f"f{n}")
                self.restart(f"f{n}")
            else:  # the serving one hands the connection over and exits
                old = self.procs[f"f{n}"]
                self.restart(f"f{n}")
                try:
                    old.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"granary-fuse {n} did not exit after handing over")
            self.note(kind, f"granary-fuse {n} {'killed -9 and restarted' if kind == 'fuse_crash' else 'upgraded'}")
        elif kind == "master_kill":
            leader, _ = self.state()
            standby = r.random() < 0.4
            pick = [i for i in (1, 2, 3) if (self.maddr[i] != leader) == standby]
            if not pick:
                return
            i = r.choice(pick)
            if self.busy(f"master {i}"):
                return
            self.kill9(f"m{i}")
            back = r.uniform(0, 3)
            self.later(back, f"master {i}", lambda i=i: self.restart(f"m{i}"))
            self.note(kind, f"master {i} ({'standby' if standby else 'leader'}) killed -9, back in {back:.1f} s")
        elif kind == "link_cut":
            if r.random() < 0.3:
                i = r.randint(1, 3)
                host, what = f"{PREFIX}-n{self.nodes + i}", f"master {i}"
            else:
                host, what = f"{PREFIX}-n{n}", f"node {n}"
            if self.busy(f"link {host}"):
                return
            secs = r.uniform(2, 6)
            subprocess.run(["ip", "-n", host, "link", "set", "eth0", "down"], check=True)
            self.later(secs, f"link {host}",
                       lambda h=host: subprocess.run(["ip", "-n", h, "link", "set", "eth0", "up"], check=True))
            self.note(kind, f"{what}'s link cut for {secs:.1f} s")
        elif kind.startswith("store_"):
            fault = kind[len("store_"):]
            secs, rate = r.uniform(3, 8), r.uniform(0.15, 0.35)
            ctl = {"kind": fault, "until": time.time() + secs, "rate": rate, "stall_s": r.uniform(2, 6)}
            with open(self.control + ".tmp", "w") as f:
                json.dump(ctl, f)
            os.replace(self.control + ".tmp", self.control)
            self.note(kind, f"store {fault} on {rate:.0%} of requests for {secs:.1f} s")
            # Something to fetch meanwhile: a class's blocks freed, so the readers' next reads of it
            # (and their fetch-ahead) meet the fault.
            target = "/ds/" + r.choice(sorted({k.split("/")[0] for k in self.digests}))
            self.cli_background("cli_free", "free", target)
        elif kind == "enospc":
            if self.busy(f"fill {n}"):
                return
            filler = f"{w}/cache{n}/filler"
            st = os.statvfs(f"{w}/cache{n}")
            free = st.f_bavail * st.f_frsize
            with open(filler, "wb") as f:
                try:
                    os.posix_fallocate(f.fileno(), 0, max(free, 4096))
                except OSError:
                    pass  # full is what we want
            secs = r.uniform(4, 10)
            self.later(secs, f"fill {n}", lambda p=filler: os.unlink(p))
            self.note(kind, f"node {n}'s cache disk filled for {secs:.1f} s")
        elif kind == "flip":
            n = r.choice([k for k in range(1, self.nodes + 1) if MODES[(k - 1) % len(MODES)] != "passthrough"])
            files = []
            for d, _, fs in os.walk(f"{w}/cache{n}"):
                files += [os.path.join(d, f) for f in fs if "/blocks/" in d and not f.endswith(".m")]
            # Damage a block the worker wrote within worker.trust_own_writes (10 s) may be served:
            # reads of it are not checked for that long (docs/block_format.md, "Verification").
            # A failing disk damages what it has held for a while: files last written before that.
            old = time.time() - 15
            files = [f for f in files if os.path.exists(f) and os.path.getsize(f) > 0 and os.path.getmtime(f) < old]
            if not files:
                return
            path = r.choice(files)
            try:
                fd = os.open(path, os.O_RDWR)
                size = os.fstat(fd).st_size
                off = r.randrange(size)
                b = os.pread(fd, 1, off)
                os.pwrite(fd, bytes([(b[0] if b else 0) ^ (1 << r.randrange(8))]), off)
                # Flushed, as a failing disk's damage is: a page still dirty from the worker's own
                # write is trusted without a check (worker/store/block_file.h, FileAsWritten).
                os.fdatasync(fd)
                os.close(fd)
            except OSError:
                return  # removed meanwhile
            self.note(kind, f"one bit flipped in a cached block file on node {n}")
        elif kind == "cli_load":
            self.cli_background(kind, "load", "/ds")
            self.note(kind, "granary load /ds")
        elif kind == "cli_free":
            target = "/ds/" + r.choice(sorted({k.split("/")[0] for k in self.digests}))
            self.cli_background(kind, "free", target)
            self.note(kind, f"granary free {target}")
        elif kind == "cli_pin":
            target = "/ds/" + r.choice(sorted({k.split("/")[0] for k in self.digests}))
            self.cli_background(kind, "pin", target)
            self.later(r.uniform(5, 15), f"unpin {target}", lambda t=target: self.cli_background("cli_unpin", "unpin", t))
            self.note(kind, f"granary pin {target} (unpinned later)")

    # ---- the run ----
    def chaos(self):
        end = time.monotonic() + self.a.minutes * 60
        log(f"chaos for {self.a.minutes} min, seed {self.a.seed}")
        while time.monotonic() < end:
            self.run_undo()
            self.inject()
            self.reap_cli()
            until = min(end, time.monotonic() + self.rng.uniform(1.5, 5))
            while time.monotonic() < until:
                self.run_undo()
                time.sleep(0.1)
        log("chaos over: undoing every fault")
        self.run_undo(all_now=True)
        try:
            os.unlink(self.control)
        except FileNotFoundError:
            pass
        for name in list(self.procs):
            if name[0] in "wfm" and not name.startswith("wr") and self.procs[name].poll() is not None:
                log(f"{name} is not running at the end: restarting it")
                self.restart(name)
        self.wait_healthy(180)
        self.reads_go_on(180)
        self.reap_cli(wait=True)

    def finish(self):
        w = self.work
        # Writers stop; every acknowledged write must be in the store, whole, seen from node 4.
        open(f"{w}/stop-writers", "w").close()
        for n in self.writers:
            self.procs[f"wr{n}"].wait(timeout=300)
        deadline = time.monotonic() + 300
        drained = 0
        while time.monotonic() < deadline:
            r = self.cli("report", "--json", check=False)
            try:
                ws = json.loads(r.stdout)["workers"]
                backlog = sum(x.get("writeback_files", 0) for x in ws) if all(x["alive"] for x in ws) else -1
            except Exception:
                backlog = -1
            drained = drained + 1 if backlog == 0 else 0
            if drained == 3:  # three heartbeats in a row
                break
            time.sleep(1)
        # What is still staged (acknowledged, not in the store yet): a stuck uploader, not lost bytes.
        staged = {}
        for n in self.writers:
            d = f"{w}/cache{n}.staging"
            try:
                staged[n] = sum(1 for e in os.listdir(d) if e.endswith(".sealed"))
            except OSError:
                staged[n] = 0
        acked = lost = wrong_writes = names = 0
        reader_node = self.nodes
        first = []
        for n, mnt in self.writers.items():
            with open(f"{w}/wr{n}.json") as f:
                st = json.load(f)
            acked += st.get("acks", len(st["acked"]))
            for name, digest in st["acked"].items():
                names += 1
                path = f"{w}/mnt{reader_node}/{mnt}/{name}"
                data = None
                failed, failed_at = None, 0.0
                for _ in range(600):  # the kernel may hold a negative entry for a moment
                    try:
                        with open(path, "rb") as f:
                            data = f.read()
                        break
                    except FileNotFoundError:
                        time.sleep(0.1)
                    except OSError as e:  # ESTALE: the namespace names a version the store does not hold
                        if failed is not None and time.monotonic() - failed_at > 5:
                            break
                        if failed is None:
                            failed_at = time.monotonic()
                        failed = e
                        time.sleep(0.1)
                if data is None:
                    lost += 1
                    first.append(f"{mnt}/{name}: acknowledged, " +
                                 (f"unreadable from node {reader_node}: {failed}" if failed else "not in the store"))
                elif hashlib.sha256(data).hexdigest() not in [digest] + st.get("maybe", {}).get(name, []):
                    wrong_writes += 1
                    first.append(f"{mnt}/{name}: acknowledged, other bytes in the store")
        self.write_check = {"acked": acked, "names": names, "lost": lost, "wrong": wrong_writes, "first": first[:5], "staged": staged}
        open(f"{w}/stop", "w").close()
        for n in range(1, self.nodes + 1):
            self.procs[f"r{n}"].wait(timeout=120)

    def report(self):
        w = self.work
        rs = self.reader_stats()
        ws = []
        for n in self.writers:
            with open(f"{w}/wr{n}.json") as f:
                ws.append(json.load(f))
        with open(self.proxy_stats) as f:
            px = json.load(f)
        reads = sum(r.get("reads", 0) for r in rs)
        errors = sum(r.get("errors", 0) for r in rs)
        wrong_files = sum(r.get("wrong", 0) for r in rs) + self.write_check["wrong"] + self.write_check["lost"]
        stall = max(r.get("longest_stall_s", 0) for r in rs)
        writes = sum(x["writes"] for x in ws)
        write_errors = sum(x["errors"] for x in ws)
        ops = reads + writes + self.cli_results["ok"] + self.cli_results["failed"]
        store_faults = {k: px.get(k, 0) for k in ("slowdown", "reset", "stall", "truncate")}
        total_faults = sum(self.faults.values())
        print(f"chaos: {self.a.minutes} min, {self.nodes} nodes + 3 masters, seed {self.a.seed} "
              f"(replay: bench/chaos.sh --minutes {self.a.minutes} --seed {self.a.seed})")
        print(f"operations: {ops} ({reads} file reads: " +
              ", ".join(f"{k} {sum(r.get('by_way', {}).get(k, 0) for r in rs)}" for k in ("read", "pread", "mmap")) +
              f"; {writes} file writes; {self.cli_results['ok'] + self.cli_results['failed']} CLI jobs, "
              f"{self.cli_results['failed']} refused or failed)")
        print(f"epochs: {sum(r.get('epochs', 0) for r in rs)} over {len(rs)} readers of {len(self.digests)} files; "
              "files read by node (read mode): " +
              ", ".join(f"{n + 1} ({MODES[n % len(MODES)]}) {r.get('reads', 0)}" for n, r in enumerate(rs)))
        print(f"reader errors: {errors}")
        for r in rs:
            for e in r.get("first_errors", [])[:3]:
                print("   ", e)
        print(f"wrong bytes: {wrong_files} files (reads {sum(r.get('wrong', 0) for r in rs)}, "
              f"acknowledged writes lost {self.write_check['lost']}, differing {self.write_check['wrong']})")
        for e in self.write_check["first"]:
            print("   ", e)
        if any(self.write_check.get("staged", {}).values()):
            print("    still staged, not uploaded after the backlog's wait (write=back's uploader stuck; bytes kept, "
                  "not lost): " + ", ".join(f"node {n} {c} files" for n, c in self.write_check["staged"].items() if c))
        print(f"writes: {writes} files written, {self.write_check['acked']} acknowledged; the last acknowledged bytes "
              f"of each of the {self.write_check['names']} names written read back whole; "
              f"{write_errors} writes failed with an error (allowed: never acknowledged)")
        worst = max(rs, key=lambda r: r.get("longest_stall_s", 0))
        print(f"longest stall: {stall:.2f} s (one file's stat+open+read: {worst.get('longest_stall_file', '?')}, "
              f"began {time.strftime('%H:%M:%S', time.localtime(worst.get('longest_stall_at', 0)))}; "
              f"the faults before it: {self.faults_before(worst.get('longest_stall_at', 0))})")
        ds_bytes = px.get("bytes_down_by_prefix", {}).get("ds", 0)
        print(f"store: {px.get('requests', 0)} requests; the dataset's objects read {ds_bytes / max(1, self.dataset_bytes):.2f}x "
              f"over (one cold read is {self.dataset_bytes} bytes; frees, flips and full disks cost refetches)")
        print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())))
        print("store faults applied (requests): " + ", ".join(f"{k} {v}" for k, v in store_faults.items()))
        print(f"reader errors {errors}, wrong bytes {wrong_files}, longest stall {stall:.2f} s, "
              f"faults {total_faults}, seed {self.a.seed}")
        return errors == 0 and wrong_files == 0

    def faults_before(self, t):
        """The faults injected in the 15 s before time t (from the events log)."""
        out = []
        try:
            with open(os.path.join(self.work, "events.log")) as f:
                for line in f:
                    ts, kind, what = line.split(" ", 2)
                    if t - 15 <= float(ts) <= t:
                        out.append(f"{time.strftime('%H:%M:%S', time.localtime(float(ts)))} {what.strip()}")
        except (OSError, ValueError):
            pass
        return "; ".join(out[-3:]) or "none"

    def cleanup(self):
        w = self.work
        for f in ("stop", "stop-writers"):
            try:
                open(f"{w}/{f}", "w").close()
            except OSError:
                pass
        for _, p in list(self.procs.items()):
            if p.poll() is None:
                p.terminate()
        for _, p in self.cli_jobs:
            if p.poll() is None:
                p.kill()
        t = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, t - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        for line in open("/proc/mounts").read().splitlines():
            mp = line.split()[1]
            if mp.startswith(w + "/mnt"):
                subprocess.run(["umount", "-l", mp], capture_output=True)
        subprocess.run(["pkill", "-9", "-f", f"granary-fuse.*{w}"], capture_output=True)
        for line in open("/proc/mounts").read().splitlines():
            mp = line.split()[1]
            if mp.startswith(w + "/"):
                subprocess.run(["umount", "-l", mp], capture_output=True)
        subprocess.run(["ip", "netns", "exec", f"{PREFIX}-storage", "bash", f"{ROOT}/scripts/s3-server.sh", "stop",
                        f"{w}/rgw"], capture_output=True)
        subprocess.run(["bash", f"{ROOT}/scripts/etcd.sh", "stop", f"{w}/etcd"], capture_output=True)
        subprocess.run(["bash", f"{ROOT}/scripts/netns.sh", "down"], env=NETENV, capture_output=True)
        if self.a.keep_work:
            log(f"work dir kept: {w}")
            return
        if not self.ok:  # the logs stay for a post-mortem; the rest goes
            logs = f"/tmp/granary-chaos-logs-{self.a.seed}"
            shutil.rmtree(logs, ignore_errors=True)
            os.makedirs(logs)
            for f in os.listdir(w):
                if f.endswith((".log", ".json")) or f == "events.log":
                    shutil.copy(os.path.join(w, f), logs)
            log(f"logs kept: {logs}")
        shutil.rmtree(w, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description="The chaos epoch (see bench/chaos.sh).")
    ap.add_argument("--minutes", type=float, default=3)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--cache-mb", type=int, default=256)
    ap.add_argument("--bin-dir", default=os.environ.get("BIN_DIR", f"{ROOT}/build/bin"))
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--modes", default=" ".join(MODES),
                    help="fuse.open of the nodes in turn (default: kernel daemon passthrough kernel)")
    a = ap.parse_args()
    MODES[:] = a.modes.split()
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 1 << 31)
    c = Chaos(a)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    ok = False
    try:
        c.setup()
        c.chaos()
        c.finish()
        ok = c.report()
        c.ok = ok
    except Exception as e:
        log(f"error: {e}")
        print(f"chaos: did not complete: {e} (seed {a.seed}; logs in /tmp/granary-chaos-logs-{a.seed})")
    finally:
        c.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
