#!/usr/bin/env bash
# Builds Debian's own Abseil (the installed version, from its source package) with ThreadSanitizer
# into DEST, for scripts/sanitize.sh tsan to put first on LD_LIBRARY_PATH.
#
#   scripts/sanitizers/absl-tsan.sh DEST
#
# Why: gRPC hands a call from one of its threads to another (its executor, the callback queue)
# under absl::Mutex and absl::CondVar. Debian's libabsl is built without TSan, so those hand-offs
# are invisible and every access to a call on both sides looks raced (~2,300 reports a run, all in
# gRPC's code and the messages it carries). Built with TSan, absl::Mutex tells TSan of every lock
# (absl/base/internal/tsan_mutex_interface.h) and those reports go, with no suppression. Same
# version, same options as Debian's (debian/rules: C++17, shared), so Debian's gRPC links to it
# unchanged. Takes about a minute on 2 cores; done once per DEST.
set -euo pipefail
dest=${1:?usage: absl-tsan.sh DEST}
version=$(dpkg-query -W -f='${source:Version}' 'libabsl2*' | head -1)
[ -n "$version" ] || { echo "absl-tsan: libabsl is not installed (scripts/install-deps.sh)" >&2; exit 1; }
if [ -f "$dest/.built-$version" ]; then exit 0; fi

# The source package needs a deb-src entry; Debian 12's default sources have none.
if ! apt-get source --print-uris "abseil=$version" >/dev/null 2>&1; then
  echo "absl-tsan: adding Debian's source packages (/etc/apt/sources.list.d/granary-src.sources)" >&2
  cat >/etc/apt/sources.list.d/granary-src.sources <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  apt-get update -qq
fi
command -v dpkg-source >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get source -qq "abseil=$version" >/dev/null 2>&1) ||
  { echo "absl-tsan: cannot fetch Abseil's source package ($version)" >&2; exit 1; }
src=$(find "$work" -maxdepth 1 -mindepth 1 -type d -name 'abseil*' | head -1)
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
  -DABSL_PROPAGATE_CXX_STD=ON -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer -w" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >"$work/build.log" 2>&1 &&
  cmake --build "$work/build" -j"$(nproc)" >>"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log" >&2; echo "absl-tsan: the build failed" >&2; exit 1; }
rm -rf "$dest" && mkdir -p "$dest"
find "$work/build" -name 'libabsl_*.so*' -exec cp -a {} "$dest/" \;
# Every library Debian's gRPC loads must come from here, or an uninstrumented one would be mixed in.
for lib in /usr/lib/x86_64-linux-gnu/libabsl_*.so.*; do
  name=$(basename "$lib")
  case "$name" in *.so.*.*) continue;; esac
  [ -e "$dest/$name" ] || { echo "absl-tsan: the build made no $name" >&2; exit 1; }
done
touch "$dest/.built-$version"
echo "absl-tsan: Abseil $version built with TSan in $dest" >&2
