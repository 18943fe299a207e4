#!/usr/bin/env bash
# apt-ensure.sh PKG...: installs the Debian packages that are not installed yet (root), quietly.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "apt-ensure: error: missing packages (${missing[*]}); run as root" >&2
  exit 1
fi
echo "apt-ensure: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
