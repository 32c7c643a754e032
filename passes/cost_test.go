package passes_test

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// TestCostAnalysis counts a batched product, a scan over layers with a
// product, an add and a tanh in its body, a reduction and a while loop, at
// fresh random sizes, against the counts written out here.
func TestCostAnalysis(t *testing.T) {
	r := testseed.Rand(t, 1)
	b, m, k, n, layers := 1+r.IntN(4), 1+r.IntN(9), 1+r.IntN(9), 1+r.IntN(9), 1+r.IntN(5)
	src := fmt.Sprintf(`func @f(%%0: f32[%[1]d,%[2]d,%[3]d], %%1: f32[%[1]d,%[3]d,%[4]d], %%2: f32[%[5]d,%[4]d,%[4]d]) -> (f32[%[1]d,%[2]d,%[4]d], f32[], i32[]) {
  %%3 = dot_general(%%0, %%1) {lhs_batch=[0], lhs_contract=[2], rhs_batch=[0], rhs_contract=[1]} : f32[%[1]d,%[2]d,%[4]d]
  %%4 = reshape(%%3) {shape=[%[6]d,%[4]d]} : f32[%[6]d,%[4]d]
  %%5, %%6 = scan(%%4, %%2) {length=%[5]d, num_carry=1, num_consts=0} (
    ^(%%7: f32[%[6]d,%[4]d], %%8: f32[%[4]d,%[4]d]) {
      %%9 = dot_general(%%7, %%8) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[%[6]d,%[4]d]
      %%10 = add(%%9, %%7) : f32[%[6]d,%[4]d]
      %%11 = tanh(%%10) : f32[%[6]d,%[4]d]
      return %%11, %%11
    }) : f32[%[6]d,%[4]d], f32[%[5]d,%[6]d,%[4]d]
  %%12 = reduce_sum(%%6) {axes=[0,1,2]} : f32[]
  %%13 = transpose(%%3) {perm=[0,1,2]} : f32[%[1]d,%[2]d,%[4]d]
  %%14 = constant() {value=dense<i32[], 0>} : i32[]
  %%15 = while(%%14) {num_consts=0} (
    ^(%%16: i32[]) {
      %%17 = constant() {value=dense<i32[], 3>} : i32[]
      %%18 = lt(%%16, %%17) : bool[]
      return %%18
    }, ^(%%19: i32[]) {
      %%20 = constant() {value=dense<i32[], 1>} : i32[]
      %%21 = add(%%19, %%20) : i32[]
      return %%21
    }) : i32[]
  return %%13, %%12, %%15
}`, b, m, k, n, layers, b*m)
	f, err := ir.Parse(src)
	require.NoError(t, err, src)
	require.NoError(t, ir.Verify(f))

	rows := float64(b * m)
	dots := 2*float64(b*m*n*k) + float64(layers)*2*rows*float64(n*n)
	flops := dots +
		float64(layers)*rows*float64(n) + // the adds in the scan
		float64(layers)*rows*float64(n) + // the reduction's operand
		2 // the while loop's compare and add, counted once
	got := passes.CostAnalysis(f)
	want := passes.Cost{Flops: flops, DotFlops: dots, Transcendentals: float64(layers) * rows * float64(n), WhileLoops: 1}
	require.Equal(t, want, got, "b=%d m=%d k=%d n=%d layers=%d", b, m, k, n, layers)

	// Compiling fuses and schedules but computes the same things.
	p := compile(t, f, passes.Options{})
	require.Equal(t, want, passes.CostAnalysis(p.Func), "%s", p.Func)
}
