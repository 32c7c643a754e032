package passes_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// largeProgram is a random program of about n ops at the top level.
func largeProgram(seed uint64, n int) *ir.Func {
	g := &progGen{rng: rand.New(rand.NewPCG(seed, 1)), budget: n, depth: 2}
	g.f = ir.NewFunc("large")
	s := &scope{g: g, r: g.f.Body}
	for range 6 {
		s.vals = append(s.vals, s.r.AddParam(g.randType()))
	}
	s.fill(n)
	s.r.Results = s.vals[len(s.vals)-8:]
	return g.f
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
