// Package ferry is an array runtime for Go in the spirit of JAX.
//
// A Go function over arrays is traced into an IR (package ir), compiled, and run
// by a backend; the same function runs eagerly, op by op, on concrete arrays.
//
//   - package trace: *trace.Array (concrete or traced), ops with NumPy
//     broadcasting, trees of arrays, Grad, Scan, Cond, While;
//   - package runtime (imported as rt): rt.Jit, rt.Lower, compile cache,
//     arrays from Go slices, devices and backends;
//   - package ir: dtypes, shapes, memory spaces, the SSA IR, its text form;
//   - package interop: gorgonia.org/tensor interop.
//
// Start with examples/quickstart: go run ./examples/quickstart.
package ferry
