"""Hugging Face transformers' own outputs for the tiny checkpoints of nn/hf/testdata.

gen.py checks Ferry's BERT, GPT-2 and Llama against NumPy forwards written
from transformers' definitions. This file runs transformers itself: its
Flax models (FlaxBertModel, FlaxGPT2LMHeadModel, FlaxLlamaForCausalLM) on
JAX, on the CPU, without torch, loading the same model directories
(bert/, gpt2/, llama/: config.json and safetensors under PyTorch's names,
made by gen.py) with from_pretrained, and writes what they give to
transformers/<model>.json, which the Go tests of nn/hf read
(transformers_test.go):

- outputs: BERT's last_hidden_state and pooler_output; the GPT-2 and
  Llama logits (right-padded batches with an attention mask);
- loss and grads: the value of a simple loss of those outputs (BERT: the
  squared pooled output and the squared hidden states over the mask; GPT-2
  and Llama: the next-token cross entropy over the mask) and its gradient,
  by jax.grad through the Flax model, with respect to a few weights, named
  and laid out as in the checkpoint (PyTorch's names: a Flax kernel is the
  transposed weight);
- greedy: the tokens transformers' Flax generate (do_sample=False, with
  its KV cache) appends to a prompt batch, with the smallest gap between
  the two largest logits of any step (how far from a tie);
- greedy_padded: the same for a batch of prompts of different lengths,
  left-padded (pad id 0) with an attention mask, as transformers pads a
  batch for generate.

transformers/charlm.json holds the greedy and greedy_padded continuations
(by FlaxGPT2LMHeadModel) of text prompts for charlm/, the character-level
language model of examples/transformer trained briefly and saved as a
Hugging Face GPT-2 (its vocab.json maps token ids to characters); its Go
test (examples/transformer) compares Ferry's greedy tokens with them. It
was made with:

    go run ./examples/transformer -data nn/hf/testdata/charlm/train.txt -steps 150 -batch 8 \
        -seq 32 -layers 2 -d 32 -heads 2 -lr 1e-2 -seed 1 -eval-batches 2 -quiet -hf nn/hf/testdata/charlm

The Flax models run in float64 (jax_enable_x64, dtype=float64, the
parameters converted to float64), so the goldens hold transformers'
arithmetic with float64 rounding, except where transformers' Flax code
fixes float32: Llama's rotary table (sin and cos of float32 angles) and
the mean square of its RMSNorm.

How the checkpoints load: transformers 4.57's from_pretrained reads a
single-file safetensors checkpoint whose metadata says format "pt" through
modeling_flax_pytorch_utils (safe_open with framework="flax", then its
PyTorch-to-Flax renaming and transposing), which needs no torch; a sharded
safetensors checkpoint it refuses, so Llama's two shards are merged into
one temporary model.safetensors first. This file then checks that every
Flax parameter equals the checkpoint tensor of its PyTorch name (so none
was left at its random initialization) before running anything.

Run with the virtualenv of requirements-transformers.txt (transformers
4.57, the last release with the Flax models, and the jax, jaxlib and flax
it asks for; no torch):

    venv=$(FERRY_VENV="${FERRY_VENV:-$PWD/.venv}-transformers" bash scripts/venv nn/hf/testdata/requirements-transformers.txt)
    "$venv/bin/python" nn/hf/testdata/gen_transformers.py           # write the goldens and the stamp
    "$venv/bin/python" nn/hf/testdata/gen_transformers.py --check   # regenerate in memory, compare
    python3 nn/hf/testdata/gen_transformers.py --stamp              # only the stamp (standard library)
    "$venv/bin/python" nn/hf/testdata/gen_transformers.py --reload DIR  # a fine-tuned model, below

transformers/stamp.json holds the SHA-256 of this file, of the pinned
requirements and of every checkpoint file it reads: --stamp fails when any
of them changed since the goldens were written, without importing JAX.
--check compares numbers within 1e-9 (relative above magnitude 1; XLA's
last bits may depend on the CPU) and tokens exactly, naming the file, the
entry and the element of each difference.

--reload DIR checks the fine-tuned encoder examples/finetune saved into
DIR (model.safetensors under BertModel's PyTorch names, config.json,
tokenizer.json, head.safetensors and embeddings.json, Ferry's outputs):
FlaxBertModel.from_pretrained loads DIR as it loads testdata/bert, every
Flax parameter is checked against the saved tensor of its name, the
sentences of embeddings.json are tokenized by the pinned tokenizers (the
ids and masks must be Ferry's), and the mean-pooled, L2-normalised
embeddings of transformers' float64 last_hidden_state, and the head's
logits on the mean, must equal Ferry's within 1e-5 (absolute below
magnitude 1, relative above); each difference names the sentence and the
element. It writes nothing and needs no stamp.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "transformers")
PINS = "requirements-transformers.txt"
MODELS = ("bert", "gpt2", "llama")
CHARLM = "charlm"
# charlm's prompts, as text: one length for greedy, different lengths for
# greedy_padded; and the number of new tokens (within its 32 positions).
CHARLM_GREEDY = (["The quick", "A stitch ", "Fortune f"], 20)
CHARLM_PADDED = (["The", "A journey of", "When in d"], 18)
CHECK_TOL = 1e-9
RELOAD_TOL = 1e-5

# The inputs are gen.py's, from inputs.py: right-padded batches and the greedy
# prompt batches with their numbers of new tokens.
from inputs import BERT_INPUTS, GREEDY, GREEDY_PADDED, LM_INPUTS  # noqa: E402

# The weights whose gradients are written, by their checkpoint names: an
# embedding (GPT-2's is tied to the LM head, so its gradient sums both
# uses), a fused or grouped projection, biases and norm scales.
GRADS = {
    "bert": ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
             "encoder.layer.0.attention.self.query.weight", "encoder.layer.1.intermediate.dense.bias",
             "encoder.layer.1.output.LayerNorm.weight", "pooler.dense.weight"],
    "gpt2": ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
             "transformer.h.1.mlp.c_fc.bias", "transformer.h.1.ln_2.weight", "transformer.ln_f.bias"],
    "llama": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
              "model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.gate_proj.weight",
              "model.layers.1.input_layernorm.weight", "model.norm.weight", "lm_head.weight"],
}

# Checkpoint tensors that are not parameters of the Flax models.
BUFFERS = ("embeddings.position_ids",)


# ---- the stamp: standard library only ----


def stamp_files():
    """The files the goldens depend on, relative to HERE: this file, the
    inputs, the pins, and each model directory's config and checkpoint (not gen.py's
    goldens beside them)."""
    files = [os.path.basename(__file__), "inputs.py", PINS]
    for m in MODELS + (CHARLM,):
        for f in sorted(os.listdir(os.path.join(HERE, m))):
            if f == "config.json" or f.endswith((".safetensors", ".safetensors.index.json")):
                files.append(f"{m}/{f}")
    return files


def stamp():
    """The stamp of the current inputs: {"files": {path: sha256}}."""
    out = {}
    for rel in stamp_files():
        with open(os.path.join(HERE, rel), "rb") as f:
            out[rel] = hashlib.sha256(f.read()).hexdigest()
    return {"files": out}


def stamp_bytes():
    return (json.dumps(stamp(), indent=2, sort_keys=True) + "\n").encode()


def check_stamp():
    """Reports whether transformers/stamp.json matches the current inputs."""
    path = os.path.join(OUT, "stamp.json")
    try:
        with open(path) as f:
            old = json.load(f)["files"]
    except (OSError, ValueError, KeyError) as e:
        print(f"{path}: {e}")
        return False
    new = stamp()["files"]
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    for k in changed:
        print(f"stamp: {k} changed since the goldens were written")
    return not changed


# ---- transformers' Flax models ----


def flax_setup():
    """Imports JAX with float64 enabled, refusing a torch in the virtualenv (the
    point is to run transformers' Flax path without it)."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        sys.exit("gen_transformers.py: torch is importable here; run it in the virtualenv of "
                 f"{PINS}, which has none")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")


