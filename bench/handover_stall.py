#!/usr/bin/env python3
"""The stall a reader sees while granary-fuse is upgraded (hand-over) and while it is killed and
restarted (keeper), and while the worker is killed and restarted: master, worker and granary-fuse
as separate processes on this machine, a dataset on local disk, reader threads that keep files
open and read them (pread) and open others anew, in a loop.

For each event the stall is the longest any single read took among the reads that were in flight
during the event (from the kill or the start of the successor until the successor serves); the
baseline is the same figure over 0.3 s windows with no event, measured in the same run. Events are
2.5 s apart, so the reads one stalls have ended before the next window opens. Prints a Markdown table (p50, p99, max over events, in ms) with the
ratio to the baseline's p50, and fails if a reader saw an error or wrong bytes.

  bench/handover_stall.py [--events N] [--mode daemon|kernel|passthrough] [--build DIR]
"""
import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_file(path, proc, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"error: a daemon exited early; see the logs beside {path}")
        time.sleep(0.01)
    raise SystemExit(f"error: {path} did not appear")


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--mode", default="daemon")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    binp = os.path.join(args.build, "bin")
    work = tempfile.mkdtemp(prefix="granary-stall-")
    procs = {}
    mnt = os.path.join(work, "mnt")
    stop = threading.Event()

    def start(name, argv, ready):
        if os.path.exists(ready):
            os.unlink(ready)
        log = open(os.path.join(work, name + ".log"), "a")
        p = subprocess.Popen(argv + ["--ready-file", ready], stdout=log, stderr=subprocess.STDOUT)
        addr = wait_file(ready, p)
        return p, addr

    try:
        src = os.path.join(work, "src")
        os.makedirs(src)
        rng = random.Random(1)
        names = []
        for i in range(64):
            n = f"img{i:03d}.jpg"
            with open(os.path.join(src, n), "wb") as f:
                f.write(rng.randbytes(60000 + rng.randrange(100000)))
            names.append(n)
        os.makedirs(mnt)
        procs["master"], master = start("master", [os.path.join(binp, "granary-master"), "--master.listen", "127.0.0.1:0",
                                                   "--master.data_dir", os.path.join(work, "meta"),
                                                   "--master.metrics_listen", "off"], os.path.join(work, "master.addr"))
        worker_argv = [os.path.join(binp, "granary-worker"), "--master.address", master, "--worker.listen",
                       "127.0.0.1:0", "--worker.cache_dir", os.path.join(work, "cache"), "--worker.metrics_listen",
                       "off", "--worker.heartbeat_interval", "200ms"]
        procs["worker"], waddr = start("worker", worker_argv, os.path.join(work, "worker.addr"))
        worker_argv[worker_argv.index("127.0.0.1:0")] = waddr  # restarts keep the address
        cli = [os.path.join(binp, "granary"), "--master", master]
        env = dict(os.environ, GRANARY_HOME=os.path.join(work, "home"))
        subprocess.run(cli + ["mount", "/ds", "file://" + src], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(cli + ["load", "/ds"], check=True, env=env, stdout=subprocess.DEVNULL)
        fuse_argv = [os.path.join(binp, "granary-fuse"), "--master.address", master, "--fuse.worker", waddr,
                     "--fuse.mountpoint", mnt, "--fuse.metrics_listen", "off", "--fuse.open", args.mode,
                     "--fuse.keep_cache", "false", "--fuse.handover_socket", os.path.join(work, "fuse.sock")]
        starts = [0]

        def fuse_ready():
            starts[0] += 1
            return os.path.join(work, f"fuse{starts[0]}.addr")
        procs["fuse"], _ = start("fuse", fuse_argv, fuse_ready())

        expect = {n: open(os.path.join(src, n), "rb").read() for n in names}
        ops = []  # (start, end) of every read
        errors = []
        lock = threading.Lock()

        def reader(seed):
            r = random.Random(seed)
            kept = {n: os.open(os.path.join(mnt, "ds", n), os.O_RDONLY) for n in r.sample(names, 8)}
            local = []
            while not stop.is_set():
                n = r.choice(names)
                t0 = time.monotonic()
                try:
                    if n in kept:
                        got = os.pread(kept[n], len(expect[n]) + 1, 0)
                    else:
                        with open(os.path.join(mnt, "ds", n), "rb") as f:
                            got = f.read()
                    if got != expect[n]:
                        errors.append((time.monotonic(), f"{n}: wrong bytes"))
                except OSError as e:
                    errors.append((time.monotonic(), f"{n}: {e}"))
                local.append((t0, time.monotonic()))
                if len(local) >= 256:
                    with lock:
                        ops.extend(local)
                    local = []
            with lock:
                ops.extend(local)

        threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(args.threads)]
        for t in threads:
            t.start()
        time.sleep(1)
        events = {"upgrade": [], "crash": [], "worker": [], "none": []}
        for i in range(args.events):
            for kind in ("none", "upgrade", "crash", "worker"):
                t0 = time.monotonic()
                if kind == "upgrade":
                    old = procs["fuse"]
                    procs["fuse"], _ = start("fuse", fuse_argv, fuse_ready())
                    old.wait(60)
                elif kind == "crash":
                    procs["fuse"].kill()
                    procs["fuse"].wait()
                    procs["fuse"], _ = start("fuse", fuse_argv, fuse_ready())
                elif kind == "worker":
                    procs["worker"].kill()
                    procs["worker"].wait()
                    time.sleep(2)  # a container restart's delay
                    procs["worker"], _ = start("worker", worker_argv, os.path.join(work, "worker.addr"))
                else:
                    time.sleep(0.3)
                events[kind].append((t0, time.monotonic()))
                time.sleep(2.5)  # quiet: the reads it stalled finish before the next window opens
        stop.set()
        for t in threads:
            t.join()
        if errors:
            def during(t):
                last = "the start"
                for k, v in events.items():
                    for a, b in v:
                        if a <= t and (last == "the start" or a > last[1]):
                            last = (k, a)
                return f"{last[0]} event +{t - last[1]:.2f}s" if last != "the start" else "before any event"
            first = errors[0]
            print(f"FAILED: readers saw {len(errors)} errors; the first after the {during(first[0])}: "
                  f"{[m for _, m in errors[:5]]}", file=sys.stderr)
            return 1
        # The stall of an event: the longest read in flight during it.
        ops.sort()

        def stall(a, b):
            return max([e - s for s, e in ops if s <= b and e >= a] or [0.0]) * 1000
        res = {k: [stall(a, b) for a, b in v] for k, v in events.items()}
        base = statistics.median(res["none"]) or 1e-9
        print(f"Reader stall, {args.events} events each, fuse.open={args.mode}, {args.threads} reader threads, "
              f"{len(ops)} reads, no errors ({os.uname().release})\n")
        print("| event | p50 ms | p99 ms | max ms | p50 / baseline |")
        print("|---|---:|---:|---:|---:|")
        labels = {"none": "no event (baseline: longest read in a window)", "upgrade": "upgrade (hand-over)",
                  "crash": "kill -9 granary-fuse + restart (keeper)", "worker": "kill -9 worker, restart 2 s later"}
        for k in ("none", "upgrade", "crash", "worker"):
            v = res[k]
            print(f"| {labels[k]} | {pct(v, .5):.1f} | {pct(v, .99):.1f} | {max(v):.1f} | "
                  f"{pct(v, .5) / base:.1f}x |")
        return 0
    finally:
        stop.set()
        for name in ("fuse", "worker", "master"):
            p = procs.get(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        if subprocess.run(["grep", "-q", " " + mnt + " ", "/proc/mounts"]).returncode == 0:
            subprocess.run(["umount", "-l", mnt])
        pidf = os.path.join(work, "fuse.sock.keeper.pid")
        if os.path.exists(pidf):
            try:
                os.kill(int(open(pidf).read()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
