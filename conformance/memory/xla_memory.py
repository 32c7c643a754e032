"""XLA:CPU's memory analysis of the programs of conformance/memory.

Every program here is written a second time in Go (conformance/memory/programs.go)
with the same ops in the same order, the same argument trees and the same
donation. Arguments are abstract (jax.ShapeDtypeStruct), so large sizes cost
nothing: only lowering and compiling run.

    python conformance/memory/xla_memory.py            # a table
    python conformance/memory/xla_memory.py --json     # JSON on stdout
    python conformance/memory/xla_memory.py --write    # regenerate testdata/xla_memory.json
    python conformance/memory/xla_memory.py --check    # fail if the committed JSON differs
    python conformance/memory/xla_memory.py --platform cuda --json   # XLA:GPU's (on a GPU machine)

Per program the JSON holds XLA's temp/argument/output/alias sizes (device and
host), the number of output leaves (XLA's output size of a multi-output program
includes an 8-byte-per-leaf tuple index table, which Ferry has no need of), and
the jax/jaxlib versions that produced it.
"""

import argparse
import json
import math
import os
import sys

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

F32 = jnp.float32
BF16 = jnp.bfloat16
I32 = jnp.int32
U32 = jnp.uint32


def S(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


KEY = S(2, dtype=U32)

# ---- mirrors of ferry/nn ----


def dense(x, w):
    return lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def linear(l, x):
    y = dense(x, l["W"])
    return y + l["B"] if l.get("B") is not None else y


def gelu(x):
    return jax.nn.gelu(x, approximate=True)


def relu(x):
    return jnp.maximum(x, 0)


def mlp_apply(layers, x, act=gelu):
    for i, l in enumerate(layers):
        x = linear(l, x)
        if i < len(layers) - 1:
            x = act(x)
    return x


def layernorm(p, x, eps=1e-6):
    mu = jnp.expand_dims(jnp.mean(x, -1), -1)
    xc = x - mu
    v = jnp.expand_dims(jnp.mean(xc * xc, -1), -1)
    y = xc * lax.rsqrt(v + jnp.asarray(eps, x.dtype))
    return y * p["Scale"] + p["Bias"]


def causal_mask(t):
    return lax.broadcasted_iota(I32, (t, t), 0) >= lax.broadcasted_iota(I32, (t, t), 1)


def attention(a, x, heads):
    b, t, d = x.shape
    dh = d // heads
    split = lambda w: dense(x, w).reshape(b, t, heads, dh)
    q, k, v = split(a["Wq"]), split(a["Wk"]), split(a["Wv"])
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    s = s * jnp.asarray(1 / math.sqrt(dh), F32)
    s = jnp.where(causal_mask(t), s, jnp.asarray(-1e30, F32))
    p = jax.nn.softmax(s, 3)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, d)
    return dense(o, a["Wo"])


def block_apply(bl, x, heads):
    x = x + attention(bl["Attn"], layernorm(bl["LN1"], x), heads)
    return x + mlp_apply(bl["MLP"], layernorm(bl["LN2"], x))


def softmax_ce(logits, labels):
    lp = jax.nn.log_softmax(logits, -1)
    oh = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    return -jnp.mean(jnp.sum(lp * oh, -1))


# ---- abstract parameter trees ----


def linear_s(i, o, dt=F32):
    return {"W": S(i, o, dtype=dt), "B": S(o, dtype=dt)}


def mlp_s(sizes, dt=F32):
    return [linear_s(sizes[i], sizes[i + 1], dt) for i in range(len(sizes) - 1)]


def ln_s(d, lead=()):
    return {"Scale": S(*lead, d), "Bias": S(*lead, d)}


def attn_s(d, lead=()):
    return {k: S(*lead, d, d) for k in ("Wq", "Wk", "Wv", "Wo")}


def block_s(d, hidden, lead=()):
    return {
        "LN1": ln_s(d, lead),
        "Attn": attn_s(d, lead),
        "LN2": ln_s(d, lead),
        "MLP": [{"W": S(*lead, d, hidden), "B": S(*lead, hidden)}, {"W": S(*lead, hidden, d), "B": S(*lead, d)}],
    }


def adam_state_s(params):
    z = jax.tree.map(lambda a: S(*a.shape, dtype=a.dtype), params)
    return {"Count": S(dtype=I32), "Mu": z, "Nu": jax.tree.map(lambda a: a, z)}


# ---- optimizers (mirrors of ferry/optim) ----


