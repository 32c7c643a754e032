#!/usr/bin/env bash
# CI check: the CPU-kernel packages pass on every lower kernel path this host
# can run, forced with FERRY_CPU (the best path already ran in go test ./...):
# on an AVX-512 host avx2 and go, on an AVX2 host go. The AVX-512 generated
# code itself is checked on hosts without AVX-512 by cpu/internal/x86emu's
# interpreter inside go test ./cpu/vmath.
set -euo pipefail
cd "$(dirname "$0")/.."
paths=$(go run ./cpu/cpufeat/cmd/cpupaths)
echo "host paths: $paths"
first=1
for p in $paths; do
  if [ $first = 1 ]; then first=0; continue; fi
  echo "== FERRY_CPU=$p"
  # -count=1: FERRY_CPU is read at package start, which go test's cache
  # does not see.
  FERRY_CPU=$p FERRY_RANDOM_PROGRAMS=300 go test -count=1 \
    ./cpu/cpufeat ./cpu/vmath ./cpu/cpuexec ./cpu/gemm \
    ./internal/eval ./internal/testkit/difftest ./conformance ./cpu
done
