"""Shared by the tables of bench/fuse_floor.sh and bench/fuse_uring.sh: the probe results
(one JSON line per probe, from floor_probe.sh's probe_rounds) by server, request and threads."""
import datetime
import json
import os
import platform
import statistics

OPS = ("ioctl", "getattr", "read4k", "read128k")
NAMES = {"ioctl": "ioctl (TCGETS)", "getattr": "GETATTR (statx, forced)", "read4k": "READ 4 KiB (O_DIRECT)",
         "read128k": "READ 128 KiB (O_DIRECT)"}


class Results:
    def __init__(self, path):
        self.rows = [json.loads(l) for l in open(path)]
        self.runs = {}  # (server, op, threads) -> round -> row
        for r in self.rows:
            self.runs.setdefault((r["server"], r["op"], r["threads"]), {})[r["round"]] = r
        self.rounds = len({r["round"] for r in self.rows})
        self.errors = sum(r["errors"] for r in self.rows)

    def median(self, server, op, threads):
        """The medians over the rounds of mean_us and p50_us; None when that probe did not run."""
        v = self.runs.get((server, op, threads))
        if not v:
            return None
        return {f: statistics.median(x[f] for x in v.values()) for f in ("mean_us", "p50_us")}

    def ratio(self, num, den, op, threads, field):
        """The median of the rounds' ratios num / den: each from two probes a few seconds apart."""
        a, b = self.runs[(num, op, threads)], self.runs[(den, op, threads)]
        return statistics.median(a[r][field] / b[r][field] for r in a if r in b)


def heading():
    return "### %s — %d cores, %s %s\n" % (datetime.date.today(), os.cpu_count(), platform.system(),
                                           platform.release())
