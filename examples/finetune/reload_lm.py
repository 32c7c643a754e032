"""Reloads a decoder examples/finetune fine-tuned with transformers and compares its logits with Ferry's.

    go run ./examples/finetune -model nn/hf/testdata/gpt2 -out DIR
    .venv-transformers/bin/python examples/finetune/reload_lm.py DIR

DIR holds what examples/finetune saved from a GPT-2 or Llama checkpoint:
model.safetensors under the PyTorch names of GPT2LMHeadModel or
LlamaForCausalLM (through hf.Save), config.json, and logits.json (held-out
sequences of the task, their ids and attention masks, and Ferry's logits of
the saved model). This loads DIR with transformers' own Flax model,
FlaxGPT2LMHeadModel or FlaxLlamaForCausalLM (by config.json's model_type),
through from_pretrained, as nn/hf/testdata/gen_transformers.py loads the
tiny checkpoints: it checks that every Flax parameter equals the saved
tensor of its name and that every saved tensor is a parameter (so none was
left at its random initialization or dropped), runs the model in float64
(jax_enable_x64) on the sequences with their attention masks, and compares
transformers' logits with Ferry's at every real token (padded positions
are not compared) within 1e-5: absolute below magnitude 1, relative above.
Each difference names the sequence, position and token. It writes nothing.

Run it in the virtualenv of nn/hf/testdata/requirements-transformers.txt
(transformers 4.57 with jax and flax, no torch); .ci/hf.sh does.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "nn", "hf", "testdata"))

import gen_transformers as gt  # noqa: E402

TOL = gt.RELOAD_TOL
FLAX = {"gpt2": "FlaxGPT2LMHeadModel", "llama": "FlaxLlamaForCausalLM"}


def reload(d, tol=TOL):
    """Returns the number of differences between transformers' logits of
    d/logits.json's sequences and Ferry's."""
    gt.flax_setup()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import transformers as tf

    with open(os.path.join(d, "config.json")) as f:
        kind = json.load(f).get("model_type")
    if kind not in FLAX:
        raise SystemExit(f"{d}/config.json: model_type {kind!r}, want one of {sorted(FLAX)}")
    with open(os.path.join(d, "logits.json")) as f:
        probe = json.load(f)
    model, params = gt.load_dir(d, getattr(tf, FLAX[kind]), d, jnp.float64)
    ids = jnp.asarray(probe["ids"], dtype=jnp.int32)
    mask = np.asarray(probe["mask"])
    want = np.asarray(model(ids, attention_mask=jnp.asarray(mask, dtype=jnp.int32), params=params).logits,
                      dtype=np.float64)
    got = np.asarray(probe["logits"], dtype=np.float64)
    if got.shape != want.shape:
        raise SystemExit(f"{d}/logits.json: Ferry's logits are {list(got.shape)}, transformers' {list(want.shape)}")
    err = np.abs(got - want) / np.maximum(np.abs(want), 1)
    err[mask == 0] = 0
    out = []
    for i, text in enumerate(probe["texts"]):
        over = np.argwhere(~(err[i] <= tol))
        if len(over):
            t, v = over[0]
            out.append(f"logits of {text} at position {t}, token {v}: {got[i, t, v]!r} in Ferry's logits.json, "
                       f"{want[i, t, v]!r} by transformers (error {err[i, t, v]:.3g} over {tol}; "
                       f"{len(over)} of {int(mask[i].sum()) * err.shape[2]} elements over)")
    real = int(mask.sum())
    print(f"logits of {len(probe['texts'])} sequences ({real} real tokens × {err.shape[2]}), "
          f"transformers' {type(model).__name__} (float64) vs Ferry: max error {err.max():.2g}")
    for line in out:
        print(line)
    n = len(jax.tree_util.tree_leaves(params))
    print(f"{d}: {n} Flax parameters (each equal to its saved tensor) reloaded by transformers {tf.__version__}, "
          f"{'logits equal within ' + str(tol) if not out else str(len(out)) + ' differences'}")
    return len(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="a directory examples/finetune saved a decoder into")
    args = ap.parse_args()
    bad = sum(reload(d) for d in args.dirs)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
