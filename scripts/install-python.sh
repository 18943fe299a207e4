#!/usr/bin/env bash
# Installs the Python package `granary` (granary:// for fsspec; docs/python.md) from the build
# (build/python/granary: the pybind11 extension and the Python files) into Debian's python3, with
# the dist-info that registers the `granary` protocol with fsspec (entry point fsspec.specs), so
# fsspec.open("granary:///...") works without importing granary first.
#   install-python.sh [--prefix DIR] [--build DIR]
# DIR: a site-packages directory (default: Debian's /usr/local/lib/python3.X/dist-packages).
# Run after scripts/build.sh; root for the default prefix. Replaces an earlier install.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
PREFIX=""; BUILD=${BUILD_DIR:-$ROOT/build}
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    *) echo "usage: $0 [--prefix SITE_PACKAGES_DIR] [--build BUILD_DIR]" >&2; exit 2;;
  esac
done
[ -n "$PREFIX" ] || PREFIX=$($PY -c 'import site; print(site.getsitepackages()[0])')
SRC=$BUILD/python/granary
ls "$SRC"/_native.*.so >/dev/null 2>&1 || { echo "error: $SRC/_native.*.so not built (bash scripts/build.sh)" >&2; exit 1; }
VERSION=$(sed -n 's/^project(granary VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
mkdir -p "$PREFIX"
rm -rf "$PREFIX/granary" "$PREFIX"/granary-*.dist-info
cp -r "$SRC" "$PREFIX/granary"
find "$PREFIX/granary" -name __pycache__ -prune -exec rm -rf {} +
chmod -R a+rX "$PREFIX/granary"
DI=$PREFIX/granary-$VERSION.dist-info
mkdir -p "$DI"
cat > "$DI/METADATA" <<META
Metadata-Version: 2.1
Name: granary
Version: $VERSION
Summary: granary:// for fsspec: reads served by the node's granary-worker (docs/python.md)
Requires-Dist: fsspec
META
cat > "$DI/entry_points.txt" <<EP
[fsspec.specs]
granary = granary.filesystem:GranaryFileSystem
EP
echo "pip-less install by scripts/install-python.sh" > "$DI/INSTALLER"
(cd "$PREFIX" && find granary "$(basename "$DI")" -type f | sed 's/$/,,/') > "$DI/RECORD"
chmod -R a+rX "$DI"
# It imports, and fsspec finds the protocol by its entry point alone.
PYTHONPATH=$PREFIX $PY -c 'import fsspec; from fsspec.registry import get_filesystem_class as g; assert g("granary").__name__ == "GranaryFileSystem"'
echo "granary $VERSION for Python installed in $PREFIX"
