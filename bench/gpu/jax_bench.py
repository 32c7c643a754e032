#!/usr/bin/env python3
"""JAX side of bench/gpu (see README.md): the same programs as main.go.

    python3 jax_bench.py --case scan|scan_offload|optimizer|transformer [--dim 7168] [--steps 10]

Prints one JSON line: median step time after 2 warm-up steps (measured with
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


def transformer_model():
    # The examples/transformer step: a small pre-LN decoder block stack with
    # Adam; sizes match the Go example's defaults (see README).
    d, heads, layers, seq, batch, vocab = 256, 4, 4, 128, 16, 256
    k = jax.random.key(0)
    def init(k):
        ks = jax.random.split(k, 4 * layers + 2)
        p = {"emb": jax.random.normal(ks[0], (vocab, d)) * 0.02, "blocks": []}
        for i in range(layers):
            p["blocks"].append({
                "qkv": jax.random.normal(ks[4 * i + 1], (d, 3 * d)) * 0.02,
                "o": jax.random.normal(ks[4 * i + 2], (d, d)) * 0.02,
                "w1": jax.random.normal(ks[4 * i + 3], (d, 4 * d)) * 0.02,
                "w2": jax.random.normal(ks[4 * i + 4], (4 * d, d)) * 0.02})
        return p
    def ln(x):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    def fwd(p, tok):
        x = p["emb"][tok]
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        for b in p["blocks"]:
            q, kk, v = jnp.split(ln(x) @ b["qkv"], 3, -1)
            sh = lambda t: t.reshape(batch, seq, heads, d // heads).transpose(0, 2, 1, 3)
            a = jnp.einsum("bhqd,bhkd->bhqk", sh(q), sh(kk)) / np.sqrt(d // heads)
            a = jax.nn.softmax(jnp.where(mask, a, -1e9), -1)
            o = jnp.einsum("bhqk,bhkd->bhqd", a, sh(v)).transpose(0, 2, 1, 3).reshape(batch, seq, d)
            x = x + o @ b["o"]
            x = x + jax.nn.gelu(ln(x) @ b["w1"], approximate=True) @ b["w2"]
        return ln(x) @ p["emb"].T
    def loss(p, tok):
        logits = fwd(p, tok[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tok[:, 1:]).mean()
    opt = optax.adam(1e-3)
    p = init(k)
    st = opt.init(p)
    def step(p, st, tok):
        g = jax.grad(loss)(p, tok)
        u, st = opt.update(g, st, p)
        return optax.apply_updates(p, u), st
    tok = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, vocab)
    f = jax.jit(step, donate_argnums=(0, 1))
    return f, (p, st, tok), lambda out, args: (out[0], out[1], args[2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="scan")
    ap.add_argument("--dim", type=int, default=7168)
    ap.add_argument("--steps", type=int, default=10)
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
    for s in range(a.steps + 2):
        t0 = time.perf_counter()
        out = f(*args)
        jax.block_until_ready(out)
        el = (time.perf_counter() - t0) * 1e3
        if s >= 2:
            times.append(el)
        if nxt is not None:
            args = nxt(out, args)
    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    print(json.dumps({
        "framework": "jax", "jax_version": jax.__version__, "case": a.case, "device": dev.device_kind,
        "median_step_ms": statistics.median(times), "steps": a.steps,
        "temp_bytes": ma.temp_size_in_bytes, "argument_bytes": ma.argument_size_in_bytes,
        "output_bytes": ma.output_size_in_bytes, "alias_bytes": ma.alias_size_in_bytes,
        "host_temp_bytes": getattr(ma, "host_temp_size_in_bytes", 0),
        "peak_bytes": stats.get("peak_bytes_in_use")}))


if __name__ == "__main__":
    main()
