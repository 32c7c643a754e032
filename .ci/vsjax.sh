#!/usr/bin/env bash
# CI check for bench/vsjax: at tiny sizes, every row's Ferry program and its
# JAX twin (bench/jax/bench.py) agree (the losses of three training steps from
# the same initial parameters, or a function's output). Exits non-zero when a
# row disagrees or either side fails. About a minute on 2 cores (JAX compiles).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/venv)
FERRY_PYTHON="$venv/bin/python" go run ./bench/vsjax -tiny -rounds 1 -round-ms 1
