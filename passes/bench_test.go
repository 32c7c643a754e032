package passes_test

import (
	"testing"

	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// largeProgram is a random program of about n ops at the top level.
func largeProgram(seed uint64, n int) *ir.Func {
	return randprog.Large(seed, n, randprog.Features{})
}

// BenchmarkCompileLarge compiles a random program of a few thousand ops.
func BenchmarkCompileLarge(b *testing.B) {
	f := largeProgram(1, 3000)
	b.Logf("%d ops", len(f.Body.Ops))
	for b.Loop() {
		if _, err := passes.Compile(f, passes.Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
