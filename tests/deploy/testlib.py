"""Helpers shared by the deploy and image tests: commands, polling, files and mounts."""
import os
import subprocess
import time


def run(args, **kw):
    """Runs a command, its output captured as text (timeout: 120 s unless given)."""
    return subprocess.run(args, capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)


def wait_for(pred, timeout=30.0, what="condition"):
    """Polls `pred` until it holds; AssertionError naming `what` past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read(path):
    """A file's text, or "" when it does not exist."""
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def mounted(path):
    """Whether something is mounted at `path` (in this process's mount namespace)."""
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)
