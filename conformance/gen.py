#!/usr/bin/env python3
"""Writes Ferry's JAX golden files under conformance/testdata/.

    bash scripts/venv                            # makes .venv from requirements.txt
    .venv/bin/python conformance/gen.py          # rewrites the golden files
    .venv/bin/python conformance/gen.py --check  # regenerates in memory, compares

Every case is one op of Ferry's IR (ir/ops.go) run by the jax.lax primitive with
the same semantics, or one jax.random function, on fixed inputs: random values
from a seed derived from the case name, plus edge values (NaN, +-Inf, +-0,
subnormals, largest finite, integer min/max). The gradient file holds
jax.vjp of every differentiable op at random inputs away from kinks (and at
ties and zeros, for the conventions there), under a random cotangent, and jax.grad of whole programs (an MLP loss, one nn.Block,
examples/offload's scanned model, a remat'd scan, fori_loop + cond, and the
value of a while_loop). Arrays are stored as hex-encoded
little-endian bytes. Each file is gzip'd JSON with one case per line, keys
sorted and mtime 0, so the bytes depend only on JAX's results.

XLA's results differ in the last bits from one CPU to another (AVX2 against
AVX-512: f64 rsqrt, f32 matrix products, and what is built on them), so
--check accepts a regenerated result within a tolerance in ulps per op and
dtype of the committed one (CHECK_ULPS, PROGRAM_ULPS: within what JAX's own
tests allow), and demands the same bits wherever XLA is exact; it names the
file, case, result, element, distance and tolerance of every difference
beyond. Writing keeps the committed text of every case that passes that
check, so that regenerating on another CPU rewrites only what really changed
(--fresh writes everything as this host's JAX gives it).

XLA is held to AVX2 (--xla_cpu_max_isa=AVX2, unless XLA_FLAGS is set): on a
CPU with AVX512-FP16 (Intel Sapphire Rapids and later) XLA otherwise computes
float16 arithmetic in float16, rounding after every operation, where on other
CPUs it computes in float32 and rounds once; the float16 random samplers
(uniform's scale and shift, truncated_normal's inverse error function) then
differ by 1 to 32 ulps. The goldens are the float32-intermediate results, as
every other CPU gives them and as Ferry computes.
"""

import argparse
import warnings
import gzip
import json
import os
import sys
import zlib

# The ISA cap comes first: placed after the other items it did not take
# effect here (jax 0.10.2).
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_max_isa=AVX2 --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

jax.config.update("jax_enable_x64", True)
warnings.simplefilter("ignore", RuntimeWarning)  # overflowing casts of edge values are meant

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(HERE, "testdata")

NP = {
    "bool": np.dtype(np.bool_),
    "u8": np.dtype(np.uint8),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u32": np.dtype(np.uint32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}
# f32 first: the Go test probes dtype coverage from each op's first row.
ALL = ["f32", "f64", "bf16", "f16", "i32", "i64", "u8", "u32", "bool"]
FLOATS = ["f32", "f64", "bf16", "f16"]
INTS = ["i32", "i64", "u8", "u32"]
NUMERIC = FLOATS + INTS
LOGICAL = INTS + ["bool"]


def ferry_name(dt):
    dt = np.dtype(dt)
    for k, v in NP.items():
        if v == dt:
            return k
    raise ValueError(dt)


def enc(a):
    a = np.asarray(a)
    name = ferry_name(a.dtype)
    a = np.array(a, dtype=NP[name].newbyteorder("<"), order="C")  # keeps 0-d arrays 0-d
    return {"dtype": name, "shape": list(a.shape), "hex": a.tobytes().hex()}


def rng(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def edges(dt):
    """Edge values of dtype dt as a 1-D array."""
    d = NP[dt]
    if dt == "bool":
        return np.array([False, True])
    if dt in INTS:
        info = np.iinfo(d)
        bits = info.bits
        vals = [0, 1, 2, 3, 7, bits - 1, bits, bits + 1, 100, info.max, info.max - 1, info.min, info.min + 1]
        if info.min < 0:
            vals += [-1, -2, -3, -7, -100]
        else:
            vals += [info.max // 2, info.max // 2 + 1]
        return np.array(sorted(set(vals)), dtype=d)
    fi = ml_dtypes.finfo(d) if dt == "bf16" else np.finfo(d)
    big = float(fi.max)
    vals = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 100.0, 1e-3,
            np.nan, np.inf, -np.inf, float(fi.smallest_normal), float(fi.smallest_subnormal),
            -float(fi.smallest_subnormal), float(fi.smallest_normal) - float(fi.smallest_subnormal),
            big, -big]
    a = np.array(vals, dtype=np.float64).astype(d)
    # A NaN with the sign bit set: payloads are not compared, but it must stay NaN.
    neg_nan = np.array([np.nan], dtype=d)
    neg_nan = (-neg_nan.astype(np.float64)).astype(d)
    return np.concatenate([a, neg_nan])


def randoms(dt, n, r, lo=-4.0, hi=4.0):
    d = NP[dt]
    if dt == "bool":
        return r.integers(0, 2, n).astype(bool)
    if dt in INTS:
        info = np.iinfo(d)
        return r.integers(int(info.min), int(info.max), n, dtype=np.int64 if dt != "u32" else np.uint64, endpoint=True).astype(d)
    return r.uniform(lo, hi, n).astype(d)


def small_ints(dt, shape, r, lo=-3, hi=4):
    """Integer-valued arrays (exact in every dtype, sums and products too)."""
    if dt == "bool":
        return r.integers(0, 2, shape).astype(bool)
    if dt in ("u8", "u32"):
        lo = 0
    return r.integers(lo, hi, shape).astype(NP[dt])


# ---- op table -------------------------------------------------------------

def _round(x):
    return lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)


def _abs(x):
    return x if np.dtype(x.dtype).kind == "u" else lax.abs(x)


UNARY = {  # Ferry name: (jax function, accepted dtypes, comparison)
    "neg": (lax.neg, NUMERIC, "exact"),
    "abs": (_abs, NUMERIC, "exact"),  # lax.abs refuses unsigned: jnp.abs is x there
    "sign": (lax.sign, NUMERIC, "exact"),
    "exp": (lax.exp, FLOATS, "ulp"),
    "log": (lax.log, FLOATS, "ulp"),
    "log1p": (lax.log1p, FLOATS, "ulp"),
    "expm1": (lax.expm1, FLOATS, "ulp"),
    "sqrt": (lax.sqrt, FLOATS, "ulp"),
    "rsqrt": (lax.rsqrt, FLOATS, "ulp"),
    "tanh": (lax.tanh, FLOATS, "ulp"),
    "logistic": (lax.logistic, FLOATS, "ulp"),
    "sin": (lax.sin, FLOATS, "ulp"),
    "cos": (lax.cos, FLOATS, "ulp"),
    "erf": (lax.erf, FLOATS, "ulp"),
    "floor": (lax.floor, FLOATS, "exact"),
    "ceil": (lax.ceil, FLOATS, "exact"),
    "round": (_round, FLOATS, "exact"),
    "not": (lax.bitwise_not, LOGICAL, "exact"),
}

BINARY = {
    "add": (lax.add, NUMERIC, "exact"),
    "sub": (lax.sub, NUMERIC, "exact"),
    "mul": (lax.mul, NUMERIC, "exact"),
    "div": (lax.div, NUMERIC, "exact"),
    "pow": (lax.pow, FLOATS, "ulp"),
    "max": (lax.max, NUMERIC, "exact"),
    "min": (lax.min, NUMERIC, "exact"),
    "rem": (lax.rem, NUMERIC, "exact"),
    "and": (lax.bitwise_and, LOGICAL, "exact"),
    "or": (lax.bitwise_or, LOGICAL, "exact"),
    "xor": (lax.bitwise_xor, LOGICAL, "exact"),
    "shift_left": (lax.shift_left, INTS, "exact"),
    "shift_right_logical": (lax.shift_right_logical, INTS, "exact"),
    "shift_right_arithmetic": (lax.shift_right_arithmetic, INTS, "exact"),
    "eq": (lax.eq, ALL, "exact"),
    "ne": (lax.ne, ALL, "exact"),
    "lt": (lax.lt, ALL, "exact"),
    "le": (lax.le, ALL, "exact"),
    "gt": (lax.gt, ALL, "exact"),
    "ge": (lax.ge, ALL, "exact"),
}


class Cases:
    def __init__(self):
        self.rows = []
        self.unsupported = []

    def add(self, name, op, args, fn, attrs=None, cmp="exact", jaxfn=""):
        """Runs fn(*args) in JAX and records the case (or JAX's refusal)."""
        try:
            outs = fn(*[jnp.asarray(a) for a in args])
        except Exception as e:  # JAX refuses this op/dtype: recorded, never silent
            key = ferry_name(np.asarray(args[1 if op == "select" else 0]).dtype) if args else ""
            self.unsupported.append({"name": name, "op": op, "key": key, "error": str(e).splitlines()[0][:200]})
            return
        if not isinstance(outs, (tuple, list)):
            outs = [outs]
        self.rows.append({
            "name": name, "op": op, "attrs": attrs or {}, "cmp": cmp, "jax": jaxfn,
            "args": [enc(a) for a in args], "outs": [enc(np.asarray(o)) for o in outs],
        })


def gen_elementwise(c):
    for op, (fn, dts, cmp) in UNARY.items():
        for dt in dts:
            name = f"{op}/{dt}"
            x = np.concatenate([edges(dt), randoms(dt, 48, rng(name))])
            if op in ("log", "log1p", "sqrt", "rsqrt"):  # mostly in the domain
                x = np.concatenate([x, np.abs(randoms(dt, 32, rng(name + "+")))])
            c.add(name, op, [x], fn, cmp=cmp, jaxfn=fn.__name__)
    for op, (fn, dts, cmp) in BINARY.items():
        for dt in dts:
            name = f"{op}/{dt}"
            e = edges(dt)
            a, b = np.meshgrid(e, e, indexing="ij")
            r = rng(name)
            x = np.concatenate([a.ravel(), randoms(dt, 48, r)])
            y = np.concatenate([b.ravel(), randoms(dt, 48, r)])
            if op in ("pow",):
                x = np.concatenate([x, np.abs(randoms(dt, 32, r))])
                y = np.concatenate([y, randoms(dt, 32, r)])
            c.add(name, op, [x, y], fn, cmp=cmp, jaxfn=fn.__name__)
    for dt in ALL:
        name = f"select/{dt}"
        r = rng(name)
        x, y = randoms(dt, 24, r), randoms(dt, 24, r)
        p = r.integers(0, 2, 24).astype(bool)
        c.add(name, "select", [p, x, y], lax.select, jaxfn="select")
    for src in ALL:
        for dst in ALL:
            name = f"convert/{src}/{dst}"
            x = np.concatenate([edges(src), randoms(src, 32, rng(name))])
            if src in FLOATS:  # values near the integer types' ranges, and fractions
                x = np.concatenate([x, np.array([0.4, 0.6, -0.6, 127.9, 128.5, 255.5, 256.0, -129.0,
                                                 2.0**31, -2.0**31, 2.0**32, 2.0**63, -2.0**63, 1e10, 65504.0, 65520.0,
                                                 3.4e38, 1e-40], dtype=np.float64).astype(NP[src])])  # may overflow to inf
            c.add(name, "convert", [x], lambda v, d=dst: lax.convert_element_type(v, NP[d]),
                  attrs={"dtype": dst}, jaxfn="convert_element_type")
    for src in ALL:
        for dst in ALL:
            if src == "bool" or dst == "bool" or NP[src].itemsize != NP[dst].itemsize:
                continue
            name = f"bitcast_convert/{src}/{dst}"
            x = np.concatenate([edges(src), randoms(src, 16, rng(name))])
            c.add(name, "bitcast_convert", [x], lambda v, d=dst: lax.bitcast_convert_type(v, NP[d]),
                  attrs={"dtype": dst}, jaxfn="bitcast_convert_type")


def take(x, idx, axis):
    """Ferry's gather: jnp.take along axis, indices clamped (lax.gather, CLIP)."""
    out_rank = x.ndim - 1 + idx.ndim
    offset = tuple(range(axis)) + tuple(range(axis + idx.ndim, out_rank))
    dn = lax.GatherDimensionNumbers(offset_dims=offset, collapsed_slice_dims=(axis,), start_index_map=(axis,))
    sizes = tuple(1 if i == axis else s for i, s in enumerate(x.shape))
    return lax.gather(x, idx[..., None], dn, sizes, mode=lax.GatherScatterMode.CLIP)


def scatter_add(x, idx, upd, axis):
    """Ferry's scatter_add: x.at[..., idx, ...].add(upd), out-of-range dropped."""
    out_rank = x.ndim - 1 + idx.ndim
    window = tuple(range(axis)) + tuple(range(axis + idx.ndim, out_rank))
    dn = lax.ScatterDimensionNumbers(update_window_dims=window, inserted_window_dims=(axis,),
                                     scatter_dims_to_operand_dims=(axis,))
    return lax.scatter_add(x, idx[..., None], upd, dn, mode=lax.GatherScatterMode.FILL_OR_DROP)


def reduce(kind, x, axes):
    dt = x.dtype
    if kind == "sum":
        init, f = 0, lax.add
    elif kind == "prod":
        init, f = 1, lax.mul
    elif kind == "max":
        init, f = (-np.inf if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).min), lax.max
    else:
        init, f = (np.inf if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).max), lax.min
    return lax.reduce(x, np.array(init, dtype=dt), f, tuple(axes))


