#!/usr/bin/env bash
# Speed on every CPU path this host can run: bench/vsjax's training-step rows
# (Ferry beside JAX, alternating, in one run per path) and bench/cpu's
# Transformer step against the FMA peak measured in the same run, once per
# path (FERRY_CPU=avx512, avx2; the portable Go path is far slower and is
# left out unless CPUPATHS_GO=1). Results go to stdout as Markdown; record
# them in bench/RESULTS.md with the host's CPU.
#
#   bash bench/cpupaths.sh                # rounds 7
#   ROUNDS=9 bash bench/cpupaths.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-7}
venv=$(bash scripts/venv)
mkdir -p out
go build -o out/vsjax ./bench/vsjax
go build -o out/benchcpu ./bench/cpu
paths=$(go run ./cpu/cpufeat/cmd/cpupaths)
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs; paths: $paths; $(date -u +%F)"
for p in $paths; do
  if [ "$p" = go ] && [ "${CPUPATHS_GO:-0}" != 1 ]; then continue; fi
  echo
  echo "### FERRY_CPU=$p"
  FERRY_CPU=$p FERRY_PYTHON="$venv/bin/python" out/vsjax -rows mlp_step,transformer_step -rounds "$rounds"
  FERRY_CPU=$p out/benchcpu -sections transformer -rounds 3 -steps 5 | grep -i 'transformer'
done