def adam_update(g, s, p, lr, b1, b2, eps, wd=0.0):
    count = s["Count"]
    t = count + 1
    tf = t.astype(F32)
    bc1 = 1 - jnp.power(jnp.float32(b1), tf)
    bc2 = 1 - jnp.power(jnp.float32(b2), tf)
    lrv = lr(count)

    def one(gi, mu, nu, pi):
        m = b1 * mu + (1 - b1) * gi
        v = b2 * nu + (1 - b2) * jnp.square(gi)
        d = (m / bc1) / (jnp.sqrt(v / bc2) + eps)
        if wd:
            d = d + wd * pi
        return -lrv * d, m, v

    out = jax.tree.map(one, g, s["Mu"], s["Nu"], p)
    leaf = lambda x: isinstance(x, tuple)
    u = jax.tree.map(lambda o: o[0], out, is_leaf=leaf)
    m = jax.tree.map(lambda o: o[1], out, is_leaf=leaf)
    v = jax.tree.map(lambda o: o[2], out, is_leaf=leaf)
    return u, {"Count": t, "Mu": m, "Nu": v}


def clip_by_global_norm(g, max_norm):
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(g)))
    keep = norm < max_norm
    return jax.tree.map(lambda x: jnp.where(keep, x, x / norm * max_norm), g)


def warmup_cosine(peak, warmup, total, end):
    n = total - warmup

    def sched(step):
        s = step.astype(F32)
        warm = peak * jnp.minimum(s / warmup, 1.0)
        frac = jnp.minimum(jnp.maximum((s - warmup) / n, 0.0), 1.0)
        decayed = end + (peak - end) * (0.5 * (1 + jnp.cos(math.pi * frac)))
        return jnp.where(step < warmup, warm, decayed)

    return sched


def apply_updates(p, u):
    return jax.tree.map(lambda a, b: a + b, p, u)


# ---- random (mirrors of ferry/random and nn initialisers) ----


def lecun_normal(key, shape, dt=F32):
    return jax.nn.initializers.lecun_normal()(key, shape, F32).astype(dt)


def normal_init(std):
    return lambda key, shape, dt=F32: (jax.random.normal(key, shape, F32) * std).astype(dt)


def new_linear(key, i, o, dt=F32):
    ks = jax.random.split(key, 2)
    return {"W": lecun_normal(ks[0], (i, o), dt), "B": jnp.zeros((o,), dt)}


def new_mlp(key, sizes, dt=F32):
    ks = jax.random.split(key, len(sizes) - 1)
    return [new_linear(ks[i], sizes[i], sizes[i + 1], dt) for i in range(len(sizes) - 1)]


def new_block(key, d, hidden, dt):
    ks = jax.random.split(key, 2)
    ka = jax.random.split(ks[0], 4)
    return {
        "LN1": {"Scale": jnp.ones((d,), dt), "Bias": jnp.zeros((d,), dt)},
        "Attn": {n: lecun_normal(ka[i], (d, d), dt) for i, n in enumerate(("Wq", "Wk", "Wv", "Wo"))},
        "LN2": {"Scale": jnp.ones((d,), dt), "Bias": jnp.zeros((d,), dt)},
        "MLP": new_mlp(ks[1], [d, hidden, d], dt),
    }


def new_stack(key, L, d, hidden, dt):
    keys = jax.random.split(key, L)
    _, blocks = lax.scan(lambda c, k: (c, new_block(k, d, hidden, dt)), None, keys)
    return blocks


# ---- the programs ----

PROGRAMS = {}


def program(name, *args, donate=()):
    def reg(fn):
        PROGRAMS[name] = (fn, args, donate)
        return fn

    return reg


# Elementwise chains, reductions, softmax, layernorm.
program("elementwise_chain", S(2048, 1024))(lambda x: jnp.tanh(x * 2.0 + 1.0) * jnp.exp(-x) + x)
program("elementwise_two_outputs", S(2048, 1024), S(2048, 1024))(lambda x, y: (x * y + 1.0, jnp.tanh(x - y)))
program("elementwise_broadcast", S(2048, 1024), S(1024))(lambda x, b: jnp.maximum(x + b, 0) * jnp.sqrt(jnp.abs(b) + 1.0))
program("reduce_sum_rows", S(4096, 1024))(lambda x: jnp.sum(x * x, 1))
program("reduce_mixed", S(1024, 2048))(lambda x: (jnp.sum(x), jnp.max(x, 0), jnp.mean(jnp.exp(x), 1)))
program("softmax", S(1024, 2048))(lambda x: jax.nn.softmax(x, -1))
program("log_softmax", S(1024, 2048))(lambda x: jax.nn.log_softmax(x, -1))
program("layernorm", S(4096, 1024), ln_s(1024))(lambda x, p: layernorm(p, x))


@program("layernorm_grad", {"X": S(4096, 1024), "LN": ln_s(1024)})
def _(a):
    return jax.grad(lambda a: jnp.sum(jnp.square(layernorm(a["LN"], a["X"]))))(a)


@program("softmax_grad", S(1024, 2048), S(1024, 2048))
def _(x, w):
    return jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, -1) * w))(x)


