package passes_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// The update of a donated parameter (%3, in place over %0) is traced before
// another reader of the parameter (the product %4, as a backward pass reads
// a weight): the scheduler runs that reader first so the update can write
// over the parameter.
func TestScheduleDonatedReaderFirst(t *testing.T) {
	f := parse(t, `func @f(%0: f32[256], %1: f32[256]) -> (f32[256], f32[]) {
  %2 = exp(%1) : f32[256]
  %3 = sub(%0, %2) : f32[256]
  %4 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[]
  %5 = add(%4, %4) : f32[]
  return %3, %5
}`)
	for _, fusion := range []bool{false, true} {
		opts := passes.Options{Donated: []bool{true, false}, FusionInPlace: true}
		if !fusion {
			opts.Disable = []string{"fusion"}
		}
		p := checkSame(t, f, opts)
		r := p.Func.Body.Results
		require.Equal(t, passes.BufAlias, p.Plan.Values[r[0]].Kind, "fusion %v:\n%s\n%s", fusion, p.Func, p.PlanString())
		require.Equal(t, int64(1024), p.Analysis.AliasBytes)
		// The temp grows (%2 lives longer) by less than the output saved.
		plain := checkSame(t, f, passes.Options{Disable: opts.Disable, FusionInPlace: true})
		require.Zero(t, plain.Analysis.AliasBytes)
		require.Less(t, p.Analysis.TotalBytes(), plain.Analysis.TotalBytes())
	}
}

// When the only order that would free a donated parameter for its update is
// a cycle (the update feeds the other reader), the parameter is not aliased
// and the program is still right.
func TestScheduleDonatedNoValidOrder(t *testing.T) {
	f := parse(t, `func @f(%0: f32[64], %1: f32[64]) -> (f32[64], f32[]) {
  %2 = add(%0, %1) : f32[64]
  %3 = mul(%0, %2) : f32[64]
  %4 = reduce_sum(%3) {axes=[0]} : f32[]
  return %2, %4
}`)
	p := checkSame(t, f, passes.Options{Donated: []bool{true, false}, Disable: []string{"fusion"}})
	require.Equal(t, passes.BufOutput, p.Plan.Values[p.Func.Body.Results[0]].Kind)
	require.Zero(t, p.Analysis.AliasBytes)
}

// A weight update W - 0.1*(x^T x) of a donated W stays out of the matrix
// product's epilogue, so that the loop fusion can write it over W (an output
// fusion computes the product into its result before the epilogue reads W).
// Not donated, the update is the product's epilogue as before.
func TestDonatedUpdateNotInEpilogue(t *testing.T) {
	f := parse(t, `func @f(%0: f32[32,32], %1: f32[16,32]) -> (f32[32,32]) {
  %2 = dot_general(%1, %1) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[32,32]
  %3 = constant() {value=dense<f32[], 0.1>} : f32[]
  %4 = broadcast_in_dim(%3) {dims=[], shape=[32,32]} : f32[32,32]
  %5 = mul(%4, %2) : f32[32,32]
  %6 = sub(%0, %5) : f32[32,32]
  return %6
}`)
	kinds := func(p *passes.Program) []string {
		var ks []string
		for _, op := range p.Func.Body.Ops {
			if op.Code == ir.Fusion {
				ks = append(ks, op.Attrs.String("kind"))
			} else {
				ks = append(ks, op.Code.String())
			}
		}
		return ks
	}
	p := checkSame(t, f, passes.Options{Donated: []bool{true, false}, FusionInPlace: true})
	require.Equal(t, []string{"dot_general", passes.FusionLoop}, kinds(p))
	require.Equal(t, int64(32*32*4), p.Analysis.AliasBytes, "%s", p.PlanString())
	plain := checkSame(t, f, passes.Options{FusionInPlace: true})
	require.Equal(t, []string{passes.FusionOutput}, kinds(plain))
	// A donated parameter of another size changes nothing.
	g := parse(t, `func @f(%0: f32[32,32], %1: f32[16,32], %2: f32[8]) -> (f32[32,32], f32[8]) {
  %3 = dot_general(%1, %1) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[32,32]
  %4 = add(%0, %3) : f32[32,32]
  %5 = exp(%2) : f32[8]
  return %4, %5
}`)
	q := checkSame(t, g, passes.Options{Donated: []bool{false, false, true}, FusionInPlace: true})
	require.Equal(t, []string{passes.FusionOutput, "exp"}, kinds(q)[:2])
}

// Results are matched with donated parameters in the order they are defined:
// result 0, defined last, must not take %0, which only result 1 (defined
// first, in place over %0) can use.
func TestDonationMatchInDefinitionOrder(t *testing.T) {
	f := parse(t, `func @f(%0: f32[8], %1: f32[8]) -> (f32[8], f32[8]) {
  %2 = exp(%0) : f32[8]
  %3 = neg(%1) : f32[8]
  %4 = mul(%3, %3) : f32[8]
  return %4, %2
}`)
	p := checkSame(t, f, passes.Options{Donated: []bool{true, true}, Disable: []string{"fusion", "schedule"}})
	v, r := p.Plan.Values, p.Func.Body.Results
	require.Equal(t, passes.Buffer{Kind: passes.BufAlias, Space: ir.Device, Size: 32, Index: 1, Param: 0}, v[r[1]])
	require.Equal(t, passes.Buffer{Kind: passes.BufAlias, Space: ir.Device, Size: 32, Index: 0, Param: 1}, v[r[0]])
	require.Equal(t, int64(64), p.Analysis.AliasBytes)
}

