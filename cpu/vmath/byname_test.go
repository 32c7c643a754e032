package vmath

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"testing"
)

// TestOpByNameAndKernels checks the lookups other packages derive their
// kernels from: every row's name gives its opcode, unknown names give 0,
// and Kernels(op) computes what the exported function of the op does.
func TestOpByNameAndKernels(t *testing.T) {
	if OpByName("no such op") != 0 || OpByName("") != 0 {
		t.Fatal("an unknown name has an opcode")
	}
	if u, b := Kernels(0); u != nil || b != nil {
		t.Fatal("opcode 0 has kernels")
	}
	rng := testseed.Rand(t, 2)
	a, b := make([]float32, 77), make([]float32, 77)
	for i := range a {
		a[i], b[i] = rng.Float32()*4-2, rng.Float32()*4-2
	}
	for op := OpAdd; op < opEnd; op++ {
		if got := OpByName(ops[op].name); got != op {
			t.Errorf("OpByName(%q) = %d, want %d", ops[op].name, got, op)
		}
		u, bin := Kernels(op)
		got, want := make([]float32, len(a)), make([]float32, len(a))
		switch {
		case ops[op].arity == 1 && u != nil && bin == nil:
			u(got, a)
			kernel1[op](want, a)
		case ops[op].arity == 2 && bin != nil && u == nil:
			bin(got, a, b)
			kernel2[op](want, a, b)
		default:
			t.Errorf("%s: Kernels gives the wrong arity", ops[op].name)
			continue
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Errorf("%s: Kernels' function gives %v at %d, the exported one %v", ops[op].name, got[i], i, want[i])
				break
			}
		}
	}
}
