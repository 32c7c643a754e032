#!/usr/bin/env python3
"""JAX side of bench/vsjax: the same programs as the Go side, driven over a pipe.

Run by `go run ./bench/vsjax` as a long-lived subprocess; not meant to be run
by hand. The protocol, one request at a time on stdin, one reply on stdout:

  request:  one JSON line; when it lists "arrays" ([{"name", "dtype",
            "shape"}], little-endian, C order), their raw bytes follow in that
            order.
  reply:    one JSON line; when it has "nbytes" > 0, that many raw bytes (a
            float32 array of "shape") follow.

Commands:
  hello                         versions, devices and thread settings
  setup {id, case, arrays, cfg} builds the case from the arrays sent (the
                                initial parameters of a training step come
                                from the Go side, so both start identical)
  check {id, steps}             from the initial arrays: a training step's
                                losses over `steps` steps, or a function's
                                output (raw bytes); also the first call's wall
                                time in ms (trace + compile + run)
  time  {id, n}                 n calls in a row, each waited for
                                (block_until_ready); replies ns per call. A
                                training step keeps its state across calls.
  quit

Cases (each jitted; the Go file bench/vsjax/rows.go has the Ferry twins):
  add          a + b, two f32 scalars (the cost of one jitted call)
  matmul       a @ b, f32
  gelu         jax.nn.gelu(x * w + b, approximate=True), w and b rows broadcast
  mlp          examples/mlp's train step: 784-512-10 ReLU MLP, mean softmax
               cross-entropy, optax.adam(lr) (b1 0.9, b2 0.999, eps 1e-8),
               params and optimizer state donated
  per_example  per-example gradients of mlp's loss (jax.vmap of jax.grad,
               parameters not mapped), each example's squared gradient norm
  transformer  examples/transformer's train step: tied token embedding,
               learned positions, pre-norm blocks stacked and run by lax.scan
               (LayerNorm eps 1e-6, causal bias-free attention, 4·d tanh-GELU
               MLP with biases), final LayerNorm; chain(clip_by_global_norm,
               adamw(warmup_cosine_decay_schedule)), params and optimizer
               state donated
"""
import json
import os
import sys
import time

# The protocol owns fd 1; anything a library prints goes to stderr.
_proto_out = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
sys.stdout = sys.stderr

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

_in = sys.stdin.buffer


def reply(obj, payload=None):
    if payload is not None:
        obj["nbytes"] = len(payload)
    _proto_out.write((json.dumps(obj) + "\n").encode())
    if payload is not None:
        _proto_out.write(payload)
    _proto_out.flush()


def read_request():
    line = _in.readline()
    if not line:
        return None, []
    req = json.loads(line)
    arrays = []
    for a in req.get("arrays") or []:
        dt = np.dtype(a["dtype"]).newbyteorder("<")
        shape = tuple(a.get("shape") or ())
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        buf = _in.read(n)
        if len(buf) != n:
            raise EOFError(f"array {a['name']}: want {n} bytes, got {len(buf)}")
        arrays.append(np.frombuffer(buf, dtype=dt).reshape(shape).astype(dt.newbyteorder("=")))
    return req, arrays


class Fn:
    """A pure function of its arrays; check returns its output."""

    def __init__(self, f, arrays):
        self.f = jax.jit(f)
        self.args = [jax.device_put(a) for a in arrays]

    def check(self, steps):
        t0 = time.perf_counter()
        out = jax.block_until_ready(self.f(*self.args))
        first = (time.perf_counter() - t0) * 1e3
        o = np.asarray(out, dtype=np.float32)
        return {"first_call_ms": first, "shape": list(o.shape)}, o.astype("<f4").tobytes()

    def time(self, n):
        f, args = self.f, self.args
        t0 = time.perf_counter_ns()
        for _ in range(n):
            jax.block_until_ready(f(*args))
        return (time.perf_counter_ns() - t0) / n


class Step:
    """A training step step(params, opt_state, x, y) -> (params, opt_state, loss)
    with params and optimizer state donated."""

    def __init__(self, step, opt, params, x, y):
        self.f = jax.jit(step, donate_argnums=(0, 1))
        self.opt = opt
        self.init = params  # numpy leaves
        self.x, self.y = jax.device_put(x), jax.device_put(y)
        self.reset()

    def reset(self):
        p = jax.tree.map(lambda a: jax.device_put(np.array(a)), self.init)
        self.state = (p, self.opt.init(p))

    def check(self, steps):
        self.reset()
        losses, first = [], None
        for i in range(steps):
            t0 = time.perf_counter()
            p, s, loss = self.f(*self.state, self.x, self.y)
            loss = float(loss)
            if first is None:
                first = (time.perf_counter() - t0) * 1e3
            self.state = (p, s)
            losses.append(loss)
        self.reset()
        return {"first_call_ms": first, "losses": losses}, None

    def time(self, n):
        f, x, y = self.f, self.x, self.y
        p, s = self.state
        t0 = time.perf_counter_ns()
        for _ in range(n):
            p, s, loss = f(p, s, x, y)
            jax.block_until_ready((p, s, loss))
        el = time.perf_counter_ns() - t0
        self.state = (p, s)
        return el / n


