#!/usr/bin/env bash
# Regenerates the settings table in docs/configuration.md from the code (`granary config --markdown`).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BUILD_DIR:-$ROOT/build}/bin/granary
python3 - "$ROOT/docs/configuration.md" "$("$BIN" config --markdown)" <<'PY'
import re, sys
path, table = sys.argv[1], sys.argv[2]
doc = open(path).read()
begin = doc.index("<!-- settings:begin")
begin = doc.index("\n", begin) + 1
end = doc.index("<!-- settings:end -->")
open(path, "w").write(doc[:begin] + table + "\n" + doc[end:])
PY
echo "updated docs/configuration.md"
