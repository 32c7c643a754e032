#!/usr/bin/env bash
# The memory viewer opens offline for every example program: each example's
# FERRY_MEMORY_REPORT pages load in headless chromium (installed by .ci/run)
# with no script error and bars drawn.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
echo "memview: running every example with FERRY_MEMORY_REPORT and opening each page in headless chromium (about 1.5 min)…"
bash bench/memview/check-examples.sh
echo "memview: passed in $(( $(date +%s) - start )) s"
