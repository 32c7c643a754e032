"""XLA's memory analysis of the training step examples/llama7b plans.

The same Llama-style decoder (GQA, rotate-half RoPE, RMSNorm in f32, SwiGLU,
untied embeddings; bf16 parameters, f32 AdamW moments, no master copy) and
the same step (next-token cross entropy, grad, AdamW with the update of the
stacked blocks as a scan over the layers, parameters and optimizer state
donated), built with jax.ShapeDtypeStruct arguments and compiled for the CPU,
never run. It prints compiled.memory_analysis() with no remat and with
jax.checkpoint policies on each layer: nothing_saveable, dots_saveable and
save_and_offload_only_these_names (the layer input offloaded to
pinned_host) when the CPU compiler accepts host offload.

    $(bash scripts/venv)/bin/python examples/llama7b/jax_memory.py            # 7B
    $(bash scripts/venv)/bin/python examples/llama7b/jax_memory.py --layers 2 --seq 256

With --devices 8 it builds the step of `go run ./examples/llama7b -devices 8`
instead: FSDP over 8 host devices (XLA_FLAGS=--xla_force_host_platform_device_count,
set here before JAX starts), the stacked blocks split after their layer axis, the
other parameters along their first dimension 8 divides, AdamW's moments as their
parameters, a global batch of 8 sequences split one per device, and the AdamW
update over every leaf at once (elementwise, so the new parameters and moments
can take the donated buffers). memory_analysis() is then one device's.

    $(bash scripts/venv)/bin/python examples/llama7b/jax_memory.py --devices 8
"""

import argparse
import json
import os
import sys


def _devices_flag(argv):
    """The value of --devices in argv (0 when absent)."""
    for i, a in enumerate(argv):
        if a == "--devices" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--devices="):
            return int(a.split("=", 1)[1])
    return 0


if _devices_flag(sys.argv) > 1:  # before JAX reads XLA_FLAGS
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={_devices_flag(sys.argv)}").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32


def config(args):
    n = max(args.devices, 1)
    return dict(vocab=32000, layers=args.layers, d=4096, heads=32, kv=8, hidden=14336, seq=args.seq, batch=n, devices=n)


def param_shapes(c, dt):
    L, d, hd = c["layers"], c["d"], c["d"] // c["heads"]
    S = lambda *s: jax.ShapeDtypeStruct(s, dt)
    blocks = dict(
        attn_norm=S(L, d), q=S(L, d, d), k=S(L, c["kv"] * hd, d), v=S(L, c["kv"] * hd, d), o=S(L, d, d),
        mlp_norm=S(L, d), gate=S(L, c["hidden"], d), up=S(L, c["hidden"], d), down=S(L, d, c["hidden"]),
    )
    return dict(embed=S(c["vocab"], d), blocks=blocks, norm=S(d), lm_head=S(c["vocab"], d))


def rms(x, scale, eps=1e-5):
    xf = x.astype(F32)
    y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(F32)).astype(x.dtype)


def linear(x, w):  # w: [out, in]
    return jnp.einsum("btd,od->bto", x, w)


