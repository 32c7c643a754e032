#!/usr/bin/env bash
# CI: compiles every kernel the CUDA generator makes (the op table on every
# dtype, the traced cases, the examples' MLP and Transformer train steps) with
# the real NVRTC 13 of the pinned nvidia-cuda-nvrtc wheel, for sm_80 and sm_90,
# through the cuda package's own loader. Any compiler error or warning fails,
# and so does a skip (NVRTC not found). No GPU or driver is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "nvrtc: preparing the pinned NVRTC wheel (scripts/venv; installing from PyPI the first time takes about 1.5 min)…"
venv=$(bash scripts/venv)
# The pinned wheel's library, searched first (before any CUDA toolkit).
lib=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.* 2>/dev/null | head -n1 || true)
if [ -z "$lib" ]; then
  echo "nvrtc: no libnvrtc.so.* under $venv/lib/python3*/site-packages/nvidia/*/lib (is nvidia-cuda-nvrtc in conformance/requirements.txt?)"
  exit 1
fi
FERRY_CUDA_LIB_DIR=$(dirname "$lib")
export FERRY_CUDA_LIB_DIR VIRTUAL_ENV=$venv FERRY_REQUIRE_NVRTC=1
echo "nvrtc: $lib"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
echo "nvrtc: building the cuda tests and compiling every generated kernel for sm_80 and sm_90 (go test -run '^TestNVRTC' ./cuda/)…"
go test -count=1 -v -run '^TestNVRTC' ./cuda/ 2>&1 | tee "$log" | grep -v '^=== RUN' || {
  echo "nvrtc: the NVRTC compile tests failed"
  exit 1
}
if grep -q -- '--- SKIP' "$log"; then
  echo "nvrtc: an NVRTC test skipped; NVRTC must be found in $venv"
  exit 1
fi
if ! grep -q -- '--- PASS: TestNVRTCGeneratedKernels' "$log"; then
  echo "nvrtc: TestNVRTCGeneratedKernels did not run"
  exit 1
fi
echo "nvrtc: passed in $(( $(date +%s) - start )) s"
