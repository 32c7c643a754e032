#!/usr/bin/env bash
# Opens the memory viewer of every program every example compiles, offline,
# in headless chromium: each example runs (small settings) with
# FERRY_MEMORY_REPORT=dir, and each page written must load with no script
# error and draw at least one bar (the page sets data-errors and data-bars
# on <body>; chromium --dump-dom shows them after the script ran). The
# transformer runs a second time under a memory budget (-budget 0.6): the
# pages of its budgeted programs must draw the budget line and list the
# planner's decisions.
#
#   bash bench/memview/check-examples.sh    # prints "N pages, 0 failed"
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/memview/browser.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
text="$dir/text.txt"
for i in $(seq 200); do echo "the quick brown fox $i jumps over the lazy dog, line $i of a small text."; done > "$text"
run() { # name, then the command
  local name=$1
  shift
  mkdir -p "$dir/$name"
  FERRY_MEMORY_REPORT="$dir/$name" "$@" > "$dir/$name.log" 2>&1 || { echo "$name failed:"; tail -5 "$dir/$name.log"; exit 1; }
}
run quickstart go run ./examples/quickstart
if [ -d /usr/share/datasets/fashion-mnist ]; then
  run mlp go run ./examples/mlp -epochs 1
else
  echo "mlp: skipped (no Fashion-MNIST under /usr/share/datasets/fashion-mnist)"
fi
run init go run ./examples/init
run offload go run ./examples/offload
run sharded go run ./examples/sharded -steps 1
run transformer go run ./examples/transformer -data "$text" -steps 2 -eval-batches 1
run transformer-budget go run ./examples/transformer -data "$text" -steps 2 -eval-batches 1 -budget 0.6
pages=0
failed=0
budgeted=0
for f in "$dir"/*/*.html; do
  pages=$((pages + 1))
  dom=$(timeout 60 "$browser" --headless --disable-gpu --no-sandbox --no-first-run --user-data-dir="$dir/.profile" \
    --virtual-time-budget=3000 --dump-dom "file://$f" 2>/dev/null || true)
  errs=$(sed -n 's/.*data-errors="\([0-9]*\)".*/\1/p' <<<"$dom" | head -1)
  bars=$(sed -n 's/.*data-bars="\(-\{0,1\}[0-9]*\)".*/\1/p' <<<"$dom" | head -1)
  if [ "$errs" != 0 ] || [ -z "$bars" ] || [ "$bars" -le 0 ]; then
    echo "FAIL ${f#"$dir"/}: data-errors=${errs:-?} data-bars=${bars:-?}"
    failed=$((failed + 1))
  elif grep -q 'id="plan-program"' "$f"; then
    budgeted=$((budgeted + 1))
    if ! grep -q '<line class="budget"' <<<"$dom" || ! grep -q '<tr class="decision' <<<"$dom"; then
      echo "FAIL ${f#"$dir"/}: a budgeted program's page without its budget line or decisions"
      failed=$((failed + 1))
    fi
  fi
done
for e in "$dir"/*/; do
  echo "$(basename "$e"): $(ls "$e" | wc -l) pages"
done
echo "$pages pages ($budgeted under a memory budget), $failed failed"
[ "$failed" = 0 ] && [ "$pages" -gt 0 ] && [ "$budgeted" -gt 0 ]