def mlp_case(cfg, arrays):
    # Leaves as the Go side sends them: W0, B0, W1, B1, ..., x, labels.
    *leaves, x, y = arrays
    params = [{"w": leaves[i], "b": leaves[i + 1]} for i in range(0, len(leaves), 2)]

    def loss(p, x, y):
        h = x
        for i, l in enumerate(p):
            h = h @ l["w"] + l["b"]
            if i < len(p) - 1:
                h = jax.nn.relu(h)
        return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()

    opt = optax.adam(cfg["lr"], b1=0.9, b2=0.999, eps=1e-8)

    def step(p, s, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, l

    return Step(step, opt, params, x, y)


def per_example_case(arrays):
    """Per-example gradients (jax.vmap of jax.grad, parameters not mapped) of
    mlp_case's loss, reduced to each example's squared gradient norm: the first
    step of DP-SGD."""
    *leaves, x, y = arrays
    params = [{"w": leaves[i], "b": leaves[i + 1]} for i in range(0, len(leaves), 2)]

    def loss(p, xe, ye):
        h = xe[None]
        for i, l in enumerate(p):
            h = h @ l["w"] + l["b"]
            if i < len(p) - 1:
                h = jax.nn.relu(h)
        return optax.softmax_cross_entropy_with_integer_labels(h, ye[None]).mean()

    def norms(p, x, y):
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(p, x, y)
        return sum(jnp.sum(jnp.square(v.reshape(v.shape[0], -1)), axis=1) for v in jax.tree.leaves(g))

    return Fn(lambda *a: norms(params, *a), [x, y])


# The transformer's leaves in the order the Go side sends them (trace.Leaves of
# its Model: Tok.Table, Pos, the stacked Block's fields, Norm).
TF_LEAVES = ["tok", "pos",
             "ln1_scale", "ln1_bias", "wq", "wk", "wv", "wo", "ln2_scale", "ln2_bias",
             "w1", "b1", "w2", "b2",
             "norm_scale", "norm_bias"]


def transformer_case(cfg, arrays):
    *leaves, x, y = arrays
    if len(leaves) != len(TF_LEAVES):
        raise ValueError(f"transformer: {len(leaves)} parameter arrays, want {len(TF_LEAVES)}")
    named = dict(zip(TF_LEAVES, leaves))
    params = {"tok": named["tok"], "pos": named["pos"],
              "norm": {"scale": named["norm_scale"], "bias": named["norm_bias"]},
              "blocks": {k: named[k] for k in TF_LEAVES[2:14]}}
    heads = cfg["heads"]
    batch, seq = x.shape
    d = params["tok"].shape[1]
    dh = d // heads

    def ln(x, scale, bias):
        m = x.mean(-1, keepdims=True)
        xc = x - m
        v = (xc * xc).mean(-1, keepdims=True)
        return xc * jax.lax.rsqrt(v + 1e-6) * scale + bias

    mask = jnp.tril(jnp.ones((seq, seq), bool))

    def block(x, b):
        h = ln(x, b["ln1_scale"], b["ln1_bias"])
        sh = lambda w: (h @ w).reshape(batch, seq, heads, dh)  # noqa: E731
        q, k, v = sh(b["wq"]), sh(b["wk"]), sh(b["wv"])
        a = jnp.einsum("bqhd,bkhd->bhqk", q, k) * np.float32(1 / np.sqrt(dh))
        a = jax.nn.softmax(jnp.where(mask, a, np.float32(-1e30)), -1)
        o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(batch, seq, d)
        x = x + o @ b["wo"]
        h = ln(x, b["ln2_scale"], b["ln2_bias"])
        return x + jax.nn.gelu(h @ b["w1"] + b["b1"], approximate=True) @ b["w2"] + b["b2"], None

    def loss(p, x, y):
        h = p["tok"][x] + p["pos"]
        h, _ = jax.lax.scan(block, h, p["blocks"])
        logits = ln(h, p["norm"]["scale"], p["norm"]["bias"]) @ p["tok"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    sched = optax.warmup_cosine_decay_schedule(0.0, cfg["lr"], cfg["warmup"], cfg["total"], cfg["end_lr"])
    opt = optax.chain(optax.clip_by_global_norm(cfg["clip"]),
                      optax.adamw(sched, b1=0.9, b2=0.95, eps=1e-8, weight_decay=cfg["weight_decay"]))

    def step(p, s, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, l

    return Step(step, opt, params, x, y)


def build(case, cfg, arrays):
    if case == "add":
        return Fn(lambda a, b: a + b, arrays)
    if case == "matmul":
        return Fn(lambda a, b: a @ b, arrays)
    if case == "gelu":
        return Fn(lambda x, w, b: jax.nn.gelu(x * w + b, approximate=True), arrays)
    if case == "mlp":
        return mlp_case(cfg, arrays)
    if case == "transformer":
        return transformer_case(cfg, arrays)
    if case == "per_example":
        return per_example_case(arrays)
    raise ValueError(f"unknown case {case!r}")


def main():
    cases = {}
    while True:
        try:
            req, arrays = read_request()
        except Exception as e:  # a malformed request ends the session
            reply({"error": f"bad request: {e}"})
            return
        if req is None:
            return
        cmd = req.get("cmd")
        try:
            if cmd == "hello":
                reply({"jax": jax.__version__, "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else "",
                       "optax": optax.__version__, "numpy": np.__version__,
                       "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
                       "xla_flags": os.environ.get("XLA_FLAGS", "")})
            elif cmd == "setup":
                cases[req["id"]] = build(req["case"], req.get("cfg") or {}, arrays)
                reply({"ok": True})
            elif cmd == "check":
                meta, payload = cases[req["id"]].check(int(req.get("steps", 1)))
                reply(meta, payload)
            elif cmd == "time":
                reply({"ns_per_call": cases[req["id"]].time(int(req["n"]))})
            elif cmd == "drop":
                cases.pop(req["id"], None)
                reply({"ok": True})
            elif cmd == "quit":
                reply({"ok": True})
                return
            else:
                reply({"error": f"unknown command {cmd!r}"})
        except Exception as e:
            reply({"error": f"{cmd}: {type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
