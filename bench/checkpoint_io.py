#!/usr/bin/python3
"""bench/checkpoint.sh's client: a checkpoint written the way torch.save writes one, and the store
reached directly with the SDK (boto3), for the same bytes.

    checkpoint_io.py write PATH MB            the bytes of a MB-megabyte state dict, in 1 MiB writes
                                              to PATH, then close(); prints {"seconds": open to
                                              close returned, "bytes": ..., "sha256": ...}
    checkpoint_io.py upload ENDPOINT BUCKET KEY FILE
                                              FILE uploaded with boto3's multipart transfer (16 MiB
                                              parts, 8 in flight); prints {"seconds": ...}
    checkpoint_io.py wait ENDPOINT BUCKET KEY BYTES TIMEOUT_S
                                              polls HEAD until KEY has BYTES bytes; prints
                                              {"seconds": waited} (exit 1 on timeout)
    checkpoint_io.py sha ENDPOINT BUCKET KEY  the object's SHA-256 (read back with the SDK)

Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. torch is not needed: the payload is
what torch.save of a state dict of float tensors writes (incompressible bytes in big sequential
writes), from a fixed seed so every system writes the same bytes.
"""
import hashlib
import json
import os
import random
import sys
import time


def payload_chunks(mb):
    rng = random.Random(1234)
    block = rng.randbytes(64 << 20)  # one 64 MiB "tensor", repeated with a distinct header
    left = mb << 20
    i = 0
    while left > 0:
        for off in range(0, len(block), 1 << 20):
            if left <= 0:
                return
            n = min(1 << 20, left)
            chunk = block[off:off + n]
            if off == 0:
                chunk = i.to_bytes(8, "little") + chunk[8:]
            yield chunk
            left -= n
        i += 1


def client(endpoint):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5}))


def main():
    cmd = sys.argv[1]
    if cmd == "write":
        path, mb = sys.argv[2], int(sys.argv[3])
        h = hashlib.sha256()
        start = time.monotonic()
        with open(path, "wb", buffering=0) as f:
            for c in payload_chunks(mb):
                f.write(c)
                h.update(c)
        print(json.dumps({"seconds": time.monotonic() - start, "bytes": mb << 20, "sha256": h.hexdigest()}))
    elif cmd == "upload":
        from boto3.s3.transfer import TransferConfig
        endpoint, bucket, key, path = sys.argv[2:6]
        s3 = client(endpoint)
        cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=8)
        start = time.monotonic()
        s3.upload_file(path, bucket, key, Config=cfg)
        print(json.dumps({"seconds": time.monotonic() - start}))
    elif cmd == "wait":
        endpoint, bucket, key, size, timeout = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
        s3 = client(endpoint)
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            try:
                if s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == size:
                    print(json.dumps({"seconds": time.monotonic() - start}))
                    return
            except Exception:  # not there yet
                pass
            time.sleep(0.05)
        print(json.dumps({"seconds": None}))
        sys.exit(1)
    elif cmd == "sha":
        endpoint, bucket, key = sys.argv[2:5]
        body = client(endpoint).get_object(Bucket=bucket, Key=key)["Body"]
        h = hashlib.sha256()
        for c in iter(lambda: body.read(8 << 20), b""):
            h.update(c)
        print(h.hexdigest())
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
