#!/usr/bin/env python3
"""CPU time by role, for the rig: which part of a shared 2-core machine an epoch's CPU went to.

    proc_cpu.py snap FILE        # writes every process's user+system ticks (pid, start time) to FILE
    proc_cpu.py diff FILE        # prints {"store": s, "system": s, "by_process": {name: s}} spent
                                 # since the snapshot (by_process: each role's programs, e.g.
                                 # radosgw, ceph-osd, granary-worker)

Roles, by command line: the store (radosgw, ceph-*, the delay line) and the system under test (its
daemons: granary-master/-worker/-fuse, the minimal FUSE server granary-fuse-floor, rclone, s3fs, and the direct GETs' client). A process that
started after the snapshot counts from zero; one that ended before the diff is not seen, which is
why the readers (granary-train-read, short-lived) are not a role: the rig's whole-machine CPU
(/proc/stat) holds them, and the kernel's share. A pid is matched with its start time, so a
recycled pid is not taken for the old process.
"""
import json
import os
import sys

STORE = ("radosgw", "ceph-osd", "ceph-mon", "ceph-mgr", "delay_line.py")
SYSTEM = ("granary-master", "granary-worker", "granary-fuse", "granary-fuse-floor", "rclone", "s3fs", "s3_get_all.py")


def role(cmd):
    for r, names in (("store", STORE), ("system", SYSTEM)):
        for part in cmd[:3]:
            if os.path.basename(part) in names:
                return r
    return None


def name(cmd):
    for part in cmd[:3]:
        if os.path.basename(part) in STORE + SYSTEM:
            return os.path.basename(part)
    return "?"


def snapshot():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = [c.decode(errors="replace") for c in f.read().split(b"\0") if c]
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        r = role(cmd)
        if r:  # fields[0] is field 3 (state): utime is 14, stime 15, starttime 22
            out["%s/%s" % (pid, fields[19])] = (r, int(fields[11]) + int(fields[12]), name(cmd))
    return out


def main():
    mode, path = sys.argv[1:3]
    if mode == "snap":
        with open(path, "w") as f:
            json.dump(snapshot(), f)
        return
    before = json.load(open(path))
    spent = {"store": 0, "system": 0}
    by_name = {}
    for key, (r, ticks, n) in snapshot().items():
        d = ticks - before.get(key, [r, 0])[1]
        spent[r] += d
        by_name[n] = by_name.get(n, 0) + d
    hz = os.sysconf("SC_CLK_TCK")
    out = {r: t / hz for r, t in spent.items()}
    out["by_process"] = {n: t / hz for n, t in sorted(by_name.items())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
