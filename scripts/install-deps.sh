#!/usr/bin/env bash
# Installs everything Granary needs to build, test and run, from Debian 12 packages.
# Run as root on a fresh Debian 12 machine. Does nothing when everything is already there.
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config ccache git python3 openssl
  libfuse3-dev fuse3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libspdlog-dev libyaml-cpp-dev libcli11-dev libxxhash-dev nlohmann-json3-dev
  libssl-dev libcurl4-openssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev python3-botocore libtinyxml2-dev libnfs-dev
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: error: missing packages (${missing[*]}); run this script as root" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
