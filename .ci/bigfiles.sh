#!/usr/bin/env bash
# CI check: no tracked file over 1 MB unless it is data the tests read
# (listed below). Built programs belong in .gitignore, not in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
allowed=(
)
status=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f")
  if [ "$size" -gt 1048576 ]; then
    ok=0
    for a in "${allowed[@]}"; do [ "$f" = "$a" ] && ok=1; done
    if [ $ok = 0 ]; then
      echo "tracked file over 1 MB: $f ($((size / 1024)) KiB); add built programs to .gitignore, or list test data in .ci/bigfiles.sh"
      status=1
    fi
  fi
done < <(git ls-files -z)
exit $status
