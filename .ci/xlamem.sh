#!/usr/bin/env bash
# CI: XLA's memory analysis of the conformance/memory programs is what the
# committed testdata/xla_memory.json says (regenerated with the pinned JAX),
# and Ferry's analysis compares as conformance/memory's test requires.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/venv)
"$venv/bin/python" conformance/memory/xla_memory.py --check
go test -count=1 ./conformance/memory
