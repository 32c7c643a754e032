"""ONNX Runtime's side of bench/serve: a BERT sentence encoder built as an
ONNX graph straight from a Hugging Face safetensors checkpoint (no torch),
run by ONNX Runtime on the CPU.

The graph is all-MiniLM-L6-v2's as sentence-transformers runs it: word,
position and token-type embeddings summed and layer-normalised; per layer
multi-head self-attention under the padding mask, a residual and LayerNorm,
a feed-forward layer with the exact (erf) GELU, a residual and LayerNorm;
then the mean of the hidden states over the real tokens, L2-normalised.

    python ort_bert.py --model DIR --inputs FILE --threads N [--save model.onnx]

FILE is JSON {"ids": [[...]], "types": [[...]], "mask": [[...]]}. The
program prints one JSON line {"embeddings": [[...]], "optimized": [...]},
the batch's embeddings, then answers commands on standard input, one a line:
"time K" runs the batch K times and prints {"seconds": [...]}, each call's
wall time; "quit" ends. bench/serve (Go) drives it.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

OPSET = 17


class Graph:
    """Builds an ONNX graph node by node with fresh value names."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def const(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type, *inputs, **attrs):
        self.n += 1
        out = f"{op_type.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def linear(self, x, w, b, name):
        """x @ w.T + b, w in PyTorch's [out, in] layout."""
        wt = self.const(name + ".wT", np.ascontiguousarray(w.T))
        return self.op("Add", self.op("MatMul", x, wt), self.const(name + ".b", b))

    def layer_norm(self, x, scale, bias, name, eps):
        return self.op("LayerNormalization", x, self.const(name + ".scale", scale),
                       self.const(name + ".bias", bias), axis=-1, epsilon=eps)


def build(model_dir):
    """Returns the ONNX ModelProto of the checkpoint in model_dir."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = load_file(os.path.join(model_dir, "model.safetensors"))
    d, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
    dh = d // heads
    g = Graph()
    shape = g.op("Shape", "input_ids")
    seq = g.op("Slice", shape, g.const("one", np.array([1], np.int64)), g.const("two", np.array([2], np.int64)))
    pos = g.op("Slice", g.const("position_table", w["embeddings.position_embeddings.weight"]),
               g.const("zero", np.array([0], np.int64)), seq, g.const("axis0", np.array([0], np.int64)))
    x = g.op("Add", g.op("Gather", g.const("word_table", w["embeddings.word_embeddings.weight"]), "input_ids"),
             g.op("Gather", g.const("type_table", w["embeddings.token_type_embeddings.weight"]), "token_type_ids"))
    x = g.layer_norm(g.op("Add", x, pos), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], "emb_ln", eps)

    maskf = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    keep = g.op("Unsqueeze", maskf, g.const("axes12", np.array([1, 2], np.int64)))  # [B,1,1,T]
    big = np.float32(np.finfo(np.float32).min)
    bias = g.op("Mul", g.op("Sub", g.const("onef", np.float32(1)), keep), g.const("minf", big))
    split = g.const("split_heads", np.array([0, 0, heads, dh], np.int64))
    merge = g.const("merge_heads", np.array([0, 0, d], np.int64))
    scale = g.const("scale", np.float32(1 / math.sqrt(dh)))
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def heads_of(name, perm):
            y = g.linear(x, w[p + f"attention.self.{name}.weight"], w[p + f"attention.self.{name}.bias"], f"l{i}.{name}")
            return g.op("Transpose", g.op("Reshape", y, split), perm=perm)

        q, k, v = heads_of("query", [0, 2, 1, 3]), heads_of("key", [0, 2, 3, 1]), heads_of("value", [0, 2, 1, 3])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), bias)
        ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        ctx = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]), merge)
        attn = g.linear(ctx, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"], f"l{i}.o")
        x = g.layer_norm(g.op("Add", x, attn), w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"], f"l{i}.ln1", eps)
        h = g.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"], f"l{i}.ff1")
        erf = g.op("Erf", g.op("Mul", h, g.const(f"l{i}.rsqrt2", np.float32(1 / math.sqrt(2)))))
        h = g.op("Mul", g.op("Mul", h, g.const(f"l{i}.half", np.float32(0.5))), g.op("Add", erf, g.const(f"l{i}.one", np.float32(1))))
        y = g.linear(h, w[p + "output.dense.weight"], w[p + "output.dense.bias"], f"l{i}.ff2")
        x = g.layer_norm(g.op("Add", x, y), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], f"l{i}.ln2", eps)

    m3 = g.op("Unsqueeze", maskf, g.const("axis2", np.array([2], np.int64)))  # [B,T,1]
    axis1 = g.const("axis1", np.array([1], np.int64))
    total = g.op("ReduceSum", g.op("Mul", x, m3), axis1, keepdims=0)
    count = g.op("Max", g.op("ReduceSum", m3, axis1, keepdims=0), g.const("tiny", np.float32(1e-9)))
    mean = g.op("Div", total, count)
    norm = g.op("Sqrt", g.op("ReduceSum", g.op("Mul", mean, mean), axis1, keepdims=1))
    out = g.op("Div", mean, g.op("Max", norm, g.const("tiny2", np.float32(1e-12))))
    g.nodes.append(helper.make_node("Identity", [out], ["embeddings"]))

    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
            for n in ("input_ids", "token_type_ids", "attention_mask")]
    outs = [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", d])]
    graph = helper.make_graph(g.nodes, "bert_sentence_encoder", ints, outs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ferry bench/serve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--save", help="also write the ONNX model (and ONNX Runtime's optimized one beside it)")
    a = ap.parse_args()
    model = build(a.model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if a.save:
        onnx.save(model, a.save)
        so.optimized_model_filepath = a.save.replace(".onnx", ".opt.onnx")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    inp = json.load(open(a.inputs))
    feed = {"input_ids": np.array(inp["ids"], np.int64), "token_type_ids": np.array(inp["types"], np.int64),
            "attention_mask": np.array(inp["mask"], np.int64)}
    emb = sess.run(["embeddings"], feed)[0]
    print(json.dumps({"embeddings": emb.tolist(), "ort": ort.__version__, "onnx": onnx.__version__}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        secs = []
        for _ in range(int(cmd[1])):
            t0 = time.perf_counter()
            sess.run(["embeddings"], feed)
            secs.append(time.perf_counter() - t0)
        print(json.dumps({"seconds": secs}), flush=True)


if __name__ == "__main__":
    main()
