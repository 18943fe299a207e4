#!/usr/bin/env bash
# Builds Granary's container image (deploy/docker/Dockerfile) and prints its name and size.
#
#   bash scripts/image.sh [--tag NAME]      (default granary:latest; root)
#
# With docker when a docker engine answers, else with Debian's podman (installed when missing),
# building with chroot isolation (no container runtime needed). The Dockerfile starts FROM
# debian:12 and debian:12-slim: when those are not in the local image store and no registry
# answers, they are made here from Debian's packages (debootstrap --variant=minbase, trimmed like
# debian:12-slim, with this machine's apt sources), kept in GRANARY_IMAGE_CACHE
# (/var/cache/granary-image) and imported; a second build reuses them and every unchanged layer.
#
# Prints, last: "image: NAME SIZE_BYTES ENGINE".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TAG=granary:latest
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) TAG=$2; shift 2;;
    *) echo "image.sh: error: unknown argument '$1' (usage: image.sh [--tag NAME])" >&2; exit 2;;
  esac
done
CACHE=${GRANARY_IMAGE_CACHE:-/var/cache/granary-image}

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  ENGINE=docker
else
  ENGINE=podman
  command -v podman >/dev/null || bash "$ROOT/scripts/apt-ensure.sh" podman
fi

have_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

# The Debian 12 base, made from Debian's packages: a minbase root without documentation, man pages
# and locales (as debian:12-slim), apt lists dropped, and this machine's Debian sources.
make_base() {
  local tar=$CACHE/debian-12-minbase.tar
  if [ ! -s "$tar" ]; then
    command -v debootstrap >/dev/null || bash "$ROOT/scripts/apt-ensure.sh" debootstrap
    local mirror=${GRANARY_DEBIAN_MIRROR:-}
    if [ -z "$mirror" ]; then
      mirror=$(grep -hoE '^(URIs:|deb) +[^ ]+' /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null |
               awk '{print $2}' | grep -v security | head -1 || true)
    fi
    mirror=${mirror:-http://deb.debian.org/debian}
    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/granary-base.XXXXXX")
    trap 'rm -rf "$dir"; trap - RETURN' RETURN
    echo "image.sh: making the Debian 12 base with debootstrap from $mirror" >&2
    debootstrap --variant=minbase bookworm "$dir/root" "$mirror" >"$dir/debootstrap.log" 2>&1 || {
      tail -20 "$dir/debootstrap.log" >&2
      echo "image.sh: error: debootstrap could not make the Debian 12 base from $mirror (set GRANARY_DEBIAN_MIRROR to a reachable Debian mirror)" >&2
      return 1
    }
    local r=$dir/root
    # What debian:12-slim leaves out, also for packages installed later.
    cat >"$r/etc/dpkg/dpkg.cfg.d/granary-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
CFG
    find "$r/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
    rm -rf "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/lintian/*
    find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2>/dev/null || true
    rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb "$r"/var/log/*
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      cp /etc/apt/sources.list.d/debian.sources "$r/etc/apt/sources.list.d/debian.sources"
      rm -f "$r/etc/apt/sources.list"
    fi
    install -d -m 0755 "$CACHE"
    tar -C "$r" --numeric-owner -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
  fi
  "$ENGINE" import "$tar" debian:12 >/dev/null
  "$ENGINE" tag debian:12 debian:12-slim
}

for base in debian:12 debian:12-slim; do
  if ! have_image "$base" && ! "$ENGINE" pull -q "$base" >/dev/null 2>&1; then
    make_base
    break
  fi
done

cd "$ROOT"
# Untagged images of earlier builds (their build stages: a gigabyte each) are removed after this
# one, which keeps its own as the cache of the next build.
old_layers=$("$ENGINE" images -q --filter dangling=true | sort -u)
if [ "$ENGINE" = docker ]; then
  DOCKER_BUILDKIT=1 docker build -f deploy/docker/Dockerfile -t "$TAG" .
  old_layers=""  # BuildKit keeps its cache elsewhere
else
  # chroot isolation: builds where no OCI runtime can start a container (no cgroup delegation or
  # rlimit capability); the host's network, for the Debian mirror.
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  podman build --isolation=chroot --network=host --pull=never -f deploy/docker/Dockerfile -t "$TAG" . | tee "$log"
  # The layers this build made or reused ("--> ID", "--> Using cache ID") stay.
  used=$(grep -oE '^--> (Using cache )?[0-9a-f]{11,64}' "$log" | grep -oE '[0-9a-f]{11,64}$' | cut -c1-11 || true)
  old_layers=$(for id in $old_layers; do grep -q "^${id:0:11}" <<<"$used" || echo "$id"; done)
fi
if [ -n "$old_layers" ]; then
  # shellcheck disable=SC2086 # one id per word; an id still a parent of a kept layer stays
  "$ENGINE" rmi $old_layers >/dev/null 2>&1 || true
fi
size=$("$ENGINE" image inspect --format '{{.Size}}' "$TAG")
echo "image: $TAG $size $ENGINE"