def rope(x, theta=10000.0):  # x: [B, T, H, hd], rotate-half
    T, hd = x.shape[1], x.shape[-1]
    inv = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=F32) / hd)
    ang = jnp.arange(T, dtype=F32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(F32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def block(c, x, p):
    B, T, d = x.shape
    H, K, hd = c["heads"], c["kv"], d // c["heads"]
    h = rms(x, p["attn_norm"])
    q = rope(linear(h, p["q"]).reshape(B, T, H, hd))
    k = rope(linear(h, p["k"]).reshape(B, T, K, hd))
    v = linear(h, p["v"]).reshape(B, T, K, hd)
    q = q.reshape(B, T, K, H // K, hd)
    s = jnp.einsum("btkgh,bskh->bkgts", q, k).astype(F32) / jnp.sqrt(hd).astype(F32)
    mask = jnp.tril(jnp.ones((T, T), bool))
    s = jnp.where(mask, s, -jnp.inf)
    a = jax.nn.softmax(s, axis=-1).astype(x.dtype)
    o = jnp.einsum("bkgts,bskh->btkgh", a, v).reshape(B, T, d)
    x = x + linear(o, p["o"])
    h = rms(x, p["mlp_norm"])
    return x + linear(jax.nn.silu(linear(h, p["gate"])) * linear(h, p["up"]), p["down"])


def loss_fn(c, policy):
    def layer(x, p):
        return block(c, checkpoint_name(x, "x"), p)

    if policy is not None:
        layer = jax.checkpoint(layer, policy=policy)

    def loss(params, ids, targets):
        x = params["embed"][ids]
        x, _ = lax.scan(lambda x, p: (layer(x, p), None), x, params["blocks"])
        logits = linear(rms(x, params["norm"]), params["lm_head"]).astype(F32)
        lp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(lp, targets[..., None], axis=-1))

    return loss


def adamw(g, m, v, p, t, lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
    m = b1 * m + (1 - b1) * g.astype(F32)
    v = b2 * v + (1 - b2) * jnp.square(g.astype(F32))
    tf = t.astype(F32)
    d = (m / (1 - b1**tf)) / (jnp.sqrt(v / (1 - b2**tf)) + eps) + wd * p.astype(F32)
    return (p.astype(F32) - lr * d).astype(p.dtype), m, v


def step_fn(c, policy):
    loss = loss_fn(c, policy)

    def step(params, opt, ids, targets):
        val, g = jax.value_and_grad(loss)(params, ids, targets)
        t = opt["count"] + 1
        outer = {k: adamw(g[k], opt["mu"][k], opt["nu"][k], params[k], t) for k in ("embed", "norm", "lm_head")}

        def upd(_, xs):
            p, g, m, v = xs
            r = {k: adamw(g[k], m[k], v[k], p[k], t) for k in p}
            return None, tuple({k: r[k][i] for k in r} for i in range(3))

        _, (bp, bm, bv) = lax.scan(upd, None, (params["blocks"], g["blocks"], opt["mu"]["blocks"], opt["nu"]["blocks"]))
        newp = {k: outer[k][0] for k in outer} | {"blocks": bp}
        mu = {k: outer[k][1] for k in outer} | {"blocks": bm}
        nu = {k: outer[k][2] for k in outer} | {"blocks": bv}
        return newp, {"count": t, "mu": mu, "nu": nu}, val

    return step


def fsdp_step_fn(c, policy, mesh):
    """The step of step_fn with the update over every leaf at once, each
    layer's parameters constrained to their split inside the layer scan (so
    each device gathers one layer at a time) and the activations to the
    batch's."""
    batch = NamedSharding(mesh, P("fsdp"))

    def block_fsdp(x, p):
        p = {k: lax.with_sharding_constraint(w, NamedSharding(mesh, fsdp_spec(w.shape, 0, c["devices"]))) for k, w in p.items()}
        return lax.with_sharding_constraint(block(c, checkpoint_name(x, "x"), p), batch)

    layer = block_fsdp if policy is None else jax.checkpoint(block_fsdp, policy=policy)

    def loss(params, ids, targets):
        x = lax.with_sharding_constraint(params["embed"][ids], batch)
        x, _ = lax.scan(lambda x, p: (layer(x, p), None), x, params["blocks"])
        logits = linear(rms(x, params["norm"]), params["lm_head"]).astype(F32)
        lp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(lp, targets[..., None], axis=-1))

    def step(params, opt, ids, targets):
        val, g = jax.value_and_grad(loss)(params, ids, targets)
        t = opt["count"] + 1
        r = jax.tree.map(lambda g, m, v, p: adamw(g, m, v, p, t), g, opt["mu"], opt["nu"], params)
        pick = lambda i: jax.tree.map(lambda _, x: x[i], params, r)
        return pick(0), {"count": t, "mu": pick(1), "nu": pick(2)}, val

    return step


def fsdp_spec(shape, skip, n):
    """The first dimension from skip that n divides, split over "fsdp"."""
    spec = [None] * len(shape)
    for d in range(skip, len(shape)):
        if shape[d] % n == 0:
            spec[d] = "fsdp"
            break
    return P(*spec)


def fsdp_shardings(c, mesh, tree):
    def one(path, a):
        skip = 1 if any(getattr(k, "key", None) == "blocks" for k in path) else 0
        return NamedSharding(mesh, fsdp_spec(a.shape, skip, c["devices"]))

    return jax.tree_util.tree_map_with_path(one, tree)


def analyse(c, name, policy):
    p = param_shapes(c, BF16)
    m = param_shapes(c, F32)
    opt = {"count": jax.ShapeDtypeStruct((), I32), "mu": m, "nu": m}
    ids = jax.ShapeDtypeStruct((c["batch"], c["seq"]), I32)
    try:
        if c["devices"] > 1:
            mesh = Mesh(jax.devices()[: c["devices"]], ("fsdp",))
            ps, ms = fsdp_shardings(c, mesh, p), fsdp_shardings(c, mesh, m)
            os_ = {"count": NamedSharding(mesh, P()), "mu": ms, "nu": ms}
            bs = NamedSharding(mesh, P("fsdp"))
            jitted = jax.jit(fsdp_step_fn(c, policy, mesh), donate_argnums=(0, 1), in_shardings=(ps, os_, bs, bs),
                             out_shardings=(ps, os_, NamedSharding(mesh, P())))
        else:
            jitted = jax.jit(step_fn(c, policy), donate_argnums=(0, 1))
        compiled = jitted.lower(p, opt, ids, ids).compile()
    except Exception as e:  # noqa: BLE001 - report what the compiler refused
        return {"policy": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    a = compiled.memory_analysis()
    return {
        "policy": name,
        "argument_bytes": a.argument_size_in_bytes,
        "output_bytes": a.output_size_in_bytes,
        "alias_bytes": a.alias_size_in_bytes,
        "temp_bytes": a.temp_size_in_bytes,
        "host_temp_bytes": getattr(a, "host_temp_size_in_bytes", 0),
        "total_bytes": a.argument_size_in_bytes + a.output_size_in_bytes - a.alias_size_in_bytes + a.temp_size_in_bytes,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--devices", type=int, default=0, help="FSDP over this many host devices (0: one device)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    c = config(args)
    cp = jax.checkpoint_policies
    policies = [
        ("no remat", None),
        ("nothing_saveable", cp.nothing_saveable),
        ("dots_saveable", cp.dots_saveable),
        ("save_and_offload_only_these_names(offload x)",
         cp.save_and_offload_only_these_names(names_which_can_be_saved=[], names_which_can_be_offloaded=["x"],
                                              offload_src="device", offload_dst="pinned_host")),
    ]
    rows = [analyse(c, n, pol) for n, pol in policies]
    if args.json:
        json.dump({"jax": jax.__version__, "config": c, "rows": rows}, sys.stdout, indent=2)
        print()
        return
    gib = lambda b: f"{b / 2**30:.2f}"
    per = f", per device of {c['devices']} (FSDP)" if c["devices"] > 1 else ""
    print(f"XLA:CPU memory_analysis() of the Llama training step (jax {jax.__version__}), {c}, GiB{per}")
    print("| policy | argument | output | alias | temp | host temp | total |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['policy']} | refused: {r['error']} |")
            continue
        print(f"| {r['policy']} | {gib(r['argument_bytes'])} | {gib(r['output_bytes'])} | {gib(r['alias_bytes'])} | "
              f"{gib(r['temp_bytes'])} | {gib(r['host_temp_bytes'])} | {gib(r['total_bytes'])} |")


if __name__ == "__main__":
    main()
