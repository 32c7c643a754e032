package passes_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// A loop fusion writes a result over an operand that dies at it only when
// the result's elements lie where the operand's do: the same number of
// elements, not only the same bytes. Here the fused group reads f32[10]
// and also returns u8[4,10] (a broadcast), 40 bytes both: written over
// the operand, the executor's first blocks of the u8 result clobbered
// operand elements still to be read for the f32 result (found by the
// sharded differential test, internal/testkit/difftest, seed 21261).
func TestFusionInPlaceNeedsSameElements(t *testing.T) {
	f := parse(t, `func @f(%0: f32[8], %1: f32[], %2: f32[10], %3: u8[]) -> (u8[6,12], f32[12]) {
  %4 = pad(%0, %1) {high=[1], interior=[0], low=[1]} : f32[10]
  %5 = floor(%4) : f32[10]
  %6 = tanh(%2) : f32[10]
  %7 = broadcast_in_dim(%6) {dims=[1], shape=[4,10]} : f32[4,10]
  %8 = convert(%7) {dtype=u8} : u8[4,10]
  %9 = mul(%5, %6) : f32[10]
  %10 = pad(%8, %3) {high=[1,1], interior=[0,0], low=[1,1]} : u8[6,12]
  %11 = pad(%9, %1) {high=[1], interior=[0], low=[1]} : f32[12]
  return %10, %11
}`)
	p := checkSame(t, f, passes.Options{FusionInPlace: true})
	fusions := 0
	p.Func.Body.Walk(func(op *ir.Op) {
		if op.Code != ir.Fusion {
			return
		}
		fusions++
		for _, a := range op.Args {
			ab, ok := p.Plan.Values[a]
			if !ok || ab.Kind != passes.BufTemp {
				continue
			}
			for _, r := range op.Results {
				rb := p.Plan.Values[r]
				if rb.Kind == passes.BufTemp && rb.Space == ab.Space && rb.Offset == ab.Offset {
					require.Equal(t, a.Type.Size(), r.Type.Size(), "%v (%v) is written over %v (%v)\n%s\n%s", r, r.Type, a, a.Type, p.Func, p.PlanString())
				}
			}
		}
	})
	require.Positive(t, fusions)
}
