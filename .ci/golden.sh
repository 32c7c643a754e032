#!/usr/bin/env bash
# CI check: the committed JAX golden files (conformance/testdata) are what the
# pinned JAX gives on this CPU: bit for bit where XLA is exact, within the
# per-op ulp tolerances of conformance/gen.py where XLA's last bits depend on
# the CPU (AVX2 against AVX-512). Installs the pinned Python tools with
# scripts/venv, regenerates every golden file in memory and fails, naming the
# file, case, result, element, ulp distance and tolerance of every difference
# beyond them.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/venv)
"$venv/bin/python" conformance/gen.py --check
