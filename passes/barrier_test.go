package passes_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// CSE does not look through optimization barriers: exp of the barrier's result
// is not merged with exp of its operand (a checkpointed function's
// recomputation is kept apart from the forward pass). The barrier itself is
// gone after CSE, and so is checkpoint_name after canonicalize.
func TestCSEOptimizationBarrier(t *testing.T) {
	f := parse(t, `func @f(%0: f32[4]) -> (f32[4], f32[4], f32[4]) {
  %1 = checkpoint_name(%0) {name="x"} : f32[4]
  %2 = exp(%1) : f32[4]
  %3 = optimization_barrier(%1) : f32[4]
  %4 = exp(%3) : f32[4]
  %5 = optimization_barrier(%1) : f32[4]
  %6 = exp(%5) : f32[4]
  return %2, %4, %6
}`)
	p := checkSame(t, f, only("canonicalize", "cse", "dce"))
	require.Equal(t, []string{"exp", "exp", "exp"}, codes(p.Func.Body), "%s", p.Func)
	for _, op := range p.Func.Body.Ops {
		require.Equal(t, p.Func.Body.Params[0], op.Args[0], "the barriers' results are their operands")
	}

	// Without barriers the three are one.
	g := parse(t, `func @f(%0: f32[4]) -> (f32[4], f32[4]) {
  %1 = exp(%0) : f32[4]
  %2 = exp(%0) : f32[4]
  return %1, %2
}`)
	p = checkSame(t, g, only("cse", "dce"))
	require.Equal(t, []string{"exp"}, codes(p.Func.Body))
}
