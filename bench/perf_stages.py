#!/usr/bin/python3
"""Where the CPU of an epoch went: a table by role and by stage from a `perf record` of it.

    perf_stages.py PERF.DATA [--gb GB] [--hz 499] [--top 12]

Reads `perf script` of a whole-machine recording with call graphs (bench/rig.sh --perf) and
prints, as Markdown:
  1. CPU seconds by role: each Granary daemon, the readers (granary-train-read), the store (RGW,
     its OSD and monitor, the delay line), curl (the direct client), other system tools, and the
     kernel's own threads;
  2. for each Granary daemon, its stages: a sample counts for the innermost Granary function on
     its stack (granary::..., so "BlockSource::FetchOnce" holds everything it called that has no
     Granary frame of its own; locks, waits and template glue are passed over for their caller),
     or, with none, for what the leaf is (libcurl and TLS, gRPC,
     protobuf, the kernel's network, FUSE, page cache, scheduling, memory copies, the allocator);
  3. for each Granary daemon, what its leaves are (the same categories), whichever stage they
     belong to: the copies, checksums and syscalls its stages cost.
With --gb, each CPU figure also per GB the epoch read. One sample is 1/HZ CPU-seconds.
"""
import argparse
import collections
import re
import subprocess
import sys

ROLES = [
    ("granary-master", "granary-master"), ("granary-worker", "granary-worker"), ("granary-fuse", "granary-fuse"),
    ("granary-train-r", "readers"), ("radosgw", "store"), ("ceph-", "store"), ("delay_line", "store"),
    ("curl", "curl (direct client)"), ("rclone", "rclone"), ("s3fs", "s3fs"), ("perf", "perf"),
]

LEAF = [  # (pattern on "sym dso", category), first match wins
    (r"XXH|xxh", "checksum (xxhash)"),
    (r"libcurl|Curl_|curl_", "libcurl"),
    (r"libssl|libcrypto|ossl_|SSL_|EVP_|sha256|SHA256", "TLS and hashing (OpenSSL)"),
    (r"libgrpc|libgpr|grpc_|gpr_|absl", "gRPC"),
    (r"libprotobuf|google::protobuf", "protobuf"),
    (r"librocksdb|rocksdb::", "RocksDB"),
    (r"libfuse", "libfuse"),
    (r"memcpy|memmove|copy_user|rep_movs|copy_to_user|copy_from_user|_copy_to_iter|_copy_from_iter|copy_page",
     "memory copies"),
    (r"malloc|free|_int_|tcache|operator new|operator delete|cfree", "allocator"),
    (r"fuse_", "kernel: FUSE"),
    (r"tcp_|inet_|ip_|skb|sock_|__sys_recv|__sys_send|net_rx|napi|veth|sch_|dev_queue|__netif|tbf|nf_|__dev_",
     "kernel: network"),
    (r"ext4_|filemap|iomap|jbd2|page_cache|folio|shmem|generic_perform_write|pagecache|truncate|fallocate|punch",
     "kernel: files and page cache"),
    (r"futex|schedule|__switch_to|finish_task_switch|try_to_wake_up|pick_next|enqueue_task|dequeue_task|"
     r"update_curr|psi_|ttwu|select_task_rq|wake_up|__wake|epoll|ep_poll", "kernel: scheduling, futex, epoll"),
    (r"do_syscall|entry_SYSCALL|syscall_exit|syscall_enter|__x64_sys|exit_to_user|irqentry", "kernel: syscall entry"),
    (r"page_fault|handle_mm_fault|do_anonymous|clear_page|__alloc_pages|mmap|munmap|zap_|unmap|vma_", "kernel: memory"),
    (r"\[kernel", "kernel: other"),
    (r"libc\.so|libc-", "libc: other"),
    (r"libstdc\+\+", "libstdc++"),
]


def role_of(comm):
    for prefix, role in ROLES:
        if comm.startswith(prefix):
            return role
    return None


GRANARY_FRAME = re.compile(r"granary::(?:\w+::)*?((?:\w+::)?\w+)\(")


# Granary frames that name no stage of their own: locks, waits and the glue of std::function,
# gRPC's handler templates and protobuf (their callers are the stage).
GLUE = re.compile(r"MutexLock|granary::Mutex\b|std::|_Function_handler|__invoke|grpc::internal::|"
                  r"google::protobuf::|BoundedMap|TtlCache|operator\(\)")


