#!/usr/bin/python3
"""Re-signs the requests printed by sigv4_vectors with botocore's S3SigV4Auth and compares.

Usage: sigv4_botocore.py PATH/TO/sigv4_vectors. Exits non-zero on the first mismatch, printing
both canonical requests' inputs. Needs Debian's python3-botocore (run with /usr/bin/python3).
"""
import datetime
import json
import subprocess
import sys
from unittest import mock
from urllib.parse import quote

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def sign(v):
    # botocore serialises S3 keys into the URL with quote(key, safe='/~'); do the same.
    url = "http://" + v["host"] + quote(v["path"], safe="/~")
    req = AWSRequest(method=v["method"], url=url, params=dict(v["query"]), headers=dict(v["headers"]))
    creds = Credentials(v["access_key"], v["secret_key"], v["token"] or None)
    fixed = datetime.datetime.utcfromtimestamp(v["time"])

    class FixedDatetime(datetime.datetime):
        @classmethod
        def utcnow(cls):
            return fixed

    with mock.patch("botocore.auth.datetime.datetime", FixedDatetime):
        S3SigV4Auth(creds, "s3", v["region"]).add_auth(req)
    auth = req.headers["Authorization"]
    return auth.rsplit("Signature=", 1)[1], auth


def main():
    out = subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout
    n = 0
    for line in out.splitlines():
        v = json.loads(line)
        want, auth = sign(v)
        if want != v["signature"]:
            print("MISMATCH for", json.dumps(v, ensure_ascii=False))
            print("botocore:", auth)
            sys.exit(1)
        n += 1
    if n == 0:
        print("no vectors")
        sys.exit(1)
    print("%d signatures match botocore" % n)


if __name__ == "__main__":
    main()
