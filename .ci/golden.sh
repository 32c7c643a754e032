#!/usr/bin/env bash
# CI check: the committed JAX golden files (conformance/testdata) are exactly
# what the pinned JAX gives. Installs the pinned Python tools with
# scripts/venv, regenerates every golden file in memory and fails, naming the
# file, the case and the first differing field, when a committed one differs.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/venv)
"$venv/bin/python" conformance/gen.py --check