def read_checkpoint(d):
    """The tensors of model directory d (one file or a sharded set), by name."""
    from safetensors.numpy import load_file

    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return load_file(single)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    w = {}
    for f in sorted(set(index["weight_map"].values())):
        w.update(load_file(os.path.join(d, f)))
    return w


def pt_name(path):
    """The PyTorch name of a Flax parameter path, and whether the Flax
    array is the transposed tensor (a Dense or Conv1D kernel)."""
    parts = [str(getattr(p, "key", p)) for p in path]
    last = parts[-1]
    if last in ("kernel", "scale", "embedding"):
        parts[-1] = "weight"
    return ".".join(parts), last == "kernel"


def check_loaded(name, params, w):
    """Every Flax parameter equals the checkpoint tensor of its PyTorch
    name, and every checkpoint tensor but the buffers is one."""
    import jax
    import numpy as np

    used = set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        key, transpose = pt_name(path)
        if key not in w:
            raise SystemExit(f"{name}: Flax parameter {key} has no checkpoint tensor")
        want = w[key].astype(np.float64)
        got = np.asarray(leaf, dtype=np.float64)
        if transpose:
            got = got.T
        if got.shape != want.shape or not np.array_equal(got, want):
            raise SystemExit(f"{name}: Flax parameter {key} differs from the checkpoint's")
        used.add(key)
    left = sorted(k for k in w if k not in used and not k.endswith(BUFFERS))
    if left:
        raise SystemExit(f"{name}: checkpoint tensors {left} are not parameters of the Flax model")


