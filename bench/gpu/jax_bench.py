#!/usr/bin/env python3
"""JAX side of bench/gpu (see README.md): the same programs as main.go.

    python3 jax_bench.py --case scan|scan_offload|optimizer|transformer [--dim 7168] [--steps 10] [--warmup 2]

Prints one JSON line: median step time after the warm-up steps (wall time to
block_until_ready), compiled.memory_analysis() and the device's
peak_bytes_in_use.
"""
import argparse, json, statistics, time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name


def scan_model(offload):
    def loss(ws, x):
        w1, w2 = ws
        def layer(x, w):
            if offload:
                x = checkpoint_name(x, "x")
            return (x @ w[0]) @ w[1], None
        if offload:
            pol = jax.checkpoint_policies.save_and_offload_only_these_names(
                names_which_can_be_saved=[], names_which_can_be_offloaded=["x"],
                offload_src="device", offload_dst="pinned_host")
            layer = jax.checkpoint(layer, policy=pol)
        x, _ = jax.lax.scan(layer, x, (w1, w2))
        return jnp.sum(x)
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (256, 256), jnp.float32) * 0.02
    w1 = jax.random.normal(k[1], (10, 256, 1024), jnp.float32) * 0.02
    w2 = jax.random.normal(k[2], (10, 1024, 256), jnp.float32) * 0.02
    f = jax.jit(lambda w1, w2, x: jax.grad(loss)((w1, w2), x))
    return f, (w1, w2, x), None


def optimizer_model(dim):
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1))
    def loss(ws, x):
        h = x
        for w in ws:
            h = jax.nn.gelu(h @ w, approximate=True)
        return jnp.mean((h - x) ** 2) + 0.001 * sum(jnp.sum(w * w) for w in ws)
    def step(ws, state, x):
        g = jax.grad(loss)(ws, x)
        upd, state = opt.update(g, state, ws)
        return optax.apply_updates(ws, upd), state
    k = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(k[0], (dim, dim), jnp.float32) * 0.02
    ws = [jax.random.normal(k[i], (dim, dim), jnp.float32) * 0.02 for i in range(1, 5)]
    state = opt.init(ws)
    f = jax.jit(step, donate_argnums=(0, 1))
    return f, (ws, state, x), lambda out, args: (out[0], out[1], args[2])


# The Transformer step of README.md, the same as main.go's transformerConfig
# and model (examples/transformer's Model: tied token embedding, learned
# positions, pre-norm blocks with bias-free attention and a 4·d GELU MLP with
# biases, LayerNorm eps 1e-6 with scale and bias, final LayerNorm), trained
# with chain(clip_by_global_norm(1), adamw(3e-3, 0.9, 0.95, 1e-8, 0.01)),
# params and optimizer state donated.
TF = dict(vocab=256, d=256, heads=4, layers=4, seq=128, batch=16, lr=3e-3)


def transformer_model():
    vocab, d, heads, layers, seq, batch = (TF[k] for k in ("vocab", "d", "heads", "layers", "seq", "batch"))
    dh = d // heads
    def lecun(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / np.sqrt(shape[0])
    def init(k):
        ks = jax.random.split(k, 2 + 6 * layers)
        ln = lambda: {"scale": jnp.ones((d,)), "bias": jnp.zeros((d,))}
        p = {"tok": jax.random.normal(ks[0], (vocab, d)) / np.sqrt(d),
             "pos": jax.random.normal(ks[1], (seq, d)) * 0.02, "norm": ln(), "blocks": []}
        for i in range(layers):
            kk = ks[2 + 6 * i: 8 + 6 * i]
            p["blocks"].append({
                "ln1": ln(), "ln2": ln(),
                "wq": lecun(kk[0], (d, d)), "wk": lecun(kk[1], (d, d)), "wv": lecun(kk[2], (d, d)), "wo": lecun(kk[3], (d, d)),
                "w1": lecun(kk[4], (d, 4 * d)), "b1": jnp.zeros((4 * d,)),
                "w2": lecun(kk[5], (4 * d, d)), "b2": jnp.zeros((d,))})
        # Stacked on a layer axis and scanned, as nn.Stack does.
        p["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *p["blocks"])
        return p
    def ln(x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-6) * p["scale"] + p["bias"]
    mask = jnp.tril(jnp.ones((seq, seq), bool))
    def block(x, b):
        h = ln(x, b["ln1"])
        sh = lambda w: (h @ w).reshape(batch, seq, heads, dh)
        q, k, v = sh(b["wq"]), sh(b["wk"]), sh(b["wv"])
        a = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
        a = jax.nn.softmax(jnp.where(mask, a, -1e30), -1)
        o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(batch, seq, d)
        x = x + o @ b["wo"]
        h = ln(x, b["ln2"])
        return x + jax.nn.gelu(h @ b["w1"] + b["b1"], approximate=True) @ b["w2"] + b["b2"], None
    def loss(p, x, y):
        h = p["tok"][x] + p["pos"]
        h, _ = jax.lax.scan(block, h, p["blocks"])
        logits = ln(h, p["norm"]) @ p["tok"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(TF["lr"], b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01))
    p = init(jax.random.key(0))
    st = opt.init(p)
    def step(p, st, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        u, st = opt.update(g, st, p)
        return optax.apply_updates(p, u), st, l
    tok = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, vocab)
    x, y = tok[:, :-1], tok[:, 1:]
    f = jax.jit(step, donate_argnums=(0, 1))
    return f, (p, st, x, y), lambda out, args: (out[0], out[1], args[2], args[3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="scan")
    ap.add_argument("--dim", type=int, default=7168)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    if a.case in ("scan", "scan_offload"):
        f, args, nxt = scan_model(a.case == "scan_offload")
    elif a.case == "optimizer":
        f, args, nxt = optimizer_model(a.dim)
    elif a.case == "transformer":
        f, args, nxt = transformer_model()
    else:
        raise SystemExit(f"unknown case {a.case}")
    ma = f.lower(*args).compile().memory_analysis()
    times = []
    for s in range(a.steps + a.warmup):
        t0 = time.perf_counter()
        out = f(*args)
        jax.block_until_ready(out)
        el = (time.perf_counter() - t0) * 1e3
        if s >= a.warmup:
            times.append(el)
        if nxt is not None:
            args = nxt(out, args)
    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    print(json.dumps({
        "framework": "jax", "jax_version": jax.__version__, "case": a.case, "device": dev.device_kind,
        "median_step_ms": statistics.median(times), "steps": a.steps, "warmup": a.warmup,
        "timing": "wall time to block_until_ready",
        "temp_bytes": ma.temp_size_in_bytes, "argument_bytes": ma.argument_size_in_bytes,
        "output_bytes": ma.output_size_in_bytes, "alias_bytes": ma.alias_size_in_bytes,
        "host_temp_bytes": getattr(ma, "host_temp_size_in_bytes", 0),
        "peak_bytes": stats.get("peak_bytes_in_use")}))


if __name__ == "__main__":
    main()
