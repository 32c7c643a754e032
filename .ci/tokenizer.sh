#!/usr/bin/env bash
# CI check: the tokenizer package's goldens (tokenizer/testdata/golden-*.jsonl.gz)
# are what the pinned Hugging Face tokenizers of conformance/requirements.txt
# gives. Installs the pinned Python tools with scripts/venv, re-encodes the
# corpus with every committed tokenizer.json in memory and fails, naming the
# file and its first differing line, when a golden differs (regenerate them
# with: "$(bash scripts/venv)/bin/python" tokenizer/testdata/gen.py). The
# trained tokenizers are not retrained (training is not deterministic).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/venv)
"$venv/bin/python" tokenizer/testdata/gen.py --check