def load(name, dtype):
    """transformers' Flax model of testdata/<name> computing in dtype, and
    its parameters converted to dtype."""
    import transformers as tf

    cls = {"bert": tf.FlaxBertModel, "gpt2": tf.FlaxGPT2LMHeadModel, "llama": tf.FlaxLlamaForCausalLM,
           CHARLM: tf.FlaxGPT2LMHeadModel}[name]
    return load_dir(name, cls, os.path.join(HERE, name), dtype)


def load_dir(name, cls, src, dtype):
    """cls.from_pretrained of model directory src computing in dtype, and
    its parameters converted to dtype, checked against the checkpoint."""
    import jax
    import jax.numpy as jnp

    w = read_checkpoint(src)
    with tempfile.TemporaryDirectory() as tmp:
        d = src
        if not os.path.exists(os.path.join(src, "model.safetensors")):
            # from_pretrained refuses sharded safetensors: merge the shards.
            from safetensors.numpy import save_file

            d = tmp
            shutil.copy(os.path.join(src, "config.json"), tmp)
            save_file(w, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        model = cls.from_pretrained(d, dtype=dtype)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), model.params)
    check_loaded(name, params, w)
    return model, params


def flat(a):
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    return {"shape": list(a.shape), "data": [float(v) for v in a.ravel()]}


def bert_loss(model, ids, types, mask):
    """BERT's outputs and loss(params): Σ pooled² / B + Σ_mask Σ_d h² / Σ mask."""

    def run(params):
        out = model(ids, attention_mask=mask, token_type_ids=types, params=params)
        return out.last_hidden_state, out.pooler_output

    def loss(params):
        h, pooled = run(params)
        m = mask.astype(h.dtype)
        return (pooled**2).sum() / ids.shape[0] + ((h**2).sum(-1) * m).sum() / m.sum()

    return run, loss


def lm_loss(model, ids, mask):
    """A causal LM's logits and loss(params): the mean next-token cross
    entropy over the positions whose target is not padding."""
    import jax
    import jax.numpy as jnp

    def run(params):
        return model(ids, attention_mask=mask, params=params).logits

    def loss(params):
        logp = jax.nn.log_softmax(run(params)[:, :-1], axis=-1)
        nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
        m = mask[:, 1:].astype(logp.dtype)
        return (nll * m).sum() / m.sum()

    return run, loss


def grads_by_name(name, g):
    """The gradients of GRADS[name], in the checkpoint's names and layouts."""
    import jax

    by = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(g)[0]:
        key, transpose = pt_name(path)
        if key in GRADS[name]:
            by[key] = flat(leaf.T if transpose else leaf)
    missing = [k for k in GRADS[name] if k not in by]
    if missing:
        raise SystemExit(f"{name}: no Flax parameter is {missing}")
    return {k: by[k] for k in GRADS[name]}


