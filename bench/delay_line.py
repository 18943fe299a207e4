#!/usr/bin/env python3
"""A store far away, on loopback: a TCP proxy that holds every byte the server sends for DELAY ms.

This kernel has no netem, so the rig puts this delay line in front of the S3 server: each chunk of a
response leaves DELAY ms after it arrived, in order, so every request waits one more round trip of
DELAY ms and a stream of responses keeps its bandwidth (bytes in flight are not limited). Requests
pass at once. The bandwidth cap stays the rig's (tc tbf on the storage link).

The proxy's socket to the server is a TCP endpoint the real path does not have, and it must not
hold the server back: it acknowledges every read at once (TCP_QUICKACK). With Linux's delayed
acknowledgements it held the server's replies instead: the server's socket
runs on loopback (a 64 KiB segment) with Nagle's algorithm (RGW's default), so an object's body
smaller than a segment waited behind its unacknowledged headers for the 40 ms delayed-ACK timer —
a quarter of the responses of a client that reuses its connections at once (Granary's), against
1-2% of curl's (docs/benchmarks.md, session 45). Over a real link (1448-byte segments) the same
server shows no such stall.

    delay_line.py --listen HOST:PORT --to HOST:PORT --delay-ms 20 [--ready-file F]

With port 0 the OS picks one; the ready file gets HOST:PORT once it listens. Runs until killed.
"""
import argparse
import asyncio
import collections
import os
import socket
import time


async def pump(reader, writer, delay, ack_sock=None):
    """Copies reader to writer, each chunk released `delay` seconds after it arrived; acknowledges
    each read of `ack_sock` (the reader's socket) at once."""
    queue = collections.deque()
    arrived = asyncio.Event()
    done = False

    async def feed():
        nonlocal done
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                if ack_sock is not None:
                    try:  # sends the acknowledgement now if one is pending (not sticky: again each read)
                        ack_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                    except OSError:
                        pass
                queue.append((time.monotonic() + delay, data))
                arrived.set()
        except (ConnectionError, OSError):
            pass
        done = True
        arrived.set()

    feeder = asyncio.ensure_future(feed())
    try:
        while True:
            while not queue and not done:
                arrived.clear()
                await arrived.wait()
            if not queue and done:
                break
            due, data = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        feeder.cancel()
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass


async def direct(reader, writer):
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.write_eof()
    except (ConnectionError, OSError, RuntimeError):
        pass


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--to", required=True)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--ready-file")
    a = ap.parse_args()
    lhost, lport = a.listen.rsplit(":", 1)
    thost, tport = a.to.rsplit(":", 1)
    delay = a.delay_ms / 1000.0

    async def handle(creader, cwriter):
        try:
            sreader, swriter = await asyncio.open_connection(thost, int(tport))
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(direct(creader, swriter),
                             pump(sreader, cwriter, delay, ack_sock=swriter.get_extra_info("socket")))
        for w in (cwriter, swriter):
            w.close()

    server = await asyncio.start_server(handle, lhost, int(lport), backlog=1024)
    port = server.sockets[0].getsockname()[1]
    if a.ready_file:
        tmp = a.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{lhost}:{port}\n")
        os.rename(tmp, a.ready_file)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
