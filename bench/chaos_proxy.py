#!/usr/bin/env python3
"""A fault-injecting HTTP/1.1 proxy in front of an S3 server, for bench/chaos.sh.

Every request is passed to the server and its answer back, byte for byte (keep-alive, 100-continue,
Content-Length and chunked bodies), unless a fault is in force. The injector puts one in force by
writing the control file (JSON, read at most every 100 ms):

    {"kind": "slowdown"|"reset"|"stall"|"truncate", "until": <unix time>, "rate": 0.3, "stall_s": 4}

and, until `until`, each request meets the fault with probability `rate`:

    slowdown  answered at once with 503 SlowDown (an S3 error document); the server never sees it
    reset     the client's connection is reset (RST) without an answer
    stall     the answer's body stops half-way for `stall_s` seconds, then goes on
    truncate  the answer's body stops half-way and the connection closes (short of Content-Length)

Counts of what it did go to the stats file (JSON) every second: requests, faults applied by kind,
and the answers' body bytes (bytes_down), also by the key's first path segment below the bucket.

    chaos_proxy.py --listen HOST:PORT --to HOST:PORT --control F --stats F [--ready-file F] [--seed N]

With port 0 the OS picks one; the ready file gets HOST:PORT once it listens. Runs until killed.
"""
import argparse
import asyncio
import json
import os
import random
import socket
import struct
import time

SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 b'<Message>Please reduce your request rate.</Message><RequestId>chaos</RequestId></Error>')


class Control:
    def __init__(self, path, seed):
        self.path = path
        self.rng = random.Random(seed)
        self.read_at = 0.0
        self.state = {}
        self.counts = {"requests": 0, "bytes_down": 0, "slowdown": 0, "reset": 0, "stall": 0, "truncate": 0}

    def fault(self):
        """The fault this request meets, or None."""
        now = time.time()
        if now - self.read_at > 0.1:
            self.read_at = now
            try:
                with open(self.path) as f:
                    self.state = json.load(f)
            except (OSError, ValueError):
                self.state = {}
        self.counts["requests"] += 1
        s = self.state
        if not s or now >= float(s.get("until", 0)):
            return None
        if self.rng.random() >= float(s.get("rate", 0)):
            return None
        kind = s.get("kind")
        return kind if kind in ("slowdown", "reset", "stall", "truncate") else None

    def count_bytes(self, top, n):
        self.counts["bytes_down"] += n
        by = self.counts.setdefault("bytes_down_by_prefix", {})
        by[top] = by.get(top, 0) + n

    def applied(self, kind):
        self.counts[kind] += 1


async def read_head(reader):
    """Reads an HTTP head (through the blank line); b'' at a clean end of stream."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise ConnectionError("connection closed inside a head")
        return b""
    except asyncio.LimitOverrunError:
        raise ConnectionError("a head longer than the limit")


def headers_of(head):
    lines = head.decode("latin-1").split("\r\n")
    h = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            h[k.strip().lower()] = v.strip()
    return lines[0], h


async def copy_exact(reader, writer, n, fault=None, stall_s=0.0):
    """Copies n bytes; with a fault, the half-way point stalls or ends the connection."""
    half = n // 2 if fault in ("stall", "truncate") else -1
    done = 0
    while done < n:
        want = min(1 << 16, n - done)
        if half >= 0 and done < half:
            want = min(want, half - done)
        data = await reader.read(want)
        if not data:
            raise ConnectionError("closed inside a body")
        writer.write(data)
        done += len(data)
        if done == half:
            await writer.drain()
            if fault == "stall":
                await asyncio.sleep(stall_s)
                half = -1
            else:
                return False  # truncated
    await writer.drain()
    return True


async def copy_chunked(reader, writer):
    """Copies a chunked body; returns its payload bytes."""
    total = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        writer.write(line)
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers, then the blank line
                t = await reader.readuntil(b"\r\n")
                writer.write(t)
                if t == b"\r\n":
                    await writer.drain()
                    return total
        await copy_exact(reader, writer, size + 2)
        total += size


def reset(writer):
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def handle(creader, cwriter, upstream, control):
    ureader = uwriter = None
    try:
        while True:
            head = await read_head(creader)
            if not head:
                return
            request_line, h = headers_of(head)
            method = request_line.split(" ", 1)[0].upper()
            # Path-style "/bucket/<top>/...": bytes are counted by <top> (the dataset, the writes).
            parts = request_line.split(" ")[1].split("?", 1)[0].split("/") if " " in request_line else []
            top = parts[2] if len(parts) > 3 else ""
            body_len = int(h.get("content-length", "0") or 0)
            fault = control.fault()
            if fault == "reset":
                control.applied(fault)
                reset(cwriter)
                return
            if fault == "slowdown":
                control.applied(fault)
                # Answered before the body is read: the connection cannot be reused after that.
                cwriter.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: " +
                              str(len(SLOWDOWN_BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + SLOWDOWN_BODY)
                await cwriter.drain()
                cwriter.close()
                return
            if uwriter is None:
                ureader, uwriter = await asyncio.open_connection(*upstream, limit=1 << 20)
            uwriter.write(head)
            await uwriter.drain()
            body = asyncio.ensure_future(copy_exact(creader, uwriter, body_len)) if body_len else None
            # Interim answers (100 Continue) go back as they come; then the final one.
            while True:
                rhead = await read_head(ureader)
                if not rhead:
                    raise ConnectionError("the server closed without an answer")
                status_line, rh = headers_of(rhead)
                status = int(status_line.split(" ")[1])
                cwriter.write(rhead)
                await cwriter.drain()
                if status >= 200:
                    break
            if body is not None:
                await body
            if method == "HEAD" or status in (204, 304):
                continue
            if "content-length" in rh:
                n = int(rh["content-length"])
                if fault in ("stall", "truncate") and n >= 2:
                    control.applied(fault)
                else:
                    fault = None
                whole = await copy_exact(ureader, cwriter, n, fault, float(control.state.get("stall_s", 3)))
                control.count_bytes(top, n if whole else n // 2)
                if not whole:
                    reset(cwriter)
                    return
            elif rh.get("transfer-encoding", "").lower() == "chunked":
                control.count_bytes(top, await copy_chunked(ureader, cwriter))
            else:  # until the server closes
                while True:
                    data = await ureader.read(1 << 16)
                    if not data:
                        break
                    cwriter.write(data)
                await cwriter.drain()
                return
            if rh.get("connection", "").lower() == "close":
                return
    except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
        pass
    finally:
        for w in (cwriter, uwriter):
            if w is not None:
                try:
                    w.close()
                except Exception:
                    pass


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--to", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--ready-file")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    lh, lp = a.listen.rsplit(":", 1)
    th, tp = a.to.rsplit(":", 1)
    control = Control(a.control, a.seed)
    server = await asyncio.start_server(lambda r, w: handle(r, w, (th, int(tp)), control), lh, int(lp),
                                        limit=1 << 20)
    port = server.sockets[0].getsockname()[1]
    if a.ready_file:
        with open(a.ready_file + ".tmp", "w") as f:
            f.write(f"{lh}:{port}\n")
        os.replace(a.ready_file + ".tmp", a.ready_file)

    async def stats():
        while True:
            with open(a.stats + ".tmp", "w") as f:
                json.dump(control.counts, f)
            os.replace(a.stats + ".tmp", a.stats)
            await asyncio.sleep(1)

    asyncio.ensure_future(stats())
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