# Matrix products and MLPs.
program("matmul_chain", S(1024, 1024), S(1024, 4096), S(4096, 1024))(lambda x, a, b: relu(x @ a) @ b)

MLP_SIZES = [784, 512, 10]
program("mlp_forward", mlp_s(MLP_SIZES), S(128, 784))(lambda p, x: mlp_apply(p, x, relu))


@program("mlp_value_and_grad", mlp_s(MLP_SIZES), S(128, 784), S(128, dtype=I32))
def _(p, x, y):
    return jax.value_and_grad(lambda p: softmax_ce(mlp_apply(p, x, relu), y))(p)


def mlp_train_step(p, s, x, y):
    loss, g = jax.value_and_grad(lambda p: softmax_ce(mlp_apply(p, x, relu), y))(p)
    u, s = adam_update(g, s, p, lambda c: jnp.float32(1e-3), 0.9, 0.999, 1e-8)
    return apply_updates(p, u), s, loss


program("mlp_train_step_adam", mlp_s(MLP_SIZES), adam_state_s(mlp_s(MLP_SIZES)), S(128, 784), S(128, dtype=I32), donate=(0, 1))(mlp_train_step)
BIG = [784, 4096, 4096, 10]
program("mlp_train_step_adam_wide", mlp_s(BIG), adam_state_s(mlp_s(BIG)), S(1024, 784), S(1024, dtype=I32), donate=(0, 1))(mlp_train_step)

# Remat of a deep MLP: each layer under jax.checkpoint with a policy.
DEEP = [1024] * 5


def deep_mlp_loss(policy):
    layer = lambda x, l: relu(linear(l, x))
    if policy is not None:
        layer = jax.checkpoint(layer, policy=policy)

    def grad(p, x):
        def loss(p):
            h = x
            for l in p:
                h = layer(h, l)
            return jnp.sum(jnp.square(h))

        return jax.grad(loss)(p)

    return grad


cp = jax.checkpoint_policies
program("deep_mlp_grad", mlp_s(DEEP), S(2048, 1024))(deep_mlp_loss(None))
program("deep_mlp_grad_remat_nothing", mlp_s(DEEP), S(2048, 1024))(deep_mlp_loss(cp.nothing_saveable))
program("deep_mlp_grad_remat_dots", mlp_s(DEEP), S(2048, 1024))(deep_mlp_loss(cp.dots_saveable))

# Attention (nn.Attention) at several sizes.
for name, (b, t, d, h) in {"attention_t128": (8, 128, 256, 4), "attention_t512": (4, 512, 256, 8), "attention_t2048": (1, 2048, 512, 8)}.items():
    program(name, attn_s(d), S(b, t, d))(lambda a, x, h=h: attention(a, x, h))


@program("attention_grad_t512", attn_s(256), S(4, 512, 256))
def _(a, x):
    return jax.grad(lambda a: jnp.sum(jnp.square(attention(a, x, 8))))(a)


# The 10-layer scanned model of examples/offload (device-only variants).
L, D, H = 10, 256, 1024
OFF_W = {"W1": S(L, D, H), "W2": S(L, H, D)}


def offload_grad(layer):
    def loss(w, x):
        final, _ = lax.scan(lambda x, w: (layer(x, w), None), x, w)
        return jnp.sum(final)

    return lambda w, x: jax.grad(lambda w: loss(w, x))(w)


plain_layer = lambda x, w: (x @ w["W1"]) @ w["W2"]
named_layer = lambda x, w: (checkpoint_name(x, "x") @ w["W1"]) @ w["W2"]
program("offload_baseline", OFF_W, S(D, D))(offload_grad(plain_layer))
program("offload_remat_nothing", OFF_W, S(D, D))(offload_grad(jax.checkpoint(plain_layer, policy=cp.nothing_saveable)))
program("offload_remat_dots", OFF_W, S(D, D))(offload_grad(jax.checkpoint(plain_layer, policy=cp.dots_saveable)))
program("offload_remat_save_x", OFF_W, S(D, D))(offload_grad(jax.checkpoint(named_layer, policy=cp.save_only_these_names("x"))))

# Initialisers (examples/init, nn).
program("init_mlp", KEY)(lambda k: new_mlp(k, [784, 512, 10]))
program("init_random_matrix", KEY)(lambda k: 0.02 * jax.random.normal(k, (4096, 8192), F32))
program("init_stack_bf16", KEY)(lambda k: new_stack(k, 8, 256, 1024, BF16))