def stage_of(frames):
    """frames: [(sym, dso)] leaf first."""
    fallback = None
    for sym, _ in frames:
        if "granary::" not in sym:
            continue
        sym = sym.replace(" (inlined)", "").replace("(anonymous namespace)::", "")
        m = GRANARY_FRAME.search(sym)
        name = m.group(1) if m else sym.split("(")[0][-60:]
        if GLUE.search(sym.split("(")[0]):
            fallback = fallback or name
            continue
        return name
    return fallback


def leaf_of(frames):
    if not frames:
        return "unknown"
    sym, dso = frames[0]
    text = "%s %s" % (sym, dso)
    for pat, cat in LEAF:
        if re.search(pat, text):
            return cat
    if "granary" in dso:
        return "Granary's own code"
    return "other (%s)" % (dso.rsplit("/", 1)[-1] or "?")


def samples(path):
    out = subprocess.run(["perf", "script", "-i", path, "-F", "comm,pid,tid,ip,sym,dso", "--demangle"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace").stdout
    comm, pid, frames = None, None, []
    for line in out.splitlines():
        if not line.strip():
            if comm is not None:
                yield comm, pid, frames
            comm, frames = None, []
            continue
        if not line[0].isspace():
            if comm is not None:
                yield comm, pid, frames
            head = line.split()
            # "comm pid/tid" or "comm pid": the comm may hold spaces; the pid field is the last token
            m = re.match(r"^(.*?)\s+(\d+)(?:/(\d+))?\s*$", line.strip())
            comm, pid, frames = (m.group(1), m.group(2), []) if m else (head[0], "?", [])
            continue
        m = re.match(r"^\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$", line)
        if m:
            frames.append((m.group(1), m.group(2)))
    if comm is not None:
        yield comm, pid, frames


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--gb", type=float, default=0)
    ap.add_argument("--hz", type=float, default=499)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    all_samples = list(samples(a.data))
    if not all_samples:
        sys.exit("perf_stages: no samples in %s (was it recorded with -g or --call-graph?)" % a.data)
    # A process's role from the comm of any of its threads that names one (threads named by a
    # library, such as gRPC's, keep their process's role).
    pid_role = {}
    for comm, pid, _ in all_samples:
        r = role_of(comm)
        if r and pid not in pid_role:
            pid_role[pid] = r
    by_role = collections.Counter()
    stages = collections.defaultdict(collections.Counter)
    leaves = collections.defaultdict(collections.Counter)
    for comm, pid, frames in all_samples:
        role = pid_role.get(pid) or role_of(comm) or ("kernel threads" if pid == "0" or not frames or
                                                     all("[kernel" in d for _, d in frames) else "other")
        if role == "kernel threads" and comm.startswith("swapper"):
            continue  # idle
        by_role[role] += 1
        if role.startswith("granary-"):
            leaf = leaf_of(frames)
            stages[role][stage_of(frames) or leaf] += 1
            leaves[role][leaf] += 1
    secs = lambda n: n / a.hz  # noqa: E731
    per_gb = lambda n: " | %.2f" % (secs(n) / a.gb) if a.gb else ""  # noqa: E731
    gb_head, gb_rule = (" | CPU s per GB", "|---:") if a.gb else ("", "")
    total = sum(by_role.values())
    print("| role | CPU s | share%s |" % gb_head)
    print("|---|---:|---:%s|" % gb_rule)
    for role, n in by_role.most_common():
        print("| %s | %.2f | %.0f%%%s |" % (role, secs(n), 100.0 * n / total, per_gb(n)))
    for role in sorted(stages):
        n_role = by_role[role]
        print("\n%s, by stage (the innermost Granary function on the stack):\n" % role)
        print("| stage | CPU s | share of %s%s |" % (role, gb_head))
        print("|---|---:|---:%s|" % gb_rule)
        for stage, n in stages[role].most_common(a.top):
            print("| %s | %.2f | %.0f%%%s |" % (stage, secs(n), 100.0 * n / n_role, per_gb(n)))
        print("\n%s, by what the leaf does:\n" % role)
        print("| leaf | CPU s | share of %s%s |" % (role, gb_head))
        print("|---|---:|---:%s|" % gb_rule)
        for leaf, n in leaves[role].most_common(a.top):
            print("| %s | %.2f | %.0f%%%s |" % (leaf, secs(n), 100.0 * n / n_role, per_gb(n)))


if __name__ == "__main__":
    main()
