#!/usr/bin/env bash
# The README's picture of the memory viewer: the activation_offload case of
# examples/offload with the baseline beside it (its page opened at
# #baseline), rendered by headless chromium (Debian's chromium package).
#
#   bash bench/memview/screenshot.sh    # writes bench/memview/activation_offload.png
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/memview/browser.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go run ./examples/offload -html "$dir/html" >/dev/null
"$browser" --headless --disable-gpu --no-sandbox --no-first-run --hide-scrollbars --user-data-dir="$dir/profile" \
  --window-size=1600,880 --virtual-time-budget=3000 \
  --screenshot="$PWD/bench/memview/activation_offload.png" "file://$dir/html/activation_offload.html#baseline" 2>/dev/null
ls -l bench/memview/activation_offload.png
