"""Tiny Hugging Face checkpoints and their outputs, for the tests of nn/hf.

Run with the pinned virtualenv (conformance/requirements.txt: NumPy, SciPy,
safetensors, tokenizers; no torch):

    "$(bash scripts/venv)/bin/python" nn/hf/testdata/gen.py            # write the files
    "$(bash scripts/venv)/bin/python" nn/hf/testdata/gen.py --check    # fail if they differ

It writes, for BERT (BertModel), GPT-2 (GPT2LMHeadModel) and Llama
(LlamaForCausalLM), a model directory with a config.json and the
checkpoint, with Hugging Face's exact tensor names, shapes and layouts
(PyTorch's nn.Linear weights [out, in], GPT-2's Conv1D weights [in, out]
with the fused c_attn, BERT's position_ids buffer), and golden.json: the
inputs and the outputs of an independent float64 NumPy implementation of
each architecture, written from the definitions of transformers'
modeling_bert.py, modeling_gpt2.py and modeling_llama.py:

- bert/: f32, one file. Outputs: last_hidden_state, pooler_output and the
  sentence-transformers embedding (mean over the attention mask, then L2
  normalised).
- gpt2/: f32, one file, "transformer." names, lm_head tied (not stored).
  gpt2-legacy/ is the same weights as the original gpt2 repository lays
  them out: no prefix, the attention's mask buffers stored.
- llama/: f16 (loaded as f32), grouped-query attention (4 heads, 2 KV
  heads), sharded in two files with model.safetensors.index.json.
  Outputs: the final normed hidden states and the logits.

The GPT-2 and Llama goldens also hold "greedy": the tokens a greedy loop
over the float64 forward appends to a fixed prompt batch (GREEDY), for the
tests of nn.Generator's KV-cache decoding.

Other modes:

    gen.py --roundtrip DIR     read the safetensors files Ferry saved into DIR
                               (go test ./nn/hf -run TestSaveRoundTrip -args -hf.save=DIR)
                               with the safetensors package and check their names,
                               dtypes and values against the originals, and their outputs
    gen.py --minilm MODEL OUT  tokenize the sentences below with MODEL's tokenizer.json
                               (tokenizers) and write their all-MiniLM-L6-v2 embeddings,
                               computed in NumPy from MODEL's model.safetensors, to OUT
    gen.py --finetuned DIR     check the model examples/finetune saved into DIR: tokenize
                               the sentences of DIR/embeddings.json with DIR/tokenizer.json,
                               run the NumPy BERT on DIR/model.safetensors (read by the
                               safetensors package) and DIR/config.json, and compare the
                               embeddings and head logits with the ones Ferry wrote
"""

import argparse
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file
from scipy.special import erf

from inputs import BERT_INPUTS, GREEDY, LM_INPUTS

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- the architectures, in float64 ----


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    # LlamaRMSNorm: hidden * rsqrt(mean(hidden²) + eps), then weight *.
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def gelu_erf(x):  # ACT2FN["gelu"]: the exact GELU
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def gelu_new(x):  # ACT2FN["gelu_new"]: the tanh approximation
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def linear(x, w, b=None):  # torch.nn.Linear: x @ W.T + b, W [out, in]
    y = x @ w.T
    return y if b is None else y + b


def conv1d(x, w, b):  # transformers' Conv1D: x @ W + b, W [in, out]
    return x @ w + b


NEG = np.finfo(np.float32).min  # the additive mask value of transformers


def attention(q, k, v, mask_add):
    """q [B, N, T, H], k, v [B, N, S, H], mask_add broadcast to [B, N, T, S]."""
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + mask_add
    return softmax(s) @ v


def heads(x, n):  # [B, T, n*H] → [B, n, T, H]
    B, T, D = x.shape
    return x.reshape(B, T, n, D // n).transpose(0, 2, 1, 3)


def merge(x):  # [B, N, T, H] → [B, T, N*H]
    B, N, T, H = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, N * H)