// A donated step count's update (%3) is not fused with ops that broadcast it
// (a loop fusion reading %0 through a broadcast could not write over it), so
// both donated parameters are reused.
func TestFusionKeepsDonatedUpdateInPlace(t *testing.T) {
	f := parse(t, `func @f(%0: i32[], %1: f32[32]) -> (i32[], f32[32]) {
  %2 = constant() {value=dense<i32[], 1>} : i32[]
  %3 = add(%0, %2) : i32[]
  %4 = convert(%3) {dtype=f32} : f32[]
  %5 = broadcast_in_dim(%4) {dims=[], shape=[32]} : f32[32]
  %6 = mul(%1, %5) : f32[32]
  return %3, %6
}`)
	p := checkSame(t, f, passes.Options{Donated: []bool{true, true}, FusionInPlace: true})
	require.Equal(t, int64(4+128), p.Analysis.AliasBytes, "%s\n%s", p.Func, p.PlanString())
	// Not donated, it is one fusion as before.
	plain := checkSame(t, f, passes.Options{FusionInPlace: true})
	require.Len(t, plain.Func.Body.Ops, 1)
}

// An optimizer update fused with the loss into one input fusion (the new
// moment and weight are computed element for element from the donated old
// ones; only the loss is a reduction, and it reads neither) writes its new
// values over the donated buffers. Where the reduction reads the donated
// parameter, the fusion may not write over it.
func TestDonatedUpdateInInputFusion(t *testing.T) {
	f := parse(t, `func @f(%0: f32[64], %1: f32[64], %2: f32[64]) -> (f32[64], f32[64], f32[]) {
  %3 = constant() {value=dense<f32[], 0.9>} : f32[]
  %4 = broadcast_in_dim(%3) {dims=[], shape=[64]} : f32[64]
  %5 = mul(%4, %1) : f32[64]
  %6 = add(%5, %2) : f32[64]
  %7 = sub(%0, %6) : f32[64]
  %8 = mul(%2, %2) : f32[64]
  %9 = reduce_sum(%8) {axes=[0]} : f32[]
  return %7, %6, %9
}`)
	p := checkSame(t, f, passes.Options{Donated: []bool{true, true, false}, FusionInPlace: true})
	r := p.Func.Body.Results
	require.True(t, slices.ContainsFunc(p.Func.Body.Ops, func(op *ir.Op) bool {
		return op.Code == ir.Fusion && op.Attrs.String("kind") == passes.FusionInput
	}), "one input fusion:\n%s", p.Func)
	for j := range 2 {
		require.Equal(t, passes.BufAlias, p.Plan.Values[r[j]].Kind, "result %d:\n%s\n%s", j, p.Func, p.PlanString())
	}
	require.Equal(t, int64(512), p.Analysis.AliasBytes)

	// A fusion whose reduction reads the donated weight may not write the
	// new weight over it (checkSame runs the program against the reference).
	g := parse(t, `func @f(%0: f32[64], %1: f32[64]) -> (f32[64], f32[]) {
  %2, %3 = fusion(%0, %1) {kind="input"} (
    ^(%4: f32[64], %5: f32[64]) {
      %6 = sub(%4, %5) : f32[64]
      %7 = mul(%4, %4) : f32[64]
      %8 = reduce_sum(%7) {axes=[0]} : f32[]
      return %6, %8
    }) : f32[64], f32[]
  return %2, %3
}`)
	q := checkSame(t, g, passes.Options{Donated: []bool{true, false}, FusionInPlace: true})
	require.Equal(t, passes.BufOutput, q.Plan.Values[q.Func.Body.Results[0]].Kind, "%s\n%s", q.Func, q.PlanString())
}

// A donated buffer goes to a result of its own type before one of another
// type of the same size: the new step count (i32[]) takes the donated old
// count's buffer although a scalar f32 result (a loss) is defined first, as
// JAX matches donations by shape and dtype.
func TestDonationPrefersSameType(t *testing.T) {
	f := parse(t, `func @f(%0: i32[], %1: f32[]) -> (f32[], i32[]) {
  %2 = constant() {value=dense<i32[], 1>} : i32[]
  %3 = add(%0, %2) : i32[]
  %4 = convert(%3) {dtype=f32} : f32[]
  %5 = mul(%4, %1) : f32[]
  %6 = add(%3, %2) : i32[]
  return %5, %6
}`)
	for _, fusion := range []bool{false, true} {
		opts := passes.Options{Donated: []bool{true, false}, FusionInPlace: true}
		if !fusion {
			opts.Disable = []string{"fusion"}
		}
		p := checkSame(t, f, opts)
		r := p.Func.Body.Results
		require.Equal(t, passes.BufOutput, p.Plan.Values[r[0]].Kind, "fusion %v:\n%s\n%s", fusion, p.Func, p.PlanString())
		b := p.Plan.Values[r[1]]
		require.Equal(t, passes.BufAlias, b.Kind, "fusion %v:\n%s\n%s", fusion, p.Func, p.PlanString())
		require.Equal(t, 0, b.Param)
	}
}
