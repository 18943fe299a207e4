#!/usr/bin/python3
"""The rig's "direct" system: every object under a prefix fetched by one C client, curl.

One `curl --parallel` process (libcurl's multi interface: one thread, connections reused) keeps
INFLIGHT GETs going, signs them with SigV4 (--aws-sigv4; RGW wants the x-amz-content-sha256 header
set to UNSIGNED-PAYLOAD) and throws the bytes away. It is the floor of a cold epoch on this
machine: what the store, the link and the delay line deliver to a client that costs almost
nothing. A caching filesystem's cold epoch cannot beat it; its CPU per GB is the yardstick for
Granary's (issue 52).

    direct_get.py ENDPOINT BUCKET PREFIX INFLIGHT SPEC

SPEC: the rig's spec.json ({"objects": [{"key": ...}, ...]}); the keys under PREFIX are fetched.
Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, handed to curl in a 0600 config file
(never on its command line). Prints one JSON line in granary-train-read's shape (seconds,
files_per_s, mb_per_s, p50_ms, p99_ms, bytes, errors, mismatches) plus client_cpu_s: the CPU curl
spent (user + system), which the rig adds to the system's CPU (the client has ended before the
rig's snapshot of the live processes).
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.parse


def quote(s):
    return s.replace("\\", "\\\\").replace('"', '\\"')


def main():
    endpoint, bucket, prefix, inflight, spec = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    keys = [o["key"] for o in json.load(open(spec))["objects"] if o["key"].startswith(prefix)]
    ak, sk = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    with tempfile.TemporaryDirectory(prefix="direct-get-") as tmp:
        cfg = os.path.join(tmp, "curl.cfg")
        fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write('user = "%s:%s"\n' % (quote(ak), quote(sk)))
            f.write('aws-sigv4 = "aws:amz:us-east-1:s3"\n')
            f.write('header = "x-amz-content-sha256: UNSIGNED-PAYLOAD"\n')
            f.write("parallel\nparallel-max = %d\nsilent\n" % inflight)
            f.write('write-out = "%{http_code} %{size_download} %{time_total}\\n"\n')
            for k in keys:
                url = "%s/%s/%s" % (endpoint.rstrip("/"), bucket, urllib.parse.quote(k))
                f.write('url = "%s"\noutput = "/dev/null"\n' % quote(url))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        run = subprocess.run(["curl", "--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        secs = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lat, total, ok = [], 0, 0
    for line in run.stdout.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        code, size, t = parts
        if code == "200":
            ok += 1
            total += int(size)
            lat.append(float(t))
    errors = len(keys) - ok
    if errors and run.stderr:
        print(run.stderr.strip()[:2000], file=sys.stderr)
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0  # noqa: E731
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"seconds": round(secs, 3), "files_per_s": len(keys) / secs, "mb_per_s": total / secs / 1e6,
                      "p50_ms": pick(0.5), "p99_ms": pick(0.99), "bytes": total, "errors": errors, "mismatches": 0,
                      "client_cpu_s": round(cpu, 3)}))


if __name__ == "__main__":
    main()
