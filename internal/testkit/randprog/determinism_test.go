package randprog

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// firstDiff returns "" when a and b are equal, else their first differing
// line with its number.
func firstDiff(a, b string) string {
	if a == b {
		return ""
	}
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(la), len(lb)) {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n  first: %s\n  now:   %s", i+1, x, y)
		}
	}
	return "the texts differ"
}

// compiled compiles f (every parameter donated when donate) and returns the
// optimised IR, its buffer plan and its memory analysis as text.
func compiled(t *testing.T, f *ir.Func, donate bool) string {
	t.Helper()
	d := make([]bool, len(f.Body.Params))
	for i := range d {
		d[i] = donate
	}
	p, err := passes.Compile(f, passes.Options{Donated: d, NoDump: true})
	if err != nil {
		t.Fatalf("%s: %v", f.Name, err)
	}
	return p.Func.String() + "\n" + p.PlanString() + "\n" + p.Analysis.String()
}

// Tracing is deterministic: the same random training step (checkpoint
// policies, ValueAndGrad, Scan) traces to the same IR every time, and
// compiles to the same program and memory analysis. Go randomises the order
// of every range over a map, so an order of ops, operands or results that
// one decides shows up as differing texts between traces.
func TestRematDeterministic(t *testing.T) {
	rng := testseed.Rand(t, 0xde7)
	programs, traces := 40, 4
	if testing.Short() {
		programs = 15
	}
	base := rng.Uint64N(1 << 40)
	for i := range uint64(programs) {
		seed := base + i
		var firstIR, firstProg string
		for k := range traces {
			f, desc, err := Remat(seed, All())
			if err != nil {
				t.Fatal(err)
			}
			text, prog := f.String(), compiled(t, f, seed%2 == 0)
			if k == 0 {
				firstIR, firstProg = text, prog
				continue
			}
			if d := firstDiff(firstIR, text); d != "" {
				t.Fatalf("%s: trace %d's IR differs from the first trace's at %s", desc, k+1, d)
			}
			if d := firstDiff(firstProg, prog); d != "" {
				t.Fatalf("%s: trace %d's compiled program differs from the first's at %s", desc, k+1, d)
			}
		}
	}
}

// Compiling is deterministic: the same random program compiles to the same
// optimised IR, buffer plan and memory analysis every time.
func TestCompileDeterministic(t *testing.T) {
	rng := testseed.Rand(t, 0xc0de)
	programs := 40
	if testing.Short() {
		programs = 15
	}
	base := rng.Uint64N(1 << 40)
	for i := range uint64(programs) {
		seed := base + i
		f := New(seed, All())
		first := compiled(t, f, seed%2 == 0)
		for k := 1; k < 3; k++ {
			if d := firstDiff(first, compiled(t, f, seed%2 == 0)); d != "" {
				t.Fatalf("seed %d: compile %d differs from the first at %s", seed, k+1, d)
			}
		}
	}
}