# Partition specs of the sharding_constraint cases, over the mesh x=1, y=1 of
# the one CPU device (the Go test runs them on one device too): a name tag
# and the jax.sharding.PartitionSpec arguments for a [2, 3, 4] array.
SHARDING_SPECS = [("", ("x", None, "y")), ("/xy", (None, ("x", "y")))]


def constrained(spec):
    """jax.lax.with_sharding_constraint to spec over a 1x1 mesh of the CPU
    device, under jax.jit (where it is the identity on one device), and the
    sharding's text in Ferry's form, sharding<mesh[x=1,y=1], [x,{},y]>."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("x", "y"))
    s = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    dims = []
    for d in spec:
        if d is None:
            dims.append("{}")
        elif isinstance(d, str):
            dims.append(d)
        else:
            dims.append("{" + ",".join(d) + "}")
    axes = ",".join(f"{n}={mesh.shape[n]}" for n in mesh.axis_names)
    return jax.jit(lambda v: lax.with_sharding_constraint(v, s)), f"sharding<mesh[{axes}], [{','.join(dims)}]>"


def gen_structural(c):
    for dt in ALL:
        r = rng("shape/" + dt)
        x = np.concatenate([edges(dt), randoms(dt, 24 - len(edges(dt)) % 24, r)])[:24].reshape(2, 3, 4)
        c.add(f"constant/{dt}", "constant", [], lambda v=x: v, attrs={"value": enc(x)}, jaxfn="asarray")
        if dt != "bool":
            c.add(f"iota/{dt}", "iota", [], lambda d=dt: lax.broadcasted_iota(NP[d], (3, 4), 1),
                  attrs={"dtype": dt, "shape": [3, 4], "dim": 1}, jaxfn="broadcasted_iota")
        c.add(f"broadcast_in_dim/{dt}", "broadcast_in_dim", [x[:, :1, :]],
              lambda v: lax.broadcast_in_dim(v, (5, 2, 3, 4), (1, 2, 3)),
              attrs={"shape": [5, 2, 3, 4], "dims": [1, 2, 3]}, jaxfn="broadcast_in_dim")
        c.add(f"reshape/{dt}", "reshape", [x], lambda v: lax.reshape(v, (4, 6)), attrs={"shape": [4, 6]}, jaxfn="reshape")
        c.add(f"transpose/{dt}", "transpose", [x], lambda v: lax.transpose(v, (2, 0, 1)), attrs={"perm": [2, 0, 1]},
              jaxfn="transpose")
        c.add(f"slice/{dt}", "slice", [x], lambda v: lax.slice(v, (0, 1, 1), (2, 3, 4), (1, 1, 2)),
              attrs={"start": [0, 1, 1], "limit": [2, 3, 4], "strides": [1, 1, 2]}, jaxfn="slice")
        for starts in ([1, 1, 2], [-1, 5, 3], [0, 2, 100]):  # in range, clamped low and high
            sidx = [np.int32(s) for s in starts]
            c.add(f"dynamic_slice/{dt}/{starts}", "dynamic_slice", [x] + sidx,
                  lambda v, *s: lax.dynamic_slice(v, s, (1, 2, 2), allow_negative_indices=False),
                  attrs={"sizes": [1, 2, 2]}, jaxfn="dynamic_slice")
            u = randoms(dt, 4, r).reshape(1, 2, 2)
            c.add(f"dynamic_update_slice/{dt}/{starts}", "dynamic_update_slice", [x, u] + sidx,
                  lambda v, w, *s: lax.dynamic_update_slice(v, w, s, allow_negative_indices=False),
                  jaxfn="dynamic_update_slice")
        y = randoms(dt, 16, r).reshape(2, 2, 4)
        c.add(f"concatenate/{dt}", "concatenate", [x, y], lambda a, b: lax.concatenate([a, b], 1),
              attrs={"axis": 1}, jaxfn="concatenate")
        pv = randoms(dt, 1, r).reshape(())
        c.add(f"pad/{dt}", "pad", [x, pv], lambda v, p: lax.pad(v, p, [(1, 0, 0), (-1, 2, 1), (0, -1, 2)]),
              attrs={"low": [1, -1, 0], "high": [0, 2, -1], "interior": [0, 1, 2]}, jaxfn="pad")
        for idt in ("i32", "i64", "u32"):
            idx = np.array([[2, 0, 1], [-1, 3, 100]], dtype=np.int64)
            if idt == "u32":
                idx = np.array([[2, 0, 1], [1, 3, 100]])
            idx = idx.astype(NP[idt])
            c.add(f"gather/{dt}/{idt}", "gather", [x, idx], lambda v, i: take(v, i, 1), attrs={"axis": 1},
                  jaxfn="gather(CLIP)")
            if True:  # bool too: Ferry's scatter_add on bool is a logical or
                xs = small_ints(dt, (2, 3, 4), r)
                upd = small_ints(dt, (2, 2, 3, 4), r)
                c.add(f"scatter_add/{dt}/{idt}", "scatter_add", [xs, idx, upd],
                      lambda v, i, u: scatter_add(v, i, u, 1), attrs={"axis": 1}, jaxfn="scatter_add(FILL_OR_DROP)")
        if dt in ("f32", "i32"):  # more configurations: other axes, index and start dtypes
            idx = np.array([[1, -2], [0, 9]], dtype=np.int32)
            for axis in (0, 2):
                upd_shape = list(x.shape[:axis]) + [2, 2] + list(x.shape[axis + 1:])
                c.add(f"gather/{dt}/axis{axis}", "gather", [x, idx], lambda v, i, a=axis: take(v, i, a),
                      attrs={"axis": axis}, jaxfn="gather(CLIP)")
                c.add(f"scatter_add/{dt}/axis{axis}", "scatter_add", [small_ints(dt, x.shape, r), idx,
                                                                       small_ints(dt, upd_shape, r)],
                      lambda v, i, u, a=axis: scatter_add(v, i, u, a), attrs={"axis": axis},
                      jaxfn="scatter_add(FILL_OR_DROP)")
            for sdt in ("i64", "u32"):
                sidx = [np.array(s, dtype=NP[sdt]) for s in (1, 0, 3)]
                c.add(f"dynamic_slice/{dt}/{sdt}", "dynamic_slice", [x] + sidx,
                      lambda v, *s: lax.dynamic_slice(v, s, (1, 2, 2), allow_negative_indices=False),
                      attrs={"sizes": [1, 2, 2]}, jaxfn="dynamic_slice")
                c.add(f"dynamic_update_slice/{dt}/{sdt}", "dynamic_update_slice", [x, x[:1, 1:, :2]] + sidx,
                      lambda v, w, *s: lax.dynamic_update_slice(v, w, s, allow_negative_indices=False),
                      jaxfn="dynamic_update_slice")
        c.add(f"device_put/{dt}", "device_put", [x], lambda v: jax.device_put(v), attrs={"space": "pinned_host"},
              jaxfn="device_put")
        c.add(f"checkpoint_name/{dt}", "checkpoint_name", [x], lambda v: checkpoint_name(v, "x"), attrs={"name": "x"},
              jaxfn="checkpoint_name")
        c.add(f"optimization_barrier/{dt}", "optimization_barrier", [x, y],
              lambda a, b: lax.optimization_barrier((a, b)), jaxfn="optimization_barrier")
        for tag, spec in SHARDING_SPECS if dt == "f32" else SHARDING_SPECS[:1]:
            fn, text = constrained(spec)
            c.add(f"sharding_constraint/{dt}{tag}", "sharding_constraint", [x], fn, attrs={"sharding": text},
                  jaxfn="with_sharding_constraint")


def gen_reduce_sort_dot(c):
    for dt in ALL:
        r = rng("reduce/" + dt)
        if dt != "bool":
            for kind in ("sum", "max", "min", "prod"):
                op = "reduce_" + kind
                lo, hi = (-1, 3) if kind == "prod" else (-3, 4)
                x = small_ints(dt, (3, 4, 5), r, lo, hi)
                for axes in ([1], [0, 2], [0, 1, 2]):
                    c.add(f"{op}/{dt}/ints/{axes}", op, [x], lambda v, k=kind, a=axes: reduce(k, v, a),
                          attrs={"axes": axes}, jaxfn="reduce(" + kind + ")")
                if dt in FLOATS:
                    # Random positive values (no cancellation), compared in ulps;
                    # and edge values (NaN, Inf) in max/min/sum, exact.
                    y = np.abs(randoms(dt, 3 * 64, r, 0.5, 2.0)).reshape(3, 64)
                    c.add(f"{op}/{dt}/random", op, [y], lambda v, k=kind: reduce(k, v, [1]),
                          attrs={"axes": [1]}, cmp="ulp" if kind in ("sum", "prod") else "exact",
                          jaxfn="reduce(" + kind + ")")
                    e = edges(dt)
                    z = np.stack([e, np.roll(e, 3), np.roll(e, 7)], 1)
                    z = np.nan_to_num(z, nan=1.0) if kind in ("sum", "prod") else z
                    if kind in ("max", "min"):
                        c.add(f"{op}/{dt}/edges", op, [z], lambda v, k=kind: reduce(k, v, [1]),
                              attrs={"axes": [1]}, jaxfn="reduce(" + kind + ")")
                    else:
                        c.add(f"{op}/{dt}/nan", op, [np.array([[1, np.nan, 2], [np.inf, -np.inf, 1], [np.inf, 1, 2]],
                                                             dtype=NP[dt])],
                              lambda v, k=kind: reduce(k, v, [1]), attrs={"axes": [1]}, jaxfn="reduce(" + kind + ")")
        for op, f in (("argmax", lax.argmax), ("argmin", lax.argmin)):
            for idt in ("i32", "i64"):
                x = randoms(dt, 20, r).reshape(4, 5) if dt != "bool" else r.integers(0, 2, (4, 5)).astype(bool)
                if dt in FLOATS:
                    x[1, 3] = np.nan
                    x[2, :] = x[2, 0]  # ties: first index
                    x[3, 1], x[3, 2] = -0.0, 0.0
                if dt in INTS:
                    x[2, :] = x[2, 0]
                for axis in (0, 1):
                    c.add(f"{op}/{dt}/{idt}/{axis}", op, [x], lambda v, a=axis, i=idt: f(v, a, NP[i]),
                          attrs={"axis": axis, "dtype": idt}, jaxfn=op)
        # sort: one operand with edges and ties; two operands, two keys.
        e = edges(dt)
        n = len(e)
        x = np.stack([e, r.permutation(e), np.concatenate([e[: n // 2], e[: n - n // 2]])])
        c.add(f"sort/{dt}/1", "sort", [x], lambda v: lax.sort(v, dimension=1, is_stable=True, num_keys=1),
              attrs={"dimension": 1, "num_keys": 1}, jaxfn="sort")
        k1 = small_ints(dt, (6, 5), r, -1, 2)
        k2 = r.permutation(np.resize(e, 30)).reshape(6, 5)
        v = np.arange(30, dtype=np.int32).reshape(6, 5)
        c.add(f"sort/{dt}/3", "sort", [k1, k2, v],
              lambda a, b, w: lax.sort((a, b, w), dimension=0, is_stable=True, num_keys=2),
              attrs={"dimension": 0, "num_keys": 2}, jaxfn="sort")
        if dt != "bool":
            dims = {"lhs_batch": [0], "rhs_batch": [0], "lhs_contract": [2], "rhs_contract": [1]}
            dn = (([2], [1]), ([0], [0]))
            a, b = small_ints(dt, (2, 3, 5), r), small_ints(dt, (2, 5, 4), r)
            c.add(f"dot_general/{dt}/ints", "dot_general", [a, b], lambda p, q: lax.dot_general(p, q, dn),
                  attrs=dims, jaxfn="dot_general")
            a, b = small_ints(dt, (4, 3), r), small_ints(dt, (4, 2), r)
            c.add(f"dot_general/{dt}/ints2", "dot_general", [a, b], lambda p, q: lax.dot_general(p, q, (([0], [0]), ([], []))),
                  attrs={"lhs_batch": [], "rhs_batch": [], "lhs_contract": [0], "rhs_contract": [0]}, jaxfn="dot_general")
            a, b = small_ints(dt, (2, 3, 4, 5), r), small_ints(dt, (2, 5, 4, 6), r)
            c.add(f"dot_general/{dt}/ints3", "dot_general", [a, b],
                  lambda p, q: lax.dot_general(p, q, (([2, 3], [2, 1]), ([0], [0]))),
                  attrs={"lhs_batch": [0], "rhs_batch": [0], "lhs_contract": [2, 3], "rhs_contract": [2, 1]},
                  jaxfn="dot_general")
            if dt in FLOATS:
                a, b = randoms(dt, 2 * 3 * 40, r, 0.5, 2).reshape(2, 3, 40), randoms(dt, 2 * 40 * 4, r, 0.5, 2).reshape(2, 40, 4)
                c.add(f"dot_general/{dt}/random", "dot_general", [a, b], lambda p, q: lax.dot_general(p, q, (([2], [1]), ([0], [0]))),
                      attrs=dims, cmp="ulp", jaxfn="dot_general")


# ---- random -----------------------------------------------------------------

def key_data(k):
    return [int(w) for w in np.asarray(k)]


def gen_random(rows):
    seeds = [0, 42, 2**32 + 7, 2**40 + 12345]
    shapes = [[5], [3, 4], [2, 3, 5]]
    dts = ["f32", "bf16", "f16", "f64"]

    def row(name, fn, part, key, params, out):
        rows.append({"name": name, "fn": fn, "partitionable": part, "key": key, "params": params,
                     "out": enc(np.asarray(out))})

    for part in (True, False):
        jax.config.update("jax_threefry_partitionable", part)
        p = "p" if part else "o"
        # PRNGKey of 64-bit seeds needs x64.
        jax.config.update("jax_enable_x64", True)
        for s in seeds:
            row(f"{p}/key/{s}", "key", part, None, {"seed": s}, jax.random.PRNGKey(s))
        keys = [key_data(jax.random.PRNGKey(s)) for s in seeds] + [[0x12345678, 0x9ABCDEF0]]
        for x64 in (False, True):
            jax.config.update("jax_enable_x64", x64)
            for ki, k in enumerate(keys):
                key = jnp.array(k, dtype=jnp.uint32)
                if not x64:
                    for n in (1, 2, 3):
                        row(f"{p}/split/{ki}/{n}", "split", part, k, {"n": n}, jax.random.split(key, n))
                    for d in (0, 7, 0xFFFFFFFF):
                        row(f"{p}/fold_in/{ki}/{d}", "fold_in", part, k, {"data": d}, jax.random.fold_in(key, d))
                    for sh in shapes + [[7], [1]]:
                        row(f"{p}/bits/{ki}/{sh}", "bits", part, k, {"shape": sh}, jax.random.bits(key, tuple(sh)))
                    for sh in shapes:
                        row(f"{p}/bernoulli/{ki}/{sh}", "bernoulli", part, k, {"shape": sh, "p": 0.3},
                            jax.random.bernoulli(key, 0.3, tuple(sh)))
                    for n in (1, 5, 100):
                        row(f"{p}/permutation/{ki}/{n}", "permutation", part, k, {"n": n},
                            jax.random.permutation(key, n))
                for dt in dts:
                    if (dt == "f64") != x64:
                        continue
                    d = NP[dt]
                    for sh in shapes:
                        row(f"{p}/uniform/{ki}/{dt}/{sh}", "uniform", part, k,
                            {"dtype": dt, "shape": sh, "lo": 0.0, "hi": 1.0},
                            jax.random.uniform(key, tuple(sh), d))
                        row(f"{p}/uniform/{ki}/{dt}/{sh}/-2,3", "uniform", part, k,
                            {"dtype": dt, "shape": sh, "lo": -2.0, "hi": 3.0},
                            jax.random.uniform(key, tuple(sh), d, -2.0, 3.0))
                        row(f"{p}/normal/{ki}/{dt}/{sh}", "normal", part, k, {"dtype": dt, "shape": sh},
                            jax.random.normal(key, tuple(sh), d))
                        row(f"{p}/truncated_normal/{ki}/{dt}/{sh}", "truncated_normal", part, k,
                            {"dtype": dt, "shape": sh, "lower": -2.0, "upper": 1.5},
                            jax.random.truncated_normal(key, -2.0, 1.5, tuple(sh), d))
                    lg = np.linspace(-2, 2, 15).reshape(3, 5).astype(d)
                    for axis in (0, 1):
                        row(f"{p}/categorical/{ki}/{dt}/{axis}", "categorical", part, k,
                            {"logits": enc(lg), "axis": axis}, jax.random.categorical(key, lg, axis))
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_threefry_partitionable", True)


# ---- gradients -----------------------------------------------------------------

GRAD_DTYPES = ["f32", "f64"]
# bf16 too for a few ops (the rest of bf16 is the same rules in a narrower type).
GRAD_BF16 = {"add", "mul", "exp", "tanh", "reduce_sum", "dot_general", "convert"}


def grad_case(rows, name, op, args, fn, diff, attrs=None):
    """Records jax.vjp of fn at args with respect to the args numbered diff,
    with a random cotangent (seeded by the case name) for every output."""
    args = [np.asarray(a) for a in args]
    r = rng("ct/" + name)

    def f(*d):
        full = list(args)
        for i, v in zip(diff, d):
            full[i] = v
        out = fn(*[jnp.asarray(a) for a in full])
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    outs, pull = jax.vjp(f, *[jnp.asarray(args[i]) for i in diff])
    cts = []
    for o in outs:
        dt = ferry_name(o.dtype)
        cts.append(np.asarray(r.uniform(-2, 2, o.shape)).astype(NP[dt]))
    grads = pull(tuple(jnp.asarray(c) for c in cts))
    rows.append({
        "name": name, "op": op, "attrs": attrs or {}, "diff": list(diff),
        "args": [enc(a) for a in args], "outs": [enc(np.asarray(o)) for o in outs],
        "cts": [enc(c) for c in cts], "grads": [enc(np.asarray(g)) for g in grads],
    })


def away(dt, shape, r, lo=0.3, hi=2.0):
    """Random values with lo <= |v| < hi, either sign."""
    v = r.uniform(lo, hi, shape) * np.where(r.integers(0, 2, shape) == 1, 1.0, -1.0)
    return v.astype(NP[dt])


def gen_grad_ops(rows):
    domain = {"log": (0.3, 3.0), "sqrt": (0.3, 3.0), "rsqrt": (0.3, 3.0), "log1p": (-0.5, 3.0)}
    for op, (fn, _, _) in UNARY.items():
        if op == "not":
            continue
        for dt in GRAD_DTYPES + (["bf16"] if op in GRAD_BF16 else []):
            name = f"{op}/{dt}"
            r = rng("grad/" + name)
            lo, hi = domain.get(op, (-2.0, 2.0))
            if op in ("floor", "ceil", "round", "abs", "sign"):  # away from the kinks
                x = (r.integers(-3, 3, 24) + r.uniform(0.1, 0.4, 24)).astype(NP[dt])
            else:
                x = r.uniform(lo, hi, 24).astype(NP[dt])
            grad_case(rows, name, op, [x.reshape(4, 6)], fn, [0])
    for op in ("add", "sub", "mul", "div", "pow", "max", "min", "rem"):
        fn = BINARY[op][0]
        for dt in GRAD_DTYPES + (["bf16"] if op in GRAD_BF16 else []):
            name = f"{op}/{dt}"
            r = rng("grad/" + name)
            if op == "pow":
                x, y = r.uniform(0.3, 3.0, 24).astype(NP[dt]), r.uniform(-2, 2, 24).astype(NP[dt])
            elif op == "rem":  # away from the jumps of x mod y
                y = away(dt, 24, r, 0.5, 2.0)
                x = (y.astype(np.float64) * (r.integers(-3, 3, 24) + r.uniform(0.2, 0.8, 24))).astype(NP[dt])
            else:
                x, y = away(dt, 24, r), away(dt, 24, r)
            grad_case(rows, name, op, [x.reshape(4, 6), y.reshape(4, 6)], fn, [0, 1])
    # The conventions at the points where the derivative is not defined:
    # ties of max/min (JAX splits the cotangent equally), pow at x = 0,
    # abs at 0, ties in reductions and sort.
    for dt in GRAD_DTYPES:
        r = rng("grad/edges/" + dt)
        a = r.integers(-2, 3, (4, 6)).astype(NP[dt])
        b = np.where(r.integers(0, 2, (4, 6)) == 1, a, r.integers(-2, 3, (4, 6))).astype(NP[dt])
        for op in ("max", "min"):
            grad_case(rows, f"{op}/{dt}/ties", op, [a, b], BINARY[op][0], [0, 1])
        grad_case(rows, f"abs/{dt}/zero", "abs", [a], UNARY["abs"][0], [0])
        px = np.array([0, 0, 0, 0, 2, -2], dtype=NP[dt])
        py = np.array([2, 3, 1, 0, 0, 2], dtype=NP[dt])
        grad_case(rows, f"pow/{dt}/zero", "pow", [px, py], lax.pow, [0, 1])
        t = r.integers(-1, 2, (3, 4, 5)).astype(NP[dt])
        for kind, jf in (("max", jnp.max), ("min", jnp.min), ("prod", jnp.prod)):
            grad_case(rows, f"reduce_{kind}/{dt}/ties", "reduce_" + kind, [t],
                      lambda v, f=jf: f(v, axis=(1,)), [0], attrs={"axes": [1]})
        grad_case(rows, f"sort/{dt}/ties", "sort", [t], lambda v: lax.sort(v, dimension=2, num_keys=1), [0],
                  attrs={"dimension": 2, "num_keys": 1})
    for dt in GRAD_DTYPES:
        r = rng("grad/select/" + dt)
        p = r.integers(0, 2, (4, 6)).astype(bool)
        grad_case(rows, f"select/{dt}", "select", [p, away(dt, (4, 6), r), away(dt, (4, 6), r)], lax.select, [1, 2])
    for src, dst in (("f32", "f64"), ("f64", "f32"), ("f32", "bf16"), ("bf16", "f32")):
        r = rng(f"grad/convert/{src}/{dst}")
        grad_case(rows, f"convert/{src}/{dst}", "convert", [away(src, (4, 6), r)],
                  lambda v, d=dst: lax.convert_element_type(v, NP[d]), [0], attrs={"dtype": dst})
    for dt in GRAD_DTYPES:
        r = rng("grad/shape/" + dt)
        x = away(dt, (2, 3, 4), r)
        grad_case(rows, f"broadcast_in_dim/{dt}", "broadcast_in_dim", [x[:, :1, :]],
                  lambda v: lax.broadcast_in_dim(v, (5, 2, 3, 4), (1, 2, 3)), [0],
                  attrs={"shape": [5, 2, 3, 4], "dims": [1, 2, 3]})
        grad_case(rows, f"reshape/{dt}", "reshape", [x], lambda v: lax.reshape(v, (4, 6)), [0], attrs={"shape": [4, 6]})
        grad_case(rows, f"transpose/{dt}", "transpose", [x], lambda v: lax.transpose(v, (2, 0, 1)), [0],
                  attrs={"perm": [2, 0, 1]})
        grad_case(rows, f"slice/{dt}", "slice", [x], lambda v: lax.slice(v, (0, 1, 1), (2, 3, 4), (1, 1, 2)), [0],
                  attrs={"start": [0, 1, 1], "limit": [2, 3, 4], "strides": [1, 1, 2]})
        for starts in ([1, 1, 2], [-1, 5, 3]):  # in range and clamped
            sidx = [np.int32(s) for s in starts]
            grad_case(rows, f"dynamic_slice/{dt}/{starts}", "dynamic_slice", [x] + sidx,
                      lambda v, *s: lax.dynamic_slice(v, s, (1, 2, 2), allow_negative_indices=False), [0],
                      attrs={"sizes": [1, 2, 2]})
            grad_case(rows, f"dynamic_update_slice/{dt}/{starts}", "dynamic_update_slice",
                      [x, away(dt, (1, 2, 2), r)] + sidx,
                      lambda v, w, *s: lax.dynamic_update_slice(v, w, s, allow_negative_indices=False), [0, 1])
        grad_case(rows, f"concatenate/{dt}", "concatenate", [x, away(dt, (2, 2, 4), r), away(dt, (2, 1, 4), r)],
                  lambda a, b, c: lax.concatenate([a, b, c], 1), [0, 1, 2], attrs={"axis": 1})
        grad_case(rows, f"pad/{dt}", "pad", [x, away(dt, (), r)],
                  lambda v, p: lax.pad(v, p, [(1, 0, 0), (-1, 2, 1), (0, -1, 2)]), [0, 1],
                  attrs={"low": [1, -1, 0], "high": [0, 2, -1], "interior": [0, 1, 2]})
        idx = np.array([[2, 0, 1], [-1, 2, 100]], dtype=np.int32)  # repeats and clamped
        grad_case(rows, f"gather/{dt}", "gather", [x, idx], lambda v, i: take(v, i, 1), [0], attrs={"axis": 1})
        idx2 = np.array([[1, -2], [0, 1]], dtype=np.int32)
        grad_case(rows, f"gather/{dt}/axis2", "gather", [x, idx2], lambda v, i: take(v, i, 2), [0], attrs={"axis": 2})
        sidx = np.array([[2, 0, 1], [1, 2, 1]], dtype=np.int32)  # in range: dropped ones have no gradient either way
        grad_case(rows, f"scatter_add/{dt}", "scatter_add", [x, sidx, away(dt, (2, 2, 3, 4), r)],
                  lambda v, i, u: scatter_add(v, i, u, 1), [0, 2], attrs={"axis": 1})
        for kind, jf in (("sum", jnp.sum), ("max", jnp.max), ("min", jnp.min), ("prod", jnp.prod)):
            y = away(dt, (3, 4, 5), r, 0.5, 1.5)
            for axes in ([1], [0, 2]):
                d = dt
                grad_case(rows, f"reduce_{kind}/{d}/{axes}", "reduce_" + kind, [y],
                          lambda v, f=jf, a=axes: f(v, axis=tuple(a)), [0], attrs={"axes": axes})
        if "reduce_sum" in GRAD_BF16 and dt == "f32":
            grad_case(rows, "reduce_sum/bf16/[1]", "reduce_sum", [away("bf16", (3, 4, 5), r)],
                      lambda v: jnp.sum(v, axis=1), [0], attrs={"axes": [1]})
        s = away(dt, (3, 7), r)
        grad_case(rows, f"sort/{dt}/1", "sort", [s], lambda v: lax.sort(v, dimension=1, num_keys=1), [0],
                  attrs={"dimension": 1, "num_keys": 1})
        grad_case(rows, f"sort/{dt}/2", "sort", [s, away(dt, (3, 7), r)],
                  lambda a, b: lax.sort((a, b), dimension=0, num_keys=1), [0, 1], attrs={"dimension": 0, "num_keys": 1})
        for dn, ls, rs, tag in (((([2], [1]), ([0], [0])), (2, 3, 5), (2, 5, 4), "batch"),
                                 ((([0], [0]), ([], [])), (4, 3), (4, 2), "t"),
                                 ((([2, 3], [2, 1]), ([0], [0])), (2, 3, 4, 5), (2, 5, 4, 6), "two")):
            for d in [dt] + (["bf16"] if dt == "f32" else []):
                grad_case(rows, f"dot_general/{d}/{tag}", "dot_general", [away(d, ls, r), away(d, rs, r)],
                          lambda p, q, n=dn: lax.dot_general(p, q, n), [0, 1],
                          attrs={"lhs_contract": list(dn[0][0]), "rhs_contract": list(dn[0][1]),
                                 "lhs_batch": list(dn[1][0]), "rhs_batch": list(dn[1][1])})
        grad_case(rows, f"device_put/{dt}", "device_put", [x], lambda v: jax.device_put(v), [0],
                  attrs={"space": "pinned_host"})
        grad_case(rows, f"checkpoint_name/{dt}", "checkpoint_name", [x], lambda v: checkpoint_name(v, "x"), [0],
                  attrs={"name": "x"})
        grad_case(rows, f"optimization_barrier/{dt}", "optimization_barrier", [x, away(dt, (2, 2), r)],
                  lambda a, b: lax.optimization_barrier((a, b)), [0, 1])
        for tag, spec in SHARDING_SPECS:
            fn, text = constrained(spec)
            grad_case(rows, f"sharding_constraint/{dt}{tag}", "sharding_constraint", [x], fn, [0],
                      attrs={"sharding": text})


def normal(dt, shape, r, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(NP[dt])


def prog_case(rows, name, program, inputs, loss, diff):
    """Records loss(*inputs) and, when diff is not empty, jax.grad of it
    with respect to the inputs numbered diff. inputs is a list of
    (name, array) pairs, passed to loss in order."""
    names = [n for n, _ in inputs]
    arrs = [np.asarray(a) for _, a in inputs]

    def f(*d):
        full = [jnp.asarray(a) for a in arrs]
        for i, v in zip(diff, d):
            full[i] = v
        return loss(*full)

    if diff:
        val, grads = jax.value_and_grad(f, argnums=tuple(range(len(diff))))(*[jnp.asarray(arrs[i]) for i in diff])
    else:
        val, grads = f(), ()
    want = ferry_name(arrs[0].dtype)
    for o in [val] + list(grads):  # a stray float64 constant would promote an f32 program
        assert ferry_name(np.asarray(o).dtype) == want, (name, np.asarray(o).dtype)
    rows.append({
        "name": name, "program": program, "names": names, "diff": list(diff),
        "args": [enc(a) for a in arrs], "outs": [enc(np.asarray(val))], "grads": [enc(np.asarray(g)) for g in grads],
    })


def mlp_loss(x, onehot, w1, b1, w2, b2):
    """Mean softmax cross-entropy of a ReLU MLP."""
    h = jax.nn.relu(x @ w1 + b1)
    logits = h @ w2 + b2
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.sum(onehot * logits, axis=1))


def layer_norm(x, scale, bias, eps=1e-6):
    """nn.LayerNorm: (x - mean)/sqrt(var + eps)*scale + bias over the last axis."""
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    v = jnp.mean(xc * xc, axis=-1, keepdims=True)
    return xc * lax.rsqrt(v + eps) * scale + bias


def block_apply(x, ln1s, ln1b, wq, wk, wv, wo, ln2s, ln2b, w1, b1, w2, b2, heads):
    """nn.Block: pre-norm causal multi-head attention without biases and a
    tanh-GELU MLP, each added to its input."""
    b, t, d = x.shape
    dh = d // heads
    h = layer_norm(x, ln1s, ln1b)
    split = lambda w: (h @ w).reshape(b, t, heads, dh)  # noqa: E731
    q, k, v = split(wq), split(wk), split(wv)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * float(1 / np.sqrt(dh))  # weak: keeps f32 f32
    mask = np.arange(t)[:, None] >= np.arange(t)[None, :]
    s = jnp.where(mask, s, -1e30)
    p = jax.nn.softmax(s, axis=3)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, d)
    x = x + o @ wo
    h = layer_norm(x, ln2s, ln2b)
    return x + jax.nn.gelu(h @ w1 + b1, approximate=True) @ w2 + b2


def scan_loss(x, w1, w2):
    """examples/offload's model: x = x @ w1[i] @ w2[i] for every layer, summed."""
    final, _ = lax.scan(lambda c, w: (c @ w[0] @ w[1], None), x, (w1, w2))
    return jnp.sum(final)