def greedy(name, prompt, n, forward):
    """transformers' Flax generate, greedy, n new tokens (no early stop: the
    eos id is the vocabulary size, which no token has), and the smallest
    top-2 logit gap of the steps. generate runs as transformers runs it, in
    float32 (its cache indexing breaks under jax_enable_x64); forward, the
    float64 model's logits of a batch, checks that each token is the arg
    max of its step's logits and gives the gaps."""
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import disable_x64

    with disable_x64():
        model, params = load(name, jnp.float32)
        seq = model.generate(jnp.asarray(prompt, dtype=jnp.int32), params=params, max_new_tokens=n,
                             do_sample=False, eos_token_id=model.config.vocab_size, pad_token_id=0).sequences
        seq = np.asarray(seq)
    k = len(prompt[0])
    logits = np.asarray(forward(jnp.asarray(seq)))[:, k - 1:-1]
    if not np.array_equal(logits.argmax(-1), seq[:, k:]):
        raise SystemExit(f"{name}: generate's tokens are not the arg max of the float64 forward's logits")
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return {"prompt": prompt, "tokens": seq[:, k:].tolist(), "min_gap": float((top2[..., 1] - top2[..., 0]).min())}


def greedy_padded(name, prompts, n, forward):
    """transformers' Flax generate, greedy, n new tokens, of prompts of
    different lengths in one batch: left-padded with id 0 and an attention
    mask (generate derives the positions from the mask). Each row's tokens
    must be the arg max of the float64 forward of that row alone, which
    gives the smallest top-2 logit gap."""
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import disable_x64

    k = max(len(p) for p in prompts)
    ids = [[0] * (k - len(p)) + p for p in prompts]
    mask = [[0] * (k - len(p)) + [1] * len(p) for p in prompts]
    with disable_x64():
        model, params = load(name, jnp.float32)
        seq = model.generate(jnp.asarray(ids, dtype=jnp.int32), attention_mask=jnp.asarray(mask, dtype=jnp.int32),
                             params=params, max_new_tokens=n, do_sample=False,
                             eos_token_id=model.config.vocab_size, pad_token_id=0).sequences
        tokens = np.asarray(seq)[:, k:]
    gap = float("inf")
    for p, row in zip(prompts, tokens):
        full = np.asarray(p + row.tolist())[None]
        logits = np.asarray(forward(jnp.asarray(full)))[0, len(p) - 1:-1]
        if not np.array_equal(logits.argmax(-1), row):
            raise SystemExit(f"{name}: generate's tokens of the padded prompt {p} are not the arg max of the "
                             "float64 forward of the prompt alone")
        top2 = np.sort(logits, axis=-1)[..., -2:]
        gap = min(gap, float((top2[..., 1] - top2[..., 0]).min()))
    return {"prompts": prompts, "tokens": tokens.tolist(), "min_gap": gap}


def golden(name):
    """The golden of testdata/<name> as a JSON-able dict."""
    import flax
    import jax
    import jax.numpy as jnp
    import transformers

    model, params = load(name, jnp.float64)
    if name == "bert":
        inputs = BERT_INPUTS
        ids, types, mask = (jnp.asarray(inputs[k], dtype=jnp.int32) for k in ("ids", "types", "mask"))
        run, loss = bert_loss(model, ids, types, mask)
        h, pooled = run(params)
        outputs = {"last_hidden_state": flat(h), "pooler_output": flat(pooled)}
    else:
        inputs = LM_INPUTS
        ids, mask = (jnp.asarray(inputs[k], dtype=jnp.int32) for k in ("ids", "mask"))
        run, loss = lm_loss(model, ids, mask)
        outputs = {"logits": flat(run(params))}
    value, g = jax.value_and_grad(loss)(params)
    out = {
        "model": type(model).__name__, "transformers": transformers.__version__, "flax": flax.__version__,
        "jax": jax.__version__, "dtype": "float64", "inputs": inputs, "outputs": outputs,
        "loss": {"value": float(value), "grads": grads_by_name(name, g)},
    }
    if name in GREEDY:
        out["greedy"] = greedy(name, *GREEDY[name], lambda seq: model(seq, params=params).logits)
    if name in GREEDY_PADDED:
        out["greedy_padded"] = greedy_padded(name, *GREEDY_PADDED[name], lambda seq: model(seq, params=params).logits)
    return out