@program("init_pairwise", KEY)
def _(key, n=512, c=64):
    ks = jax.random.split(key, 5)
    h = jax.random.normal(ks[0], (n, c), F32)
    wq = lecun_normal(ks[1], (c, c))
    wk = lecun_normal(ks[2], (c, c))
    gamma = 1 + 0.02 * jax.random.normal(ks[3], (c,), F32)
    beta = 0.02 * jax.random.normal(ks[4], (c,), F32)
    q, k = h @ wq, h @ wk
    diff = q.reshape(n, 1, c) - k.reshape(1, n, c)
    return jnp.tanh(diff) * gamma + beta


# A small examples/transformer train step: tied embedding, scanned pre-norm
# blocks, clip + AdamW with warmup-cosine, parameters and state donated.
TV, TSEQ, TL, TD, THEADS, TB = 96, 64, 2, 128, 4, 16


def tf_params():
    return {"Tok": {"Table": S(TV, TD)}, "Pos": S(TSEQ, TD), "Blocks": block_s(TD, 4 * TD, (TL,)), "Norm": ln_s(TD)}


def tf_loss(p, x, y):
    h = jnp.take(p["Tok"]["Table"], x, axis=0, mode="clip") + p["Pos"]
    h, _ = lax.scan(lambda h, b: (block_apply(b, h, THEADS), None), h, p["Blocks"])
    h = layernorm(p["Norm"], h)
    logits = lax.dot_general(h, p["Tok"]["Table"], (((2,), (1,)), ((), ())))
    return softmax_ce(logits, y)


@program("transformer_train_step", tf_params(), {"First": {}, "Second": adam_state_s(tf_params())}, S(TB, TSEQ, dtype=I32), S(TB, TSEQ, dtype=I32), donate=(0, 1))
def _(p, s, x, y):
    loss, g = jax.value_and_grad(lambda p: tf_loss(p, x, y))(p)
    g = clip_by_global_norm(g, 1.0)
    u, s2 = adam_update(g, s["Second"], p, warmup_cosine(3e-3, 100, 2000, 3e-4), 0.9, 0.95, 1e-8, 0.01)
    return apply_updates(p, u), {"First": {}, "Second": s2}, loss


# ---- analysis ----

FIELDS = ["temp", "argument", "output", "alias", "host_temp", "host_argument", "host_output", "host_alias"]


def analyse(name):
    fn, args, donate = PROGRAMS[name]
    lowered = jax.jit(fn, donate_argnums=donate).lower(*args)
    m = lowered.compile().memory_analysis()
    row = {f: int(getattr(m, f + "_size_in_bytes")) for f in FIELDS}
    row["output_leaves"] = len(jax.tree.leaves(lowered.out_info))
    row["argument_leaves"] = len(jax.tree.leaves(args))
    return row


def results(only=""):
    return {
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else __import__("jaxlib").__version__,
        "platform": jax.devices()[0].platform,
        "programs": {name: analyse(name) for name in PROGRAMS if only in name},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the JSON")
    ap.add_argument("--write", action="store_true", help="write testdata/xla_memory.json")
    ap.add_argument("--check", action="store_true", help="exit 1 if testdata/xla_memory.json differs")
    ap.add_argument("--run", default="", help="only the programs whose name contains this")
    ap.add_argument("--platform", default="cpu", help="JAX platform to compile for (cpu, the committed figures; cuda on an NVIDIA GPU)")
    a = ap.parse_args()
    if (a.platform != "cpu" or a.run) and (a.write or a.check):
        ap.error("--write and --check are for the committed XLA:CPU figures of every program (--platform cpu, no --run)")
    jax.config.update("jax_platforms", a.platform)
    res = results(a.run)
    text = json.dumps(res, indent=1, sort_keys=True) + "\n"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "xla_memory.json")
    if a.write:
        with open(path, "w") as f:
            f.write(text)
    if a.check:
        with open(path) as f:
            old = json.load(f)
        if old != json.loads(text):
            for name in sorted(set(old.get("programs", {})) | set(res["programs"])):
                o, n = old.get("programs", {}).get(name), res["programs"].get(name)
                if o != n:
                    print(f"{name}: committed {o}\n{' ' * len(name)}  XLA now  {n}", file=sys.stderr)
            for k in ("jax", "jaxlib", "platform"):
                if old.get(k) != res[k]:
                    print(f"{k}: committed {old.get(k)}, now {res[k]}", file=sys.stderr)
            print(f"{path} is not what XLA produces: regenerate with --write", file=sys.stderr)
            sys.exit(1)
        print(f"{path}: {len(res['programs'])} programs agree with jax {res['jax']}")
    if a.json:
        sys.stdout.write(text)
    elif not a.check:
        print(f"{'program':32} {'temp':>12} {'argument':>12} {'output':>12} {'alias':>12}")
        for name, r in res["programs"].items():
            print(f"{name:32} {r['temp']:12d} {r['argument']:12d} {r['output']:12d} {r['alias']:12d}")


if __name__ == "__main__":
    main()
