#!/usr/bin/env bash
# Installs everything Granary needs to build, test and run, from Debian 12 packages.
# Run as root on a fresh Debian 12 machine. Does nothing when everything is already there.
#   install-deps.sh             build, test and run (a developer machine, CI)
#   install-deps.sh --build     only what building the daemons and the CLI needs (the image's
#                               build stage: GRANARY_BUILD_TESTS=OFF GRANARY_BUILD_BENCH=OFF
#                               GRANARY_BUILD_PYTHON=OFF)
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config ccache git python3 openssl
  libfuse3-dev fuse3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libspdlog-dev libyaml-cpp-dev libcli11-dev libxxhash-dev nlohmann-json3-dev
  libssl-dev libcurl4-openssl-dev libcpp-httplib-dev libtinyxml2-dev libnfs-dev
  liburing-dev  # granary-fuse's fuse.transport uring (fuse/uring.h)
)
if [ "${1:-}" != --build ]; then
  PKGS+=(
    prometheus  # promtool checks the /metrics endpoints
    yamllint python3-yaml  # deploy/ checks
    libgtest-dev libgmock-dev libbenchmark-dev python3-botocore
    python3-numpy python3-h5py  # tests/integration/readback_test.py's real writers (not python3-torch:
                                # 161 packages, 600 MB installed; the test skips torch without it)
    iproute2 util-linux  # ip netns and nsenter: the multi-node tests' hosts
    pybind11-dev python3-dev  # the Python package's extension (python/: granary:// for fsspec)
    python3-fsspec python3-pil  # granary:// for fsspec: its tests and bench/python_read.sh's loader
  )
  # kubectl renders the manifests (kubectl kustomize): Debian's kubernetes-client, unless a kubectl
  # is already installed (it may come from another package that owns /usr/bin/kubectl).
  command -v kubectl >/dev/null || PKGS+=(kubernetes-client)
fi
exec bash "$(dirname "$0")/apt-ensure.sh" "${PKGS[@]}"