def charlm_golden():
    """transformers' greedy continuations of charlm's text prompts."""
    import flax
    import jax
    import jax.numpy as jnp
    import transformers

    with open(os.path.join(HERE, CHARLM, "vocab.json")) as f:
        ids = {c: i for i, c in enumerate(json.load(f))}
    enc = lambda texts: [[ids[c] for c in t] for t in texts]  # noqa: E731
    model, params = load(CHARLM, jnp.float64)
    forward = lambda seq: model(seq, params=params).logits  # noqa: E731
    (g, n), (p, m) = CHARLM_GREEDY, CHARLM_PADDED
    return {
        "model": type(model).__name__, "transformers": transformers.__version__, "flax": flax.__version__,
        "jax": jax.__version__, "texts": g, "padded_texts": p,
        "greedy": greedy(CHARLM, enc(g), n, forward), "greedy_padded": greedy_padded(CHARLM, enc(p), m, forward),
    }


def build():
    """{path relative to HERE: bytes} of every file this writes."""
    flax_setup()
    files = {f"transformers/{m}.json": (json.dumps(golden(m)) + "\n").encode() for m in MODELS}
    files[f"transformers/{CHARLM}.json"] = (json.dumps(charlm_golden()) + "\n").encode()
    files["transformers/stamp.json"] = stamp_bytes()
    return files


def diff(where, got, want, out):
    """Appends to out the differences of two decoded goldens."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                out.append(f"{where}.{k}: {'missing' if k not in got else 'not in the committed file'}")
            else:
                diff(f"{where}.{k}", got[k], want[k], out)
    elif isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            out.append(f"{where}: {len(got)} elements, the committed file has {len(want)}")
            return
        for i, (a, b) in enumerate(zip(got, want)):
            n = len(out)
            diff(f"{where}[{i}]", a, b, out)
            if len(out) - n and isinstance(b, float):
                break  # one element of a tensor is enough
    elif isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if not abs(got - want) <= CHECK_TOL * max(1.0, abs(want)):
            out.append(f"{where}: {got!r}, the committed file has {want!r} (tolerance {CHECK_TOL}, relative above 1)")
    elif got != want:
        out.append(f"{where}: {got!r}, the committed file has {want!r}")


def check(files):
    bad = 0
    for rel, data in sorted(files.items()):
        path = os.path.join(HERE, rel)
        try:
            with open(path, "rb") as f:
                old = f.read()
        except FileNotFoundError:
            print(f"{rel}: missing (regenerate with gen_transformers.py)")
            bad += 1
            continue
        if rel.endswith("stamp.json"):
            if old != data:
                print(f"{rel}: the goldens' inputs changed since it was written (regenerate with gen_transformers.py)")
                bad += 1
            continue
        out = []
        diff(rel, json.loads(data), json.loads(old), out)
        for line in out:
            print(line)
        bad += bool(out)
    print(f"{len(files)} files checked, {bad} differ")
    return bad


# ---- a fine-tuned model examples/finetune saved ----


def tokenize(d, sentences):
    """The pinned tokenizers' ids, token types and attention masks of
    sentences by d/tokenizer.json, right-padded with [PAD] to the longest,
    as Ferry's tokenizer pads them."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok.no_truncation()
    pad = tok.token_to_id("[PAD]")
    if pad is None:
        raise SystemExit(f"{d}/tokenizer.json: no [PAD] token")
    tok.enable_padding(pad_id=pad, pad_token="[PAD]")
    encs = tok.encode_batch(sentences)
    return tuple(np.array([getattr(e, k) for e in encs]) for k in ("ids", "type_ids", "attention_mask"))


