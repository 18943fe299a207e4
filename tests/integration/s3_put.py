#!/usr/bin/python3
"""Test-data helper for the S3 tests: creates a bucket and objects with boto3 (Debian's).

Usage: s3_put.py ENDPOINT ACCESS_KEY SECRET_KEY SPEC.json
SPEC: {"bucket": "name", "objects": [{"key": "a/b", "file": "/path"} | {"key": "a/c", "text": "..."},
       {"many": "prefix/", "count": 1100} | {"delete": "a/d"}]}
"""
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
            for i in range(o["count"]):
                s3.put_object(Bucket=spec["bucket"], Key="%s%05d" % (o["many"], i), Body=b"x")
        elif "file" in o:
            with open(o["file"], "rb") as f:
                s3.put_object(Bucket=spec["bucket"], Key=o["key"], Body=f.read())
        else:
            s3.put_object(Bucket=spec["bucket"], Key=o["key"], Body=o["text"].encode())
    print("ok")


if __name__ == "__main__":
    main()
