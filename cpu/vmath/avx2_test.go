package vmath

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"slices"
	"testing"
)

// TestAVX2JITOff checks that with the JIT off (FERRY_CPU_JIT=0, SetJIT)
// the AVX2 kernels, which are generated code, fall back to the pure-Go
// ones (the same bits) and Impl reports "go".
func TestAVX2JITOff(t *testing.T) {
	if !slices.Contains(available(), avx2Impl) {
		t.Skip("no AVX2 kernels here")
	}
	defer use(use(avx2Impl))
	defer SetJIT(SetJIT(false))
	if Impl() != "go" || JITAvailable() {
		t.Fatalf("JIT off: Impl %q, JITAvailable %v", Impl(), JITAvailable())
	}
	r := testseed.Rand(t, 3)
	x := randVec(r, 100)
	got, want := make([]float32, len(x)), make([]float32, len(x))
	Logistic(got, x)
	goImpl.f1[OpLogistic](want, x)
	for i := range x {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("Logistic(%v) = %v with the JIT off, pure Go %v", x[i], got[i], want[i])
		}
	}
	SetJIT(true)
	if Impl() != "avx2" || !JITAvailable() {
		t.Fatalf("JIT on: Impl %q, JITAvailable %v", Impl(), JITAvailable())
	}
}
