#!/usr/bin/python3
"""The under-storage read directly: every object under a prefix fetched with many GETs in flight.

The rig's "direct" system: what this machine's store, link and delay line can deliver when a
client keeps THREADS requests in flight and does nothing else with the bytes (no cache, no FUSE).
It is the cold epoch's floor in the same run: a caching filesystem's cold epoch cannot beat it.

    s3_get_all.py ENDPOINT BUCKET PREFIX THREADS

Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. Prints one JSON line in
granary-train-read's shape (seconds, files_per_s, mb_per_s, p50_ms, p99_ms, bytes, errors, mismatches).
"""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config


def main():
    endpoint, bucket, prefix, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      config=Config(max_pool_connections=threads, retries={"max_attempts": 5},
                                    s3={"addressing_style": "path"}))
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    lat, errors = [], 0

    def get(key):
        t = time.monotonic()
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        lat.append(time.monotonic() - t)
        return len(body)

    start = time.monotonic()
    total = 0
    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(get, k) for k in keys]:
            try:
                total += f.result()
            except Exception:  # noqa: BLE001 - counted, the run goes on
                errors += 1
    secs = time.monotonic() - start
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0  # noqa: E731
    print(json.dumps({"seconds": round(secs, 3), "files_per_s": len(keys) / secs, "mb_per_s": total / secs / 1e6,
                      "p50_ms": pick(0.5), "p99_ms": pick(0.99), "bytes": total, "errors": errors, "mismatches": 0}))


if __name__ == "__main__":
    main()