def remat_body(c, w):
    """One step of the remat'd scan: c = tanh(c @ w) * c + sin(c)."""
    return jnp.tanh(c @ w) * c + jnp.sin(c)


def control_loss(x, w, a):
    """fori_loop (3 steps of tanh(x @ w) + 0.1·i) then a cond on sum(x) > 0."""
    x = lax.fori_loop(0, 3, lambda i, s: jnp.tanh(s @ w) + 0.1 * i.astype(s.dtype), x)
    y = lax.cond(jnp.sum(x) > 0, lambda v: jnp.sin(v) * a, lambda v: jnp.cos(v) * a * a, x)
    return jnp.sum(y * y)


def while_value(x, w):
    """while sum(x) < 50: x = x*1.5 + w (forward only: Ferry's While has no VJP)."""
    out = lax.while_loop(lambda s: jnp.sum(s) < 50, lambda s: s * 1.5 + w, x)
    return jnp.sum(out * out)


def vmap_mlp_loss(x, onehot, w1, b1, w2, b2, proj):
    """Per-example gradients of mlp_loss with respect to w1 (jax.vmap of
    jax.grad over the examples, the parameters not mapped), projected on proj
    and summed: the value checks vmap of grad, the gradient grad of vmap of
    grad."""
    per = jax.vmap(jax.grad(lambda w, xe, oe: mlp_loss(xe[None], oe[None], w, b1, w2, b2)), in_axes=(None, 0, 0))
    return jnp.sum(per(w1, x, onehot) * proj)


