package passes_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// transposesIntoDots counts the dot_general operands computed by a
// transpose, or by a reshape of one, in every region of f.
func transposesIntoDots(f *ir.Func) int {
	n := 0
	var walk func(r *ir.Region)
	walk = func(r *ir.Region) {
		for _, op := range r.Ops {
			for _, sub := range op.Regions {
				walk(sub)
			}
			if op.Code != ir.DotGeneral {
				continue
			}
			for _, a := range op.Args {
				if a.Op != nil && a.Op.Code == ir.Fusion {
					// A transpose fused into the loop that makes the operand
					// is still a transposed copy.
					a = a.Op.Regions[0].Results[slices.Index(a.Op.Results, a)]
				}
				if a.Op != nil && a.Op.Code == ir.Reshape {
					a = a.Op.Args[0]
				}
				if a.Op != nil && a.Op.Code == ir.Transpose {
					n++
				}
			}
		}
	}
	walk(f.Body)
	return n
}

// TestDotLayout checks the dot-layout pass on an attention block's
// products (heads split from the projections, the scores, probabilities
// times values, the head merge into the output projection, and the
// transposes of the backward pass): every transpose feeding a product is
// folded into its dimension numbers, and the compiled program gives the
// original's results bit for bit (eval and a run by the plan, fresh random
// inputs). The weight gradient of the output projection reads the merged
// heads as two free axes and merges its small result back. A transpose whose fold would reorder the product's free axes,
// and a head merge whose other operand is the larger, stay.
func TestDotLayout(t *testing.T) {
	f := parse(t, `func @f(%0: f32[2,5,12], %1: f32[12,12], %2: f32[12,12], %3: f32[12,12], %4: f32[12,7], %5: f32[3,6,4], %6: f32[4,4], %7: f32[2,3,5,5], %8: f32[2,5,3]) -> (f32[2,5,7], f32[2,3,5,4], f32[2,3,5,5], f32[6,3,4], f32[6,3,4], f32[2,5,200], f32[3,12]) {
  %10 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[2], rhs_batch=[], rhs_contract=[0]} : f32[2,5,12]
  %11 = reshape(%10) {shape=[2,5,3,4]} : f32[2,5,3,4]
  %12 = transpose(%11) {perm=[0,2,1,3]} : f32[2,3,5,4]
  %13 = dot_general(%0, %2) {lhs_batch=[], lhs_contract=[2], rhs_batch=[], rhs_contract=[0]} : f32[2,5,12]
  %14 = reshape(%13) {shape=[2,5,3,4]} : f32[2,5,3,4]
  %15 = transpose(%14) {perm=[0,2,3,1]} : f32[2,3,4,5]
  %16 = dot_general(%12, %15) {lhs_batch=[0,1], lhs_contract=[3], rhs_batch=[0,1], rhs_contract=[2]} : f32[2,3,5,5]
  %17 = exp(%16) : f32[2,3,5,5]
  %18 = dot_general(%0, %3) {lhs_batch=[], lhs_contract=[2], rhs_batch=[], rhs_contract=[0]} : f32[2,5,12]
  %19 = reshape(%18) {shape=[2,5,3,4]} : f32[2,5,3,4]
  %20 = transpose(%19) {perm=[0,2,1,3]} : f32[2,3,5,4]
  %21 = dot_general(%17, %20) {lhs_batch=[0,1], lhs_contract=[3], rhs_batch=[0,1], rhs_contract=[2]} : f32[2,3,5,4]
  %22 = transpose(%21) {perm=[0,2,1,3]} : f32[2,5,3,4]
  %23 = reshape(%22) {shape=[2,5,12]} : f32[2,5,12]
  %24 = dot_general(%23, %4) {lhs_batch=[], lhs_contract=[2], rhs_batch=[], rhs_contract=[0]} : f32[2,5,7]
  %25 = transpose(%7) {perm=[0,1,3,2]} : f32[2,3,5,5]
  %26 = dot_general(%25, %20) {lhs_batch=[0,1], lhs_contract=[3], rhs_batch=[0,1], rhs_contract=[2]} : f32[2,3,5,4]
  %27 = transpose(%5) {perm=[1,0,2]} : f32[6,3,4]
  %28 = dot_general(%27, %6) {lhs_batch=[], lhs_contract=[2], rhs_batch=[], rhs_contract=[0]} : f32[6,3,4]
  %29 = transpose(%5) {perm=[2,0,1]} : f32[4,3,6]
  %30 = dot_general(%6, %29) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[4,3,6]
  %31 = transpose(%30) {perm=[2,1,0]} : f32[6,3,4]
  %32 = constant() {value=dense<f32[], 0.5>} : f32[]
  %33 = broadcast_in_dim(%32) {dims=[], shape=[12,200]} : f32[12,200]
  %34 = dot_general(%23, %33) {lhs_batch=[], lhs_contract=[2], rhs_batch=[], rhs_contract=[0]} : f32[2,5,200]
  %35 = dot_general(%8, %23) {lhs_batch=[], lhs_contract=[0,1], rhs_batch=[], rhs_contract=[0,1]} : f32[3,12]
  return %24, %26, %17, %28, %31, %34, %35
}`)
	require.Equal(t, 10, transposesIntoDots(f))
	for _, opts := range []passes.Options{only("dot-layout", "dce"), {}} {
		p := checkSame(t, f, opts)
		text := p.Func.String()
		// Left: %28's transposed operand would reorder its free axes (6,3
		// → 3,6), and the head merge into the [12,200] matrix, larger
		// than the merged operand.
		require.Equal(t, 2, transposesIntoDots(p.Func), "%s", text)
		require.Contains(t, text, "lhs_contract=[1,3]", "the head merge is two contracting axes")
		require.Contains(t, text, "shape=[3,4,7]", "the output projection split for the head merge")
		require.Contains(t, text, "{shape=[3,12]}", "the weight gradient merged back")
	}
	// Without the pass, the transposes stay.
	p := checkSame(t, f, only("dce"))
	require.Equal(t, 10, transposesIntoDots(p.Func))
	require.False(t, strings.Contains(p.Func.String(), "shape=[3,4,7]"))
}

