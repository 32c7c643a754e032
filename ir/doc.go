// Package ir is Ferry's intermediate representation: dtypes, shapes, memory
// spaces and shardings (Mesh, PartitionSpec, NamedSharding: an array spread
// over the devices of a mesh, part of its Type); SSA values, ops and regions
// (Func); the printer, the parser and the verifier; and the op table.
//
// # The op table
//
// Every op code has one row, an OpInfo (Code.Info), defined in ops.go by one
// def call or one line of the unary/binary helpers beside it, as JAX defines
// a primitive once in lax.py and Go's SSA backend generates its op tables
// from one line per op. A row holds what the op is:
//
//   - Name (printer, parser, messages; (*Op).Describe adds the location),
//     operand and region counts, attributes;
//   - Infer, the shape rule, and for elementwise ops DTypes, the dtype rule,
//     which the tracer (package trace) checks with the same words before it
//     emits the op;
//   - Ref1 or Ref2, the float64 reference scalar function of a float
//     elementwise op: internal/eval's float kernels compute it where they
//     have no kernel of their own, and the meta-tests compare every CPU
//     kernel with it;
//   - Differentiable: the op has a VJP rule in trace (vjp*.go), or, when
//     false, the explicit marker that it has none;
//   - Transcendental, read by the cost analysis (passes.CostAnalysis);
//   - Lower: the names the backends lower it by: Lower.CUDA, the CUDA C math
//     function the CUDA code generator calls, and Lower.VMath, the
//     cpu/vmath kernel whose opcode and function internal/eval and the
//     CPU fused executor (cpu/cpuexec) use for float32;
//   - Shard, the sharding propagation rule (ShardingRule), which
//     passes.PropagateShardings runs forward and backward; the ops listed in
//     DefaultShardedOps have the replicating ShardReplicate on purpose. The
//     slot of the vmap batching rule sits beside the VJP rules in trace,
//     because it needs trace's types.
//
// Meta-tests fail when a row lacks a piece: TestOpTableComplete (here: name,
// shape rule, dtype rule, sharding rule), passes' TestShardRuleTable (the
// replicate-by-default list), internal/eval's TestOpTableReference and
// TestOpTableLowerings (a reference function for every float elementwise op,
// and the CPU kernels agree with it; every vmath name exists, with the op's
// arity), cuda's TestOpTableGenerates (every op of the table, its cases
// derived from the table for the elementwise ones, generates CUDA C on every
// dtype its rule accepts; no gcc needed) and trace's TestVJPCoverage (a VJP
// rule exactly for the Differentiable ops). The op-coverage tests of eval
// (TestOps) and conformance (JAX goldens) still want a test row per op.
//
// # Adding an elementwise op
//
// A float unary op, say cbrt (cube root), was sketched this way to count the
// edits; the meta-tests above then name each missing test row. Non-test
// files, 3:
//
//  1. ir/ops.go, 2 lines: the code in the const block (Cbrt, among the
//     unary elementwise codes) and its row,
//     unary(Cbrt, "cbrt", FloatDTypes, true, math.Cbrt, transc, Lowering{CUDA: "cbrt"}).
//     That row is its dtype and shape rule, reference, cost class and its
//     lowerings: internal/eval computes it from math.Cbrt, the fused CPU
//     executor runs eval's kernel, CUDA calls cbrtf/cbrt, the printer,
//     parser, verifier, cost analysis and internal/testkit/randprog pick it up.
//  2. trace/ops_elementwise.go, 2 lines: the documented function,
//     func Cbrt(x *Array) *Array { return unary("Cbrt", ir.Cbrt, x) }.
//  3. trace/vjp.go, 1 entry in vjpRules: ir.Cbrt's VJP
//     (ct / (3·out²)). A non-differentiable op passes false in its row
//     instead and needs none.
//
// Plus, if it wants a float32 vector kernel, one row in cpu/vmath's ops
// table (ops.go) with its body and scalar kernel, and VMath: "cbrt" in its
// Lowering. Test rows: internal/eval/elementwise_test.go's unaryCases (its
// independent reference and ulp bound), trace/vjp_fd_test.go's gtCases (a
// finite-difference gradient check), and the JAX goldens
// (conformance/gen.py, forward and gradient). The CUDA op cases and the
// printer's round-trip corpus come from the table.
package ir