def vmap_scan_loss(xs, w1, w2, weights):
    """scan_loss mapped over axis 1 of xs (the examples), weighted and summed."""
    return jnp.sum(jax.vmap(lambda x: scan_loss(x, w1, w2), in_axes=1)(xs) * weights)


def vmap_while_value(x, w):
    """while_value's loop mapped over the rows of x: each row stops after its
    own number of steps (a batched predicate)."""
    out = jax.vmap(lambda s0: lax.while_loop(lambda s: jnp.sum(s) < 50, lambda s: s * 1.5 + w, s0))(x)
    return jnp.sum(out * out)


def collectives_per_example(x):
    """Every differentiable collective of one example x (f[6, 4]) over the
    vmap axis 'i' of size 3, each output squashed by tanh and summed."""
    outs = [
        lax.psum(jnp.tanh(x), "i"), lax.pmean(x * x, "i"),
        lax.all_gather(x, "i", axis=1), lax.all_gather(x, "i", axis=0, tiled=True),
        lax.psum_scatter(x, "i", scatter_dimension=0, tiled=True),
        lax.psum_scatter(x[:, :3], "i", scatter_dimension=1),
        lax.all_to_all(x, "i", 0, 1, tiled=True),
        lax.ppermute(x, "i", [(0, 1), (1, 2), (2, 0)]),
        lax.axis_index("i").astype(x.dtype) * x,
    ]
    return sum(jnp.sum(jnp.tanh(o)) for o in outs)