def compare(what, sentences, got, want, tol, out):
    """Appends to out, for each sentence, the first element of got (Ferry's)
    whose error against want (transformers') is over tol: absolute below
    magnitude 1, relative above. Returns the largest error."""
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        out.append(f"{what}: Ferry's are {list(got.shape)}, transformers' {list(want.shape)}")
        return float("inf")
    err = np.abs(got - want) / np.maximum(np.abs(want), 1)
    for i, s in enumerate(sentences):
        over = np.flatnonzero(~(err[i] <= tol))
        if len(over):
            j = over[0]
            out.append(f"{what} of {s!r}: element {j} is {got[i, j]!r} in Ferry's embeddings.json, "
                       f"{want[i, j]!r} by transformers (error {err[i, j]:.3g} over {tol}; "
                       f"{len(over)} of {err.shape[1]} elements over)")
    return float(err.max()) if err.size else 0.0


def reload(d, tol=RELOAD_TOL):
    """Reloads the fine-tuned encoder examples/finetune saved into d with
    transformers' FlaxBertModel.from_pretrained and compares the embeddings
    and head logits of d/embeddings.json with transformers'. Returns the
    number of differences."""
    flax_setup()
    import jax.numpy as jnp
    import numpy as np
    import transformers as tf
    from safetensors.numpy import load_file

    with open(os.path.join(d, "embeddings.json")) as f:
        probe = json.load(f)
    sentences = probe["sentences"]
    ids, types, mask = tokenize(d, sentences)
    out = []
    for i, s in enumerate(sentences):
        if ids[i].tolist() != probe["ids"][i] or mask[i].tolist() != probe["mask"][i]:
            out.append(f"tokens of {s!r}: tokenizers gives ids {ids[i].tolist()} and mask {mask[i].tolist()}, "
                       f"Ferry's tokenizer gave {probe['ids'][i]} and {probe['mask'][i]}")
    model, params = load_dir(d, tf.FlaxBertModel, d, jnp.float64)
    h = model(jnp.asarray(ids, dtype=jnp.int32), attention_mask=jnp.asarray(mask, dtype=jnp.int32),
              token_type_ids=jnp.asarray(types, dtype=jnp.int32), params=params).last_hidden_state
    h = np.asarray(h, dtype=np.float64)
    # sentence-transformers' mean pooling over the real tokens, then Normalize.
    m = mask[:, :, None].astype(np.float64)
    mean = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    emb = mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    # The head is a PyTorch-layout linear layer on the mean: W [2, D], B [2].
    head = {k: v.astype(np.float64) for k, v in load_file(os.path.join(d, "head.safetensors")).items()}
    if sorted(head) != ["B", "W"] or head["W"].shape[1:] != (h.shape[-1],):
        raise SystemExit(f"{d}/head.safetensors: want W [out, {h.shape[-1]}] and B [out], have "
                         + ", ".join(f"{k} {list(v.shape)}" for k, v in sorted(head.items())))
    logits = mean @ head["W"].T + head["B"]
    for what, want in (("embeddings", emb), ("logits", logits)):
        err = compare(what, sentences, probe[what], want, tol, out)
        print(f"{what} of {len(sentences)} sentences, transformers' {type(model).__name__} (float64) vs Ferry: "
              f"max error {err:.2g}")
    for line in out:
        print(line)
    print(f"{d}: reloaded by transformers {tf.__version__}, "
          f"{'outputs equal within ' + str(tol) if not out else str(len(out)) + ' differences'}")
    return len(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate in memory and compare with the committed files")
    ap.add_argument("--stamp", action="store_true", help="only check the stamp of the inputs (no JAX)")
    ap.add_argument("--reload", metavar="DIR",
                    help="reload the fine-tuned model examples/finetune saved into DIR and compare its outputs")
    args = ap.parse_args()
    if args.reload:
        sys.exit(1 if reload(args.reload) else 0)
    if args.stamp:
        ok = check_stamp()
        print(f"stamp: {'the goldens are stamped with the current inputs' if ok else 'stale'}")
        sys.exit(0 if ok else 1)
    files = build()
    if args.check:
        sys.exit(1 if check(files) else 0)
    os.makedirs(OUT, exist_ok=True)
    for rel, data in sorted(files.items()):
        with open(os.path.join(HERE, rel), "wb") as f:
            f.write(data)
    print(f"wrote {len(files)} files under {OUT}")


if __name__ == "__main__":
    main()
