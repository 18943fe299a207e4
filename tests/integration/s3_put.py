#!/usr/bin/python3
"""Test-data helper for the S3 tests: creates a bucket and objects with boto3 (Debian's).

Usage: s3_put.py ENDPOINT ACCESS_KEY SECRET_KEY SPEC.json
SPEC: {"bucket": "name", "objects": [{"key": "a/b", "file": "/path"} | {"key": "a/c", "text": "..."},
       {"many": "prefix/", "count": 1100, "size": 1, "threads": 1} | {"delete": "a/d"}]}
"many" objects are named prefix + 5-digit index; with "size", each holds ManyBody(key, size): the key
and a newline, repeated and cut to size (so a test can check the bytes of any of them).
"""
from concurrent.futures import ThreadPoolExecutor
import json
import sys

import boto3
from botocore.config import Config


def main():
    endpoint, ak, sk, spec_path = sys.argv[1:5]
    spec = json.load(open(spec_path))
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ak, aws_secret_access_key=sk,
                      region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))
    if spec.get("create", True):
        s3.create_bucket(Bucket=spec["bucket"])
    for o in spec["objects"]:
        if "delete" in o:
            s3.delete_object(Bucket=spec["bucket"], Key=o["delete"])
        elif "many" in o:
            size = o.get("size")

            def put(i, o=o, size=size):
                key = "%s%05d" % (o["many"], i)
                body = b"x" if size is None else ((key + "\n").encode() * (size // (len(key) + 1) + 1))[:size]
                s3.put_object(Bucket=spec["bucket"], Key=key, Body=body)

            with ThreadPoolExecutor(max_workers=o.get("threads", 1)) as pool:
                for f in [pool.submit(put, i) for i in range(o["count"])]:
                    f.result()
        elif "file" in o:
            with open(o["file"], "rb") as f:
                s3.put_object(Bucket=spec["bucket"], Key=o["key"], Body=f.read())
        else:
            s3.put_object(Bucket=spec["bucket"], Key=o["key"], Body=o["text"].encode())
    print("ok")


if __name__ == "__main__":
    main()