def vmap_collectives_loss(x):
    """collectives_per_example under jax.vmap with axis_name 'i', summed over
    the examples: the gradient checks grad of vmap (the batching rules)."""
    return jnp.sum(jax.vmap(collectives_per_example, axis_name="i")(x))


def vmap_grad_collectives_loss(x, proj):
    """Per-example gradients of collectives_per_example (jax.vmap of jax.grad
    with axis_name 'i': the collectives' transposes), projected on proj and
    summed; the gradient is grad of vmap of grad."""
    return jnp.sum(jax.vmap(jax.grad(collectives_per_example), axis_name="i")(x) * proj)


def vmap_minmax_value(x):
    """pmax and pmin over the vmap axis (forward only: JAX does not
    differentiate them)."""
    f = lambda e: jnp.tanh(lax.pmax(e, "i")) * lax.pmin(e, "i")
    return jnp.sum(jax.vmap(f, axis_name="i")(x))


def gen_grad_programs(rows):
    for dt in ("f32", "f64"):
        r = rng("prog/mlp/" + dt)
        n, i, hdn, o = 8, 32, 16, 10
        onehot = np.eye(o)[r.integers(0, o, n)].astype(NP[dt])
        prog_case(rows, f"mlp/{dt}", "mlp", [
            ("x", normal(dt, (n, i), r)), ("onehot", onehot),
            ("w1", normal(dt, (i, hdn), r, i ** -0.5)), ("b1", normal(dt, (hdn,), r, 0.1)),
            ("w2", normal(dt, (hdn, o), r, hdn ** -0.5)), ("b2", normal(dt, (o,), r, 0.1))],
            mlp_loss, [0, 2, 3, 4, 5])

        r = rng("prog/block/" + dt)
        b, t, d, heads, hid = 2, 5, 8, 2, 16
        ins = [("x", normal(dt, (b, t, d), r)),
               ("ln1_scale", (1 + normal(dt, (d,), r, 0.1)).astype(NP[dt])), ("ln1_bias", normal(dt, (d,), r, 0.1))]
        ins += [(n_, normal(dt, (d, d), r, d ** -0.5)) for n_ in ("wq", "wk", "wv", "wo")]
        ins += [("ln2_scale", (1 + normal(dt, (d,), r, 0.1)).astype(NP[dt])), ("ln2_bias", normal(dt, (d,), r, 0.1)),
                ("w1", normal(dt, (d, hid), r, d ** -0.5)), ("b1", normal(dt, (hid,), r, 0.1)),
                ("w2", normal(dt, (hid, d), r, hid ** -0.5)), ("b2", normal(dt, (d,), r, 0.1)),
                ("weights", normal(dt, (b, t, d), r))]
        prog_case(rows, f"block/{dt}", "block", ins,
                  lambda *a: jnp.sum(block_apply(*a[:-1], heads=heads) * a[-1]), list(range(13)))

        r = rng("prog/scan/" + dt)
        L, n, d1, d2 = 10, 4, 6, 8
        prog_case(rows, f"scan/{dt}", "scan", [
            ("x", normal(dt, (n, d1), r)), ("w1", normal(dt, (L, d1, d2), r, d1 ** -0.5)),
            ("w2", normal(dt, (L, d2, d1), r, d2 ** -0.5))], scan_loss, [0, 1, 2])

        r = rng("prog/remat/" + dt)
        L, n, d1 = 6, 3, 5
        for pname, policy in (("dots_saveable", jax.checkpoint_policies.dots_saveable),
                              ("nothing_saveable", jax.checkpoint_policies.nothing_saveable)):
            body = jax.checkpoint(remat_body, policy=policy)
            prog_case(rows, f"remat_scan/{pname}/{dt}", "remat_scan/" + pname, [
                ("x", normal(dt, (n, d1), r, 0.5)), ("ws", normal(dt, (L, d1, d1), r, d1 ** -0.5))],
                lambda x, ws, f=body: jnp.sum(lax.scan(lambda c, w: (f(c, w), None), x, ws)[0]), [0, 1])

        r = rng("prog/control/" + dt)
        w = normal(dt, (4, 4), r, 0.5)
        a = normal(dt, (4,), r)
        for tag, sign in (("true", 1.0), ("false", -1.0)):
            # The sign of the input picks the branch (tanh keeps it for small weights).
            x = (sign * np.abs(normal(dt, (3, 4), r)) + sign).astype(NP[dt])
            prog_case(rows, f"control/{tag}/{dt}", "control", [("x", x), ("w", np.abs(w)), ("a", a)],
                      control_loss, [0, 1, 2])
        prog_case(rows, f"while/{dt}", "while", [("x", np.abs(normal(dt, (2, 3), r))), ("w", np.abs(normal(dt, (2, 3), r)))],
                  while_value, [])

        r = rng("prog/vmap_mlp/" + dt)
        n, i, hdn, o = 6, 12, 8, 5
        onehot = np.eye(o)[r.integers(0, o, n)].astype(NP[dt])
        prog_case(rows, f"vmap_mlp/{dt}", "vmap_mlp", [
            ("x", normal(dt, (n, i), r)), ("onehot", onehot),
            ("w1", normal(dt, (i, hdn), r, i ** -0.5)), ("b1", normal(dt, (hdn,), r, 0.1)),
            ("w2", normal(dt, (hdn, o), r, hdn ** -0.5)), ("b2", normal(dt, (o,), r, 0.1)),
            ("proj", normal(dt, (n, i, hdn), r))],
            vmap_mlp_loss, [0, 2, 3, 4, 5])

        r = rng("prog/vmap_scan/" + dt)
        L, n, b, d1, d2 = 4, 3, 5, 6, 8
        prog_case(rows, f"vmap_scan/{dt}", "vmap_scan", [
            ("xs", normal(dt, (n, b, d1), r)), ("w1", normal(dt, (L, d1, d2), r, d1 ** -0.5)),
            ("w2", normal(dt, (L, d2, d1), r, d2 ** -0.5)), ("weights", normal(dt, (b,), r))],
            vmap_scan_loss, [0, 1, 2])

        r = rng("prog/vmap_collectives/" + dt)
        prog_case(rows, f"vmap_collectives/{dt}", "vmap_collectives", [("x", normal(dt, (3, 6, 4), r))],
                  vmap_collectives_loss, [0])
        prog_case(rows, f"vmap_grad_collectives/{dt}", "vmap_grad_collectives", [
            ("x", normal(dt, (3, 6, 4), r)), ("proj", normal(dt, (3, 6, 4), r))], vmap_grad_collectives_loss, [0])
        prog_case(rows, f"vmap_minmax/{dt}", "vmap_minmax", [("x", normal(dt, (3, 6, 4), r))], vmap_minmax_value, [])

        r = rng("prog/vmap_while/" + dt)
        x = np.abs(normal(dt, (4, 3), r)) * np.array([[0.1], [1], [5], [20]], dtype=NP[dt])
        prog_case(rows, f"vmap_while/{dt}", "vmap_while", [("x", x), ("w", np.abs(normal(dt, (3,), r)))],
                  vmap_while_value, [])


