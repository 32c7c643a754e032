// Package conformance checks Ferry against JAX, used as the oracle: golden
// files written by pinned JAX (CPU) hold, for every op of the IR op table
// (ir/ops.go) and for the functions of package random, fixed inputs and
// JAX's results. The tests of this package read them and need no Python.
//
// Each op case is run twice, by the reference executor (internal/eval) and by
// the compiled path (rt.Jit on the CPU backend), and both results must equal
// JAX's: bit for bit for exact ops (every NaN equals every other NaN), within
// a stated bound in ulps for transcendental functions and floating-point sums
// (the measured maximum is printed with go test -v). Every op code must have a
// golden case or sit in a commented exclusion list, and every dtype an
// elementwise, reduction, shape or sort op accepts must have a case. Where
// Ferry deliberately or knowingly differs from JAX the difference is listed,
// narrowly, in knownDiffs and printed by the test. The main one: XLA on CPU
// flushes f32, f64 and bf16 subnormals to zero, Ferry keeps IEEE gradual
// underflow; the others are max/min of zeros of opposite sign, the order of
// subnormals in sort, and f64 sin and pow at extreme arguments (Go's math).
//
// The random cases compare random.NewKey, Split, FoldIn, Bits, Uniform,
// Normal, TruncatedNormal, Bernoulli, Categorical and Permutation with
// jax.random's PRNGKey, split, fold_in, bits, uniform, normal,
// truncated_normal, bernoulli, categorical and permutation, bit for bit,
// under both settings of jax_threefry_partitionable (random.SetPartitionable).
// f32 and f64 uniform (with bounds other than [0, 1)), normal and
// truncated_normal are compared within a few ulps instead: XLA fuses their
// multiply-adds into FMAs, Ferry rounds twice.
//
// The gradient cases (testdata/grads.jsonl.gz) compare trace.VJP, eagerly
// and inside rt.Jit, with jax.vjp: for every op the op table marks
// Differentiable, in f32 and f64 (bf16 for a few), at random inputs away from
// kinks and under a random cotangent, plus the conventions where the
// derivative is undefined (ties of max, min, reductions and sort; abs at 0;
// pow at 0, where Ferry's d/dx 0^0 = 0 against JAX's NaN is the one listed
// difference, gradKnownDiffs); and jax.grad of whole programs written
// alike in gen.py and grads_test.go: an MLP's softmax cross-entropy, one
// nn.Block (pre-norm causal attention, tanh-GELU MLP), examples/offload's
// scanned model (also with its remat-and-offload policy), a scan of a
// trace.Checkpoint'd body under DotsSaveable and NothingSaveable against
// jax.checkpoint with the same policies, ForLoop then Cond (both branches),
// the value of a While, and jax.vmap: per-example gradients of the MLP
// (vmap of grad, whose own gradient is grad of vmap of grad), a scan mapped
// over axis 1 of its input, and a While mapped over rows that stop after
// different numbers of steps. The error, max|Ferry − JAX| / max|JAX| per
// result, must be within 1e-5 in f32 (for f32 programs, up to four times
// the error JAX's own f32 result has against Ferry's f64 one, at most 1e-4),
// 1e-12 in f64 and 2e-2 in bf16; go test -v prints it for every case.
//
// To regenerate the golden files (testdata/*.jsonl.gz) after changing
// gen.py or the JAX pin in requirements.txt:
//
//	bash scripts/venv
//	.venv/bin/python conformance/gen.py
//
// and to check that the committed files are what JAX gives (CI runs this
// through .ci/golden.sh):
//
//	.venv/bin/python conformance/gen.py --check
//
// XLA's last bits depend on the CPU (between an AVX2 and an AVX-512 host: f64
// rsqrt 1 ulp, f32 dot_general 3 ulps, and the gradients and programs built
// on them), so the check accepts a regenerated value within a tolerance in
// ulps per op and dtype, each within JAX's own test tolerances: 4 in f64, 8
// in f32, 1 in bf16 and f16 for the transcendental functions but sqrt, float
// sums and products and dot_general, and 64 in f32 and 16 in f64 for whole
// programs (gradients in ulps of max(1, max|x|) of each result). Everything
// else (arithmetic, compares, conversions, moves, integer ops, sqrt,
// jax.random) must be bit for bit. Regenerating keeps the committed text of
// every case within the tolerances (gen.py --fresh rewrites all), so another
// CPU rewrites only real changes. The Go tests compare Ferry bit for bit only
// with values the check holds bit for bit too; their ulp and relative bounds
// hold against the values of either CPU.
package conformance
