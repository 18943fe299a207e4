"""Granary for Python: ``granary://`` URLs for fsspec, served by the node's worker.

    import fsspec
    with fsspec.open("granary:///imagenet/train/n01440764/x.JPEG", "rb") as f:
        data = f.read()

Reads go to the granary-worker on this node through its local socket (no FUSE mount, no
master token): cached blocks arrive as file descriptors and are read with pread; misses are
fetched by the worker. See docs/python.md.
"""
from ._native import Reader as GranaryFile
from .filesystem import GranaryFileSystem, default_socket

__all__ = ["GranaryFile", "GranaryFileSystem", "default_socket"]

try:  # granary:// without an installed entry point too (the build tree, PYTHONPATH)
    import fsspec

    fsspec.register_implementation("granary", GranaryFileSystem, clobber=True)
except ImportError:  # fsspec is optional for GranaryFileSystem's own use
    pass