// reshapedDots counts the reshapes of dot_general results in f's body.
func reshapedDots(f *ir.Func) int {
	n := 0
	for _, op := range f.Body.Ops {
		if op.Code == ir.Reshape && op.Args[0].Op != nil && op.Args[0].Op.Code == ir.DotGeneral {
			n++
		}
	}
	return n
}

// TestDotLayoutSplit checks that a product whose result is only reshaped
// to split free axes (the attention head split of the q, k, v
// projections) is computed in the split shape from a reshaped operand, bit
// for bit, and that the reshape stays when the product has another use,
// when the split axis is a batch axis, or when the operand is the larger.
func TestDotLayoutSplit(t *testing.T) {
	f := parse(t, `func @f(%0: f32[6,5,12], %1: f32[12,12], %2: f32[4,10,3], %3: f32[4,3,2], %4: f32[2,40], %5: f32[40,500], %6: f32[8,3], %7: f32[3,100]) -> (f32[6,3,5,5], f32[6,5,12], f32[6,5,3,4], f32[2,2,10,2], f32[2,20,25], f32[2,4,100]) {
  %10 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[2], rhs_batch=[], rhs_contract=[0]} : f32[6,5,12]
  %11 = reshape(%10) {shape=[6,5,3,4]} : f32[6,5,3,4]
  %12 = dot_general(%11, %11) {lhs_batch=[0,2], lhs_contract=[3], rhs_batch=[0,2], rhs_contract=[3]} : f32[6,3,5,5]
  %13 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[2], rhs_batch=[], rhs_contract=[1]} : f32[6,5,12]
  %14 = reshape(%13) {shape=[6,5,3,4]} : f32[6,5,3,4]
  %15 = dot_general(%2, %3) {lhs_batch=[0], lhs_contract=[2], rhs_batch=[0], rhs_contract=[1]} : f32[4,10,2]
  %16 = reshape(%15) {shape=[2,2,10,2]} : f32[2,2,10,2]
  %17 = dot_general(%4, %5) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,500]
  %18 = reshape(%17) {shape=[2,20,25]} : f32[2,20,25]
  %19 = dot_general(%6, %7) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,100]
  %20 = reshape(%19) {shape=[2,4,100]} : f32[2,4,100]
  return %12, %13, %14, %16, %18, %20
}`)
	require.Equal(t, 5, reshapedDots(f))
	p := checkSame(t, f, only("dot-layout", "dce"))
	text := p.Func.String()
	// Folded: the head split (weight [12,12] → [12,3,4]) and the lhs free
	// axis of %19 ([8,3] → [2,4,3]). Kept: %14 (%13 is also a result), %16
	// (a batch axis), %18 (the [40,500] operand is larger than the result).
	require.Contains(t, text, "shape=[12,3,4]", "%s", text)
	require.Contains(t, text, "shape=[2,4,3]", "%s", text)
	require.Equal(t, 3, reshapedDots(p.Func), "%s", text)
}
