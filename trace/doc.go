// Package trace defines Ferry's one array type, *Array, the ops on it, and the
// transformations that trace Go functions into IR.
//
// # Arrays: concrete or traced
//
// An *Array is either concrete (it holds a backend buffer) or traced (it stands
// for an ir.Value of a function being traced by rt.Jit, Grad, Scan, ...). The same
// Go code runs on both: on concrete arrays every op executes at once (eager mode,
// one small compiled function per op signature, cached), on traced arrays it is
// recorded into the function's IR. Import github.com/ferryml/ferry/runtime (as rt)
// to get an executor and ways to make arrays (rt.FromSlice).
//
// # Ops
//
// Ops are plain functions taking and returning *Array:
//
//   - elementwise: Neg, Abs, Exp, Log, Tanh, ..., Add, Sub, Mul, Div, Pow,
//     Maximum, comparisons (Equal, Less, ...), Where, Clip, Convert, and
//     composites such as Relu, Gelu, Softplus, Softmax and LogSoftmax;
//   - creation: Scalar, ScalarAs, Const, Full, Zeros, Ones, Iota, Arange, Eye;
//   - shape: Reshape, Transpose, ExpandDims, Squeeze, BroadcastTo, Slice,
//     SliceAxis, Concatenate, Stack, Split, Pad, Ravel;
//   - indexing: Index, DynamicSlice, DynamicUpdateSlice, Take, ScatterAdd, OneHot;
//   - reductions: Sum, Max, Min, Prod, Mean, Var, Std, LogSumExp, Any, All,
//     ArgMax, ArgMin (with KeepDims to keep reduced axes);
//   - linear algebra: DotGeneral, MatMul, Dot, Einsum.
//
// Binary and n-ary elementwise ops broadcast their operands with NumPy's rules
// (shapes aligned at the last axis, size-1 axes stretch) and promote their dtypes
// with JAX's rules (see PromoteDTypes and ResultDType). Scalar(2.5) and
// ScalarInt(2) are weakly typed, like Python numbers in JAX: Mul(x, Scalar(2))
// keeps x's dtype. The ops that compute in floats only (Exp, Log, Sqrt, Rsqrt,
// Tanh, Logistic, Sin, Cos, Erf, Softmax, Gelu, Mean, Var, LogSumExp, ...)
// promote an integer or bool array to DefaultFloat (f32) first, as jax.numpy
// does (jnp.exp(int32) is float32; lax.exp would refuse it). Axes may be
// negative (counted from the end) wherever an op takes one.
//
// Memory matters: Full, Zeros and Ones emit a scalar constant and a broadcast,
// never a large literal, so inside a traced function they cost nothing until the
// compiler decides where to materialise them.
//
// # Transformations
//
// Grad, ValueAndGrad, GradFirst, Grad2, Grad3, GradN, VJP and JVP
// differentiate; Vmap vectorises (jax.vmap, with InAxes, OutAxes, AxisSize,
// AxisName and AxisIndex, and the collectives over a named axis: PSum, PMean,
// PMax, PMin, AllGather, PSumScatter, AllToAll, PPermute); Scan, Cond, While
// and ForLoop are structured control flow; Remat and Checkpoint trade memory
// for recomputation; CustomVJP gives an op its own derivative. They all work at
// trace time on the same IR, so they compose in any order, eagerly or under
// rt.Jit.
//
// # Errors
//
// A programming error — shapes that do not broadcast, an axis out of range, a
// bool array passed to Add — panics with a *Error that names the op and the Go
// file:line of the user's call, for example
//
//	model.go:42: Add: shapes f32[2,3] and f32[4] do not broadcast
//
// rt.Jit's error-returning entry points recover it; Recover does so in user code.
package trace