# ---- files -------------------------------------------------------------------

def render(meta, rows):
    """One JSON object per line: the header, then one line per case."""
    lines = [json.dumps(meta, sort_keys=True, separators=(",", ":"))]
    lines += [json.dumps(r, sort_keys=True, separators=(",", ":")) for r in rows]
    return ("\n".join(lines) + "\n").encode()


def build():
    meta = {"jax": jax.__version__, "numpy": np.__version__}
    c = Cases()
    gen_elementwise(c)
    gen_structural(c)
    gen_reduce_sort_dot(c)
    ops = render(dict(meta, unsupported=c.unsupported, kind="ops"), c.rows)
    rr = []
    gen_random(rr)
    rnd = render(dict(meta, kind="random"), rr)
    gr = []
    gen_grad_ops(gr)
    gp = []
    gen_grad_programs(gp)
    grads = render(dict(meta, kind="grads", programs=len(gp)), gr + gp)
    return {"ops.jsonl.gz": ops, "random.jsonl.gz": rnd, "grads.jsonl.gz": grads}


# ---- the check ---------------------------------------------------------------
#
# XLA does not give the same last bits on every CPU: its CPU backend picks
# instructions and kernels by the host's vector extensions. Between an AVX2
# host (where the committed files were made) and an AVX-512 one, JAX 0.10.2
# gives f64 rsqrt 1 ulp apart (with AVX-512 XLA refines the hardware
# estimate by Newton steps, xla/codegen/math/rsqrt.h, "within 1 ULP";
# neither result is always the correctly rounded one), f32 matrix products a
# few ulps apart (the matrix kernels block by vector width), and so every
# gradient and program built on them; everything else came out
# bit-identical. --check therefore compares the regenerated results with
# the committed ones within a tolerance in ulps per op and dtype, each within
# what JAX's own tests allow for that op, and bit for bit (every NaN equal to
# every NaN) wherever XLA is exact: arithmetic, compares, conversions, moves,
# integer and bitwise ops, gathers, sorts, sqrt, and every jax.random result.
# Inputs, cotangents, attributes, case lists and headers must be identical.