def bert_forward(w, cfg, ids, types, mask):
    """BertModel: returns last_hidden_state and pooler_output."""
    w = {k: v.astype(np.float64) for k, v in w.items() if not k.endswith("position_ids")}
    eps = cfg["layer_norm_eps"]
    n = cfg["num_attention_heads"]
    T = ids.shape[1]
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][types]
    x = x + w["embeddings.position_embeddings.weight"][np.arange(T)]
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    # get_extended_attention_mask: (1 - mask) * finfo.min over the keys.
    mask_add = (1.0 - mask[:, None, None, :]) * NEG
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = lambda name, h: linear(h, w[p + name + ".weight"], w[p + name + ".bias"])
        q, k, v = (heads(lin("attention.self." + m, x), n) for m in ("query", "key", "value"))
        a = lin("attention.output.dense", merge(attention(q, k, v, mask_add)))
        x = layer_norm(a + x, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
        h = lin("output.dense", gelu_erf(lin("intermediate.dense", x)))
        x = layer_norm(h + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    pooled = np.tanh(linear(x[:, 0], w["pooler.dense.weight"], w["pooler.dense.bias"]))
    return x, pooled


def mean_pool_normalize(h, mask):
    """sentence-transformers' Pooling (mean tokens) and Normalize modules."""
    m = mask[:, :, None].astype(np.float64)
    e = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)


def gpt2_forward(w, cfg, ids, mask):
    """GPT2LMHeadModel: returns the last hidden state (after ln_f) and the logits."""
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v.astype(np.float64) for k, v in w.items()}
    eps = cfg["layer_norm_epsilon"]
    n = cfg["n_head"]
    B, T = ids.shape
    x = w["wte.weight"][ids] + w["wpe.weight"][np.arange(T)]
    causal = np.tril(np.ones((T, T), dtype=bool))
    allowed = causal[None, None] & (mask[:, None, None, :] > 0)
    mask_add = np.where(allowed, 0.0, NEG)
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = conv1d(a, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])
        q, k, v = (heads(t, n) for t in np.split(qkv, 3, axis=-1))
        x = x + conv1d(merge(attention(q, k, v, mask_add)), w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
        m = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = gelu_new(conv1d(m, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]))
        x = x + conv1d(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    return x, x @ w["wte.weight"].T  # lm_head is tied to wte


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def llama_forward(w, cfg, ids, mask):
    """LlamaForCausalLM: returns the last hidden state (after the final norm) and the logits."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    eps = cfg["rms_norm_eps"]
    n, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // n
    B, T = ids.shape
    x = w["model.embed_tokens.weight"][ids]
    # LlamaRotaryEmbedding: inv_freq = 1/θ^(2j/hd); emb = cat(freqs, freqs).
    inv_freq = 1.0 / cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    freqs = np.arange(T)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    causal = np.tril(np.ones((T, T), dtype=bool))
    allowed = causal[None, None] & (mask[:, None, None, :] > 0)
    mask_add = np.where(allowed, 0.0, NEG)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = heads(linear(a, w[p + "self_attn.q_proj.weight"]), n)
        k = heads(linear(a, w[p + "self_attn.k_proj.weight"]), kv)
        v = heads(linear(a, w[p + "self_attn.v_proj.weight"]), kv)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin  # apply_rotary_pos_emb
        k, v = np.repeat(k, n // kv, axis=1), np.repeat(v, n // kv, axis=1)  # repeat_kv
        x = x + linear(merge(attention(q, k, v, mask_add)), w[p + "self_attn.o_proj.weight"])
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = linear(m, w[p + "mlp.gate_proj.weight"])
        up = linear(m, w[p + "mlp.up_proj.weight"])
        silu = gate / (1 + np.exp(-gate))
        x = x + linear(silu * up, w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x, linear(x, w["lm_head.weight"])


# ---- the tiny checkpoints ----

BERT_CONFIG = {
    "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "classifier_dropout": None,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 16, "initializer_range": 0.02,
    "intermediate_size": 32, "layer_norm_eps": 1e-12, "max_position_embeddings": 16, "model_type": "bert",
    "num_attention_heads": 4, "num_hidden_layers": 2, "pad_token_id": 0, "position_embedding_type": "absolute",
    "torch_dtype": "float32", "type_vocab_size": 2, "use_cache": True, "vocab_size": 40,
}

GPT2_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 47,
    "embd_pdrop": 0.1, "eos_token_id": 47, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 16, "n_embd": 16, "n_head": 4, "n_inner": None, "n_layer": 2, "n_positions": 16,
    "reorder_and_upcast_attn": False, "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False,
    "scale_attn_weights": True, "tie_word_embeddings": True, "torch_dtype": "float32", "use_cache": True, "vocab_size": 48,
}

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 48, "max_position_embeddings": 64, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pretraining_tp": 1,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "float16", "use_cache": True, "vocab_size": 64,
}


def bert_weights(rng, c):
    D, F, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    f = lambda *s, std=0.3: (rng.standard_normal(s) * std).astype(np.float32)
    ln = lambda: (1 + f(D, std=0.1), f(D, std=0.1))
    w = {
        "embeddings.word_embeddings.weight": f(c["vocab_size"], D, std=1.0),
        "embeddings.position_embeddings.weight": f(c["max_position_embeddings"], D, std=0.5),
        "embeddings.token_type_embeddings.weight": f(c["type_vocab_size"], D, std=0.5),
        "embeddings.position_ids": np.arange(c["max_position_embeddings"], dtype=np.int64)[None],
        "pooler.dense.weight": f(D, D), "pooler.dense.bias": f(D, std=0.1),
    }
    w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"] = ln()
    for i in range(L):
        p = f"encoder.layer.{i}."
        for name, (o, n) in {"attention.self.query": (D, D), "attention.self.key": (D, D), "attention.self.value": (D, D),
                             "attention.output.dense": (D, D), "intermediate.dense": (F, D), "output.dense": (D, F)}.items():
            w[p + name + ".weight"], w[p + name + ".bias"] = f(o, n), f(o, std=0.1)
        w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"] = ln()
        w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"] = ln()
    return w


def gpt2_weights(rng, c):
    D, L = c["n_embd"], c["n_layer"]
    F = c["n_inner"] or 4 * D
    f = lambda *s, std=0.3: (rng.standard_normal(s) * std).astype(np.float32)
    w = {"transformer.wte.weight": f(c["vocab_size"], D, std=1.0), "transformer.wpe.weight": f(c["n_positions"], D, std=0.5),
         "transformer.ln_f.weight": 1 + f(D, std=0.1), "transformer.ln_f.bias": f(D, std=0.1)}
    for i in range(L):
        p = f"transformer.h.{i}."
        for name, (a, b) in {"attn.c_attn": (D, 3 * D), "attn.c_proj": (D, D), "mlp.c_fc": (D, F), "mlp.c_proj": (F, D)}.items():
            w[p + name + ".weight"], w[p + name + ".bias"] = f(a, b), f(b, std=0.1)
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"], w[p + ln + ".bias"] = 1 + f(D, std=0.1), f(D, std=0.1)
    return w


def llama_weights(rng, c):
    D, F, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    n, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    f = lambda *s, std=0.3: (rng.standard_normal(s) * std).astype(np.float16)
    w = {"model.embed_tokens.weight": f(c["vocab_size"], D, std=1.0), "model.norm.weight": 1 + f(D, std=0.1),
         "lm_head.weight": f(c["vocab_size"], D, std=0.2)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = f(n * hd, D)
        w[p + "self_attn.k_proj.weight"] = f(kv * hd, D)
        w[p + "self_attn.v_proj.weight"] = f(kv * hd, D)
        w[p + "self_attn.o_proj.weight"] = f(D, n * hd)
        w[p + "mlp.gate_proj.weight"] = f(F, D)
        w[p + "mlp.up_proj.weight"] = f(F, D)
        w[p + "mlp.down_proj.weight"] = f(D, F, std=0.2)
        w[p + "input_layernorm.weight"] = 1 + f(D, std=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + f(D, std=0.1)
    return w


# The inputs (right-padded batches, greedy prompts) are inputs.py's; greedy()
# decodes GREEDY's prompts with the float64 forward of the model.


def greedy(forward, w, cfg, prompt, n):
    """A greedy decoding loop over the full forward (no cache), as
    transformers' generate(do_sample=False, max_new_tokens=n) without an eos:
    each step runs the whole sequence and appends the arg max of the last
    position's logits. Returns the new tokens and the smallest gap between
    the largest and second largest logit of any step (how far from a tie)."""
    ids = np.array(prompt)
    gap = np.inf
    for _ in range(n):
        _, logits = forward(w, cfg, ids, np.ones_like(ids))
        last = logits[:, -1]
        top2 = np.sort(last, axis=-1)[:, -2:]
        gap = min(gap, float((top2[:, 1] - top2[:, 0]).min()))
        ids = np.concatenate([ids, last.argmax(-1)[:, None]], axis=1)
    return {"prompt": prompt, "tokens": ids[:, len(prompt[0]):].tolist(), "min_gap": gap}


def flat(a):
    return {"shape": list(a.shape), "data": [float(v) for v in a.ravel()]}


def goldens(name, w, cfg):
    if name == "bert":
        ids, types, mask = (np.array(BERT_INPUTS[k]) for k in ("ids", "types", "mask"))
        h, pooled = bert_forward(w, cfg, ids, types, mask)
        return {"inputs": BERT_INPUTS, "last_hidden_state": flat(h), "pooler_output": flat(pooled),
                "sentence_embedding": flat(mean_pool_normalize(h, mask))}
    ids, mask = np.array(LM_INPUTS["ids"]), np.array(LM_INPUTS["mask"])
    forward = gpt2_forward if name.startswith("gpt2") else llama_forward
    h, logits = forward(w, cfg, ids, mask)
    prompt, n = GREEDY[name]
    return {"inputs": LM_INPUTS, "last_hidden_state": flat(h), "logits": flat(logits),
            "greedy": greedy(forward, w, cfg, prompt, n)}


def build():
    """Returns {relative path: bytes} of every file gen.py writes."""
    out = {}
    rng = np.random.default_rng(20260204)
    models = {"bert": (BERT_CONFIG, bert_weights(rng, BERT_CONFIG)),
              "gpt2": (GPT2_CONFIG, gpt2_weights(rng, GPT2_CONFIG)),
              "llama": (LLAMA_CONFIG, llama_weights(rng, LLAMA_CONFIG))}
    tmp = os.path.join(HERE, ".gen.tmp")

    def st(tensors):
        save_file(tensors, tmp, metadata={"format": "pt"})
        with open(tmp, "rb") as f:
            data = f.read()
        os.remove(tmp)
        return data

    for name, (cfg, w) in models.items():
        out[f"{name}/config.json"] = (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()
        out[f"{name}/golden.json"] = (json.dumps(goldens(name, w, cfg)) + "\n").encode()
        if name == "llama":
            names = sorted(w)
            half = {n: w[n] for n in names if n.startswith("model.layers.0.") or n == "model.embed_tokens.weight"}
            rest = {n: w[n] for n in names if n not in half}
            files = {"model-00001-of-00002.safetensors": half, "model-00002-of-00002.safetensors": rest}
            index = {"metadata": {"total_size": int(sum(v.nbytes for v in w.values()))},
                     "weight_map": {n: f for f, part in files.items() for n in sorted(part)}}
            for f, part in files.items():
                out[f"{name}/{f}"] = st(part)
            out[f"{name}/model.safetensors.index.json"] = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
        else:
            out[f"{name}/model.safetensors"] = st(w)
    # GPT-2 as the original gpt2 repository stores it: no "transformer."
    # prefix, and the attention's mask buffers.
    cfg, w = models["gpt2"]
    legacy = {k[len("transformer."):]: v for k, v in w.items()}
    T = cfg["n_positions"]
    for i in range(cfg["n_layer"]):
        legacy[f"h.{i}.attn.bias"] = np.tril(np.ones((T, T), dtype=np.float32))[None, None]
        legacy[f"h.{i}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    out["gpt2-legacy/config.json"] = out["gpt2/config.json"]
    out["gpt2-legacy/model.safetensors"] = st(legacy)
    return out


def load_model(d):
    """The weights of the model directory d, by name."""
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return load_file(os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    w = {}
    for f in sorted(set(index["weight_map"].values())):
        w.update(load_file(os.path.join(d, f)))
    return w


def roundtrip(saved):
    """Checks the files Ferry saved into saved/<model>.safetensors."""
    from safetensors import safe_open

    bad = 0
    for name in ("bert", "gpt2", "llama"):
        path = os.path.join(saved, name + ".safetensors")
        with safe_open(path, framework="numpy") as f:
            if f.metadata().get("format") != "pt":
                print(f"{path}: metadata format is {f.metadata().get('format')!r}, want 'pt'")
                bad += 1
        got = load_file(path)
        want = load_model(os.path.join(HERE, name))
        # Buffers and tied weights are not parameters of Ferry's models.
        want = {k: v for k, v in want.items() if not k.endswith("position_ids")}
        if set(got) != set(want):
            print(f"{path}: names differ: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")
            bad += 1
            continue
        for k in sorted(want):
            g, wv = got[k], want[k]
            # Ferry loaded Llama's f16 as f32: the values are the same.
            if g.shape != wv.shape or not np.array_equal(g.astype(np.float64), wv.astype(np.float64)):
                print(f"{path}: tensor {k}: {g.dtype}{list(g.shape)} differs from the original {wv.dtype}{list(wv.shape)}")
                bad += 1
        with open(os.path.join(HERE, name, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(HERE, name, "golden.json")) as f:
            gold = json.load(f)
        again = goldens(name, got, cfg)
        key = "pooler_output" if name == "bert" else "logits"
        diff = np.abs(np.array(again[key]["data"]) - np.array(gold[key]["data"])).max()
        if diff > 1e-12:
            print(f"{path}: the outputs of the saved weights differ from the goldens by {diff}")
            bad += 1
        print(f"{name}: {len(got)} tensors read back with safetensors {'OK' if not bad else ''}")
    return bad


SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "The new movie is so great!",
    "A man is playing guitar.",
    "Do you like pizza?",
    "I love pasta with tomato sauce.",
    "Stock markets fell sharply on Tuesday.",
    "Die Katze sitzt draußen.",
    "Quantum computers use qubits instead of bits.",
    "Ferry compiles Go functions over arrays.",
    "",
]


def minilm(model, out):
    """Reference embeddings of SENTENCES by all-MiniLM-L6-v2 in MODEL."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_truncation()
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    encs = tok.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in encs])
    types = np.array([e.type_ids for e in encs])
    mask = np.array([e.attention_mask for e in encs])
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    h, _ = bert_forward(load_file(os.path.join(model, "model.safetensors")), cfg, ids, types, mask)
    emb = mean_pool_normalize(h, mask)
    with open(out, "w") as f:
        json.dump({"sentences": SENTENCES, "ids": ids.tolist(), "types": types.tolist(), "mask": mask.tolist(),
                   "embeddings": flat(emb)}, f)
    print(f"wrote {out}: {len(SENTENCES)} embeddings of {emb.shape[1]} values")


