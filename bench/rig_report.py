#!/usr/bin/python3
"""Turns bench/rig.sh results (JSON lines) into a Markdown table and a PNG chart.

Usage: rig_report.py RESULTS.jsonl CHART.png CMDLINE NODES RATE IMAGES SHARDS SHARD_MB EPOCHS PROCS THREADS
"""
import datetime
import json
import os
import platform
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rate_bytes(rate):
    """tc's rate ("400mbit", "1gbit") in bytes/s."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}
    for u, f in units.items():
        if rate.lower().endswith(u):
            return float(rate[:-len(u)]) * f / 8
    return float(rate) / 8


def main():
    results, chart, cmd, nodes, rate, images, shards, shard_mb, epochs, procs, threads = sys.argv[1:12]
    rows = [json.loads(line) for line in open(results) if line.strip()]
    names = {"local": "local disk", "s3fs": "s3fs", "rclone": "rclone (full VFS cache)", "granary": "Granary",
             "granary-no-elastic": "Granary, cache.elastic=false",
             "direct": "direct GETs, C client (curl --parallel, 64 in flight, no cache)",
             "direct-py": "direct GETs, Python (boto3, 64 threads, no cache)",
             "granary-no-ahead": "Granary, cache.fetch_ahead=false",
             "granary-passthrough": "Granary, fuse.open=passthrough (auto's choice for a dataset above half the memory)",
             "fuse-floor": "FUSE floor (minimal server over the local copy, bench/fuse_floor.cc --mirror)"}
    print("### %s — %d cores, %s, %s\n" % (datetime.date.today(), os.cpu_count(), platform.system(), platform.release()))
    print("Command: `%s`. Scale: %s images (~110 KB), %s shards of %s MB; %s nodes sharing a %s link to "
          "the S3 server%s; each node runs %s processes × %s threads; %s epochs.\n"
          % (cmd, images, shards, shard_mb, nodes, rate,
             ", every response held %s ms by a delay line (a store that far away)" % os.environ["RIG_LATENCY_MS"]
             if os.environ.get("RIG_LATENCY_MS", "0") not in ("", "0") else "", procs, threads, epochs))
    link = rate_bytes(rate)
    # The C direct client's epoch per dataset: what this machine's store and link give a client that
    # costs nearly nothing (issue 52); "× direct" divides it by each epoch's time.
    direct = {r["dataset"]: r["seconds"] for r in rows if r["system"] == "direct" and r["seconds"]}
    print("| dataset | system | nodes | epoch | epoch time s | files/s per node | MB/s per node | p50 ms | p99 ms | "
          "link bound s | × link | × direct | storage sent MB | × dataset | CPU s | CPU s per node | system CPU s per GB | "
          "store CPU s | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = r["storage_bytes"] / r["dataset_bytes"] if r["dataset_bytes"] else 0
        cpu = r.get("cpu_s", 0.0)
        bound = r["dataset_bytes"] / link if link else 0
        gb = r["dataset_bytes"] * r["nodes"] / 1e9
        sys_gb = "%.1f" % (r["system_cpu_s"] / gb) if "system_cpu_s" in r and gb else "-"
        store = "%.2f" % r["store_cpu_s"] if "store_cpu_s" in r else "-"
        xdirect = "%.2f" % (direct[r["dataset"]] / r["seconds"]) if r["dataset"] in direct and r["seconds"] else "-"
        print("| %s | %s | %d | %s | %.2f | %.0f | %.1f | %.1f | %.1f | %.2f | %.2f | %s | %.0f | %.2f | %.2f | %.2f | %s | %s | %d |" % (
            r["dataset"], names.get(r["system"], r["system"]), r["nodes"],
            "%d%s" % (r["epoch"], " (each node alone)" if r.get("alone") else ""), r["seconds"],
            r["files_per_s_node"], r["mb_per_s_node"], r["p50_ms"], r["p99_ms"], bound,
            bound / r["seconds"] if r["seconds"] else 0, xdirect, r["storage_bytes"] / 1e6, ratio,
            cpu, cpu / r["nodes"], sys_gb, store, r["errors"]))
    print("\n![epoch times](img/rig.png)\n")
    print("Storage sent is counted on the storage host's capped interface (all protocol bytes); "
          "`× dataset` divides it by one copy of the dataset. The link bound is one copy of the dataset at the link's "
          "rate (the time the link alone needs, on one node; on N nodes sharing it, a cold epoch that every node "
          "reads needs at least that once); `× link` divides it by the epoch time (1.0: the link is full); `× direct` divides the C direct "
          "client's epoch (one curl process, 64 GETs in flight, nothing kept) by the epoch time. CPU s is the whole machine's busy CPU time "
          "during the epoch (%d cores shared by every node, the S3 server and the readers); per node "
          "divides it by the nodes. System CPU s per GB: the CPU time of the system's own processes (Granary's "
          "daemons, rclone, s3fs, the direct GETs' client, curl's own CPU for the C one; not the readers) per GB the nodes read (bench/proc_cpu.py). "
          "Store CPU s: the S3 server's (RGW, its OSD and monitor, the delay line), which shares the same cores." % os.cpu_count())

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, ds in zip(axes, ["images", "shards"]):
        sel = [r for r in rows if r["dataset"] == ds]
        labels = ["%s\n%dn e%d" % (names.get(r["system"], r["system"]).split(" ")[0], r["nodes"], r["epoch"]) for r in sel]
        colors = ["#888" if r["system"] == "local" else "#d62728" if r["system"] == "s3fs" else
                  "#ff7f0e" if r["system"] == "rclone" else "#1f77b4" for r in sel]
        ax.bar(range(len(sel)), [r["seconds"] for r in sel], color=colors)
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("epoch time (s), slowest node")
        ax.set_title("%s dataset" % ds)
    fig.suptitle("Training-read epochs over a shared %s link (%s nodes)" % (rate, nodes))
    fig.tight_layout()
    os.makedirs(os.path.dirname(chart), exist_ok=True)
    fig.savefig(chart, dpi=100)


if __name__ == "__main__":
    main()