EPS = {"f64": 2.0 ** -52, "f32": 2.0 ** -23, "bf16": 2.0 ** -7, "f16": 2.0 ** -10}

# JAX's default test tolerance (jax._src.public_test_util._default_tolerance:
# 1e-15 in f64, 1e-6 in f32, 1e-2 in bf16, 1e-3 in f16, which
# JaxTestCase.assertAllClose uses as both rtol and atol) in ulps,
# floor(tol / eps): n ulps of x are at most n·eps·|x|, within it.
JAX_DEFAULT_ULPS = {"f64": 4, "f32": 8, "bf16": 1, "f16": 1}

# The ops XLA does not compute exactly, with their tolerance in ulps per
# dtype; every other op is compared bit for bit.
CHECK_ULPS = {
    # tests/lax_test.py testOpAgainstNumpy compares each of these with NumPy
    # at the default tolerance (lax_test_util.lax_ops lists them without a
    # tol of their own; it loosens f64 expm1 and tanh to 1e-8 and 1e-9, as
    # XLA's are about float32-accurate there, which differences between CPUs
    # do not need). Measured: f64 rsqrt 1 ulp. sqrt is not here: XLA lowers
    # it to the IEEE 754 square root instruction, correctly rounded on every
    # CPU (f16 and bf16 through f32, rounded once more).
    **{op: JAX_DEFAULT_ULPS for op in
       ("exp", "log", "log1p", "expm1", "rsqrt", "tanh", "logistic", "sin", "cos", "erf", "pow")},
    # testReduce checks lax.reduce against NumPy at the default tolerance;
    # a float sum or product depends on the order XLA's loops add in.
    "reduce_sum": JAX_DEFAULT_ULPS,
    "reduce_prod": JAX_DEFAULT_ULPS,
    # testDotGeneralAgainstNumpy: the default tolerance. Measured: 3 ulps in
    # f32 on positive terms, 2 ulps of the scale on terms of both signs.
    "dot_general": JAX_DEFAULT_ULPS,
}

# jax.grad of whole programs (the grads.jsonl rows with a "program"): chains
# of the ops above (matrix products, layer norms through rsqrt, softmax
# through exp) whose differences add up. tests/lax_control_flow_test.py
# testScanGrad compares one program's gradient computed two ways (lax.scan
# against a Python loop) within rtol 2e-4, atol 8e-5 in f32 and 1e-13 in f64,
# about 1700 and 450 ulps. Measured between the two hosts: at most 28 ulps of
# the scale in f32 (the nn.Block loss, a sum that cancels) and 1.5 in f64.
PROGRAM_ULPS = {"f32": 64, "f64": 16}

RESULT_FIELDS = ("outs", "grads", "out")


def tolerance(kind, row, dt):
    """The tolerance in ulps of a result of dtype dt of the case row of a
    golden file of kind ("ops", "grads" or "random"); 0 is bit for bit."""
    if dt not in EPS or kind == "random":
        return 0
    if "program" in row:
        return PROGRAM_ULPS[dt]
    if kind == "ops" and row.get("cmp") != "ulp":
        return 0
    return CHECK_ULPS.get(row.get("op"), {}).get(dt, 0)


def scaled_metric(kind):
    """Whether results of a file of kind are measured in ulps of their scale,
    max(1, largest finite |x| of the two arrays), rather than element by
    element. Gradients are: a gradient's error is a rounding of its largest
    terms (cotangents of both signs, sums that cancel), many ulps of an
    element near zero; the floor of 1 is assertAllClose's atol = rtol, and
    conformance's Go tests measure Ferry's gradients against max|JAX| alike.
    The op file is measured element by element: its inexact cases are
    elementwise functions and sums of positive terms."""
    return kind == "grads"


def decode(a):
    return np.frombuffer(bytes.fromhex(a["hex"]), dtype=NP[a["dtype"]].newbyteorder("<"))