def finetuned(d, tol=1e-5):
    """Checks the fine-tuned model examples/finetune saved into d: its
    embeddings.json against this file's BERT run on the saved weights."""
    from tokenizers import Tokenizer

    with open(os.path.join(d, "embeddings.json")) as f:
        probe = json.load(f)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok.no_truncation()
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    encs = tok.encode_batch(probe["sentences"])
    ids = np.array([e.ids for e in encs])
    types = np.array([e.type_ids for e in encs])
    mask = np.array([e.attention_mask for e in encs])
    bad = 0
    if ids.tolist() != probe["ids"] or mask.tolist() != probe["mask"]:
        print(f"{d}: tokenizers gives ids {ids.tolist()}, Ferry's tokenizer gave {probe['ids']}")
        bad += 1
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    h, _ = bert_forward(load_file(os.path.join(d, "model.safetensors")), cfg, ids, types, mask)
    m = mask[:, :, None].astype(np.float64)
    mean = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    emb = mean_pool_normalize(h, mask)
    head = {k: v.astype(np.float64) for k, v in load_file(os.path.join(d, "head.safetensors")).items()}
    logits = linear(mean, head["W"], head["B"])
    for name, want, got in (("embeddings", emb, probe["embeddings"]), ("logits", logits, probe["logits"])):
        got = np.array(got)
        # Absolute below 1, relative above.
        err = (np.abs(got - want) / np.maximum(np.abs(want), 1)).max()
        ok = got.shape == want.shape and err <= tol
        print(f"{name} of {len(probe['sentences'])} sentences, NumPy float64 vs Ferry: max error {err:.2g} "
              f"({'OK' if ok else f'over {tol}'})")
        bad += not ok
    preds = ", ".join(f"{s!r}: {'positive' if l[1] > l[0] else 'negative'}" for s, l in zip(probe["sentences"], logits))
    print(f"NumPy's predictions: {preds}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed files differ from what gen.py makes")
    ap.add_argument("--roundtrip", metavar="DIR", help="check the files Ferry saved into DIR")
    ap.add_argument("--minilm", nargs=2, metavar=("MODEL", "OUT"), help="reference embeddings of all-MiniLM-L6-v2")
    ap.add_argument("--finetuned", metavar="DIR", help="check the model examples/finetune saved into DIR")
    args = ap.parse_args()
    if args.finetuned:
        sys.exit(1 if finetuned(args.finetuned) else 0)
    if args.roundtrip:
        sys.exit(1 if roundtrip(args.roundtrip) else 0)
    if args.minilm:
        minilm(*args.minilm)
        return
    files = build()
    bad = 0
    for rel, data in sorted(files.items()):
        path = os.path.join(HERE, rel)
        if args.check:
            try:
                with open(path, "rb") as f:
                    old = f.read()
            except FileNotFoundError:
                old = None
            if old != data:
                print(f"{rel}: differs from what gen.py makes (regenerate with gen.py)")
                bad += 1
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    if args.check:
        print(f"{len(files)} files checked, {bad} differ")
        sys.exit(1 if bad else 0)
    print(f"wrote {len(files)} files under {HERE}")


if __name__ == "__main__":
    main()
