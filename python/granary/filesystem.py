"""GranaryFileSystem: the ``granary`` protocol for fsspec (docs/python.md).

Metadata comes from the worker (which asks the master), cached for ``metadata_ttl`` seconds as
the FUSE mount caches it (nothing below a writable mount); bytes come from the worker's cache as
leased file descriptors. A file opened here is one version of it: if the under-storage gets
another version while it is open, its reads fail with OSError(ESTALE), never mix the two.
Read-only: write through the mount. Files open as granary._native.Reader (binary: read, readinto,
readline, seek, tell, iteration by line; a read-ahead buffer of ``block_size``, default 4 MiB).
"""
import errno
import glob
import os
from datetime import datetime, timezone

try:
    from fsspec.spec import AbstractFileSystem
    from fsspec.utils import stringify_path
except ImportError:  # pragma: no cover - fsspec is a dependency of the package
    AbstractFileSystem = object

    def stringify_path(p):
        return os.fspath(p)

from . import _native

SOCKET_DIR = "/run/granary"
# Clients a forked child inherited: never destroyed there (their threads stayed in the parent).
_inherited = []


def default_socket():
    """The worker's local socket: $GRANARY_SOCKET, else the one socket in /run/granary."""
    env = os.environ.get("GRANARY_SOCKET")
    if env:
        return env
    found = sorted(glob.glob(os.path.join(SOCKET_DIR, "worker-*.sock")))
    if len(found) == 1:
        return found[0]
    if not found:
        raise FileNotFoundError(
            errno.ENOENT,
            "no granary-worker socket found in %s (is granary-worker running on this node, and may this "
            "user search that directory? see worker.local_socket_group); or set GRANARY_SOCKET" % SOCKET_DIR,
            SOCKET_DIR,
        )
    raise ValueError(
        "several granary-worker sockets in %s (%s): choose one with GRANARY_SOCKET or socket=" % (SOCKET_DIR, ", ".join(found))
    )


class GranaryFileSystem(AbstractFileSystem):
    """fsspec filesystem for ``granary://<namespace path>``.

    Parameters: ``socket`` (the worker's local socket; default: $GRANARY_SOCKET or the one in
    /run/granary), ``metadata_ttl`` (seconds an entry is cached; 60, as fuse.entry_timeout),
    ``worker_wait`` (seconds a call waits for a worker that is away; 60), ``max_entries``
    (entries cached per process).
    """

    protocol = "granary"
    root_marker = "/"

    def __init__(self, socket=None, metadata_ttl=60.0, worker_wait=60.0, max_entries=262144, **kwargs):
        super().__init__(**kwargs)
        self.socket = socket or default_socket()
        self._options = (float(metadata_ttl), float(worker_wait), int(max_entries))
        self._native = None
        self._connect()

    def _connect(self):
        self._native = _native.Client(self.socket, *self._options)

    @property
    def client(self):
        # A forked child (a DataLoader worker) must not share its parent's connections: the
        # frames of two processes would interleave on them. (forked() counts forks without a
        # system call, unlike os.getpid().)
        if self._native.forked():
            _inherited.append(self._native)
            self._connect()
        return self._native

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, (list, tuple)):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("granary://"):
            path = path[len("granary://"):]
        elif path.startswith("granary:"):
            path = path[len("granary:"):]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    def unstrip_protocol(self, name):
        return "granary://" + self._strip_protocol(name)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        try:
            entries = self.client.ls(path)
        except NotADirectoryError:
            entries = [self.client.stat(path)]
            if entries[0]["type"] == "directory":
                raise
        return entries if detail else [e["name"] for e in entries]

    def info(self, path, **kwargs):
        return self.client.stat(self._strip_protocol(path))

    def ukey(self, path):
        i = self.info(path)
        return "%s:%s:%s" % (i["ino"], i.get("version", ""), i["size"])

    def modified(self, path):
        return datetime.fromtimestamp(self.info(path)["mtime"], tz=timezone.utc)

    def created(self, path):
        return self.modified(path)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.info(path)["size"]
            if start is not None and start < 0:
                start = max(0, size + start)
            if end is not None and end < 0:
                end = max(0, size + end)
        return self.client.cat(path, start or 0, -1 if end is None else end)

    def open(self, path, mode="rb", block_size=None, cache_options=None, compression=None, **kwargs):
        # The common case without fsspec's generic wrapping (a Python call or two per open counts
        # when files are 100 KB): binary reads, no compression.
        if mode == "rb" and compression is None:
            return self.client.reader(self._strip_protocol(path), block_size or 0)
        return super().open(path, mode, block_size=block_size, cache_options=cache_options, compression=compression,
                            **kwargs)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise OSError(errno.EROFS, "granary:// is read-only (write through the FUSE mount)", path)
        return self.client.reader(self._strip_protocol(path), block_size or 0)

    # Writes: granary:// is read-only.
    def _rofs(self, *args, **kwargs):
        raise OSError(errno.EROFS, "granary:// is read-only (write through the FUSE mount)")

    mkdir = makedirs = rm_file = _rm = rm = rmdir = cp_file = mv = touch = put_file = pipe_file = _rofs