def ordinal(x):
    """The position of each float of x in the ordered set of its dtype's
    values (+0 and -0 both 0): adjacent floats are 1 apart."""
    n = x.dtype.itemsize * 8
    u = x.view(f"<u{x.dtype.itemsize}").astype(np.uint64)
    neg = (u >> np.uint64(n - 1)).astype(bool)
    mag = (u & np.uint64((1 << (n - 1)) - 1)).astype(np.int64)
    return np.where(neg, -mag, mag)


def ulps(old, new, dt, scaled):
    """The distance of each element of new from old in ulps (of the scale
    when scaled): 0 for two NaNs or equal values, inf for a NaN or an
    infinity against anything else."""
    a, b = old.astype(np.float64), new.astype(np.float64)
    if scaled:
        fin = np.concatenate([np.abs(a[np.isfinite(a)]), np.abs(b[np.isfinite(b)]), [1.0]])
        _, e = np.frexp(fin.max())  # scale = f·2^e, f in [0.5, 1): its ulp is eps·2^(e-1)
        d = np.abs(a - b) / np.ldexp(EPS[dt], int(e) - 1)
    else:
        oa, ob = ordinal(old), ordinal(new)
        with np.errstate(over="ignore"):
            same = np.abs(oa - ob).astype(np.float64)
        d = np.where((oa >= 0) == (ob >= 0), same, np.abs(oa).astype(np.float64) + np.abs(ob))
    with np.errstate(invalid="ignore"):
        d = np.where(a == b, 0.0, d)
    d[(np.isinf(a) | np.isinf(b)) & (a != b)] = np.inf
    na, nb = np.isnan(a), np.isnan(b)
    d[na != nb] = np.inf
    d[na & nb] = 0.0
    return d


def show(x, i):
    v = x[i]
    return f"{v.item() if hasattr(v, 'item') else v} (0x{x.view(f'<u{x.dtype.itemsize}')[i]:0{2 * x.dtype.itemsize}x})"


def compare_result(kind, row, field, old, new):
    """Compares one result array: returns (failure or None, None or, for a
    result within tolerance but not bit-identical, (elements that differ,
    elements, largest distance, tolerance, unit))."""
    if old["dtype"] != new["dtype"] or old["shape"] != new["shape"]:
        return (f"{field} is {new['dtype']}{new['shape']}, committed {old['dtype']}{old['shape']}", None)
    a, b = decode(old), decode(new)
    dt = old["dtype"]
    tol = tolerance(kind, row, dt)
    scaled = scaled_metric(kind)
    unit = "ulps of max(1, max|x|)" if scaled else "ulps"
    if dt in EPS:
        d = ulps(a, b, dt, scaled)
        u = f"<u{a.dtype.itemsize}"
        same = (a.view(u) == b.view(u)) | (np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64)))
        ok = same if tol == 0 else d <= tol
    else:
        d = None
        ok = a == b
    if ok.all():
        if d is None or (d == 0).all() and same.all():
            return None, None
        return None, (int(np.count_nonzero(~same)), a.size, float(d.max()), tol, unit)
    bad = np.flatnonzero(~ok)
    msg = f"{field}: {bad.size} of {a.size} elements beyond the tolerance of {tol} {unit}"
    if tol == 0:
        msg += " (compared bit for bit)"
    for i in bad[:3]:
        dist = f", {d[i]:g} {unit}" if d is not None else ""
        msg += f"\n      element {i}: committed {show(a, i)}, regenerated {show(b, i)}{dist}"
    return msg, None


def first_diff(a, b):
    """The two JSON texts of a and b around where they first differ."""
    sa, sb = json.dumps(a), json.dumps(b)
    i = next((k for k, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
    lo = max(0, i - 40)
    return (f"committed ...{sa[lo:i + 40]}...\n"
            f"      regenerated ...{sb[lo:i + 40]}... (character {i})")


def compare_case(kind, old, new):
    """Compares a committed case with the regenerated one: every field but
    the results must be identical, the results within tolerance. Returns
    the failures and, for a case within tolerance but not bit-identical, a
    note on how far it is."""
    bad, near = [], []
    for k in sorted(set(old) | set(new)):
        if k not in RESULT_FIELDS and old.get(k) != new.get(k):
            bad.append(f"field {k!r} differs (only results may differ): {first_diff(old.get(k), new.get(k))}")
    for k in RESULT_FIELDS:
        va, vb = old.get(k), new.get(k)
        if va is None and vb is None:
            continue
        la, lb = ([va], [vb]) if isinstance(va, dict) else (va or [], vb or [])
        if len(la) != len(lb) or not isinstance(vb, type(va)):
            bad.append(f"field {k!r}: {len(lb)} results, committed {len(la)}")
            continue
        for i, (a, b) in enumerate(zip(la, lb)):
            field = k if isinstance(va, dict) else f"{k}[{i}]"
            if k == "grads" and old.get("names"):
                field += f" (d/d{old['names'][old['diff'][i]]})"
            f, n = compare_result(kind, old, field, a, b)
            if f:
                bad.append(f)
            if n:
                near.append(n)
    if bad or not near:
        return bad, None
    worst = max(near, key=lambda n: n[2] / n[3])
    return bad, (f"{sum(n[0] for n in near)} of {sum(n[1] for n in near)} elements in {len(near)} result(s) "
                 f"differ, at most {worst[2]:g} {worst[4]} (allowed {worst[3]})")


def compare_file(name, old, new):
    """Compares a committed golden file's text with the regenerated one.
    Returns the failures, the notes on the cases within tolerance, and the
    committed lines of the cases that pass, by case name."""
    kind = name.split(".")[0]
    o, n = old.decode().splitlines(), new.decode().splitlines()
    bad, notes, keep = [], [], {}
    if o[:1] != n[:1]:
        bad.append(f"header differs: committed {o[0][:300] if o else '<empty>'}\n"
                   f"      regenerated {n[0][:300]}")
    committed = {json.loads(line)["name"]: line for line in o[1:]}
    order = []
    for line in n[1:]:
        row = json.loads(line)
        order.append(row["name"])
        was = committed.get(row["name"])
        if was is None:
            bad.append(f"case {row['name']}: not in the committed file")
            continue
        if was == line:
            keep[row["name"]] = was
            continue
        b, note = compare_case(kind, json.loads(was), row)
        if b:
            bad += [f"case {row['name']}: {m}" for m in b]
        else:
            keep[row["name"]] = was
            if note:
                notes.append(f"{row['name']}: {note}")
    gone = sorted(set(committed) - set(order))
    if gone:
        bad.append(f"{len(gone)} committed case(s) no longer generated: {', '.join(gone[:5])}")
    elif not bad and list(committed) != order:
        bad.append("the cases are in another order")
    return bad, notes, keep


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed files (within the tolerances) instead of writing")
    ap.add_argument("--fresh", action="store_true",
                    help="write every case as this host's JAX gives it, also those within tolerance of the "
                         "committed values (kept by default)")
    args = ap.parse_args()
    files = build()
    failed = 0
    for name, data in sorted(files.items()):
        path = os.path.join(TESTDATA, name)
        try:
            with gzip.open(path, "rb") as f:
                old = f.read()
        except OSError as e:
            if args.check:
                print(f"{path}: cannot read: {e}", file=sys.stderr)
                failed += 1
                continue
            old = None
        if not args.check:
            kept = 0
            if old is not None and not args.fresh:
                _, _, keep = compare_file(name, old, data)
                lines = data.decode().splitlines()
                out = lines[:1]
                for line in lines[1:]:
                    was = keep.get(json.loads(line)["name"], line)
                    kept += was != line
                    out.append(was)
                data = ("\n".join(out) + "\n").encode()
            os.makedirs(TESTDATA, exist_ok=True)
            with open(path, "wb") as f:
                f.write(gzip.compress(data, compresslevel=9, mtime=0))
            print(f"wrote {path}: {len(data.splitlines()) - 1} cases, {os.path.getsize(path)} bytes gzip'd"
                  + (f"; {kept} kept as committed, within tolerance of this host's values" if kept else ""))
            continue
        bad, notes, _ = compare_file(name, old, data)
        if bad:
            failed += 1
            print(f"{path}: {len(bad)} difference(s) beyond the tolerances:", file=sys.stderr)
            for m in bad[:20]:
                print(f"  {m}", file=sys.stderr)
            if len(bad) > 20:
                print(f"  ... and {len(bad) - 20} more", file=sys.stderr)
            continue
        print(f"{path}: ok ({len(data.splitlines()) - 1} cases"
              + (f"; {len(notes)} not bit-identical, within tolerance" if notes else "") + ")")
        for m in notes:
            print(f"  {m}")
    if failed:
        print(f"{failed} golden file(s) differ from what JAX {jax.__version__} gives here beyond the tolerances: "
              f"run .venv/bin/python conformance/gen.py and review the change", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
