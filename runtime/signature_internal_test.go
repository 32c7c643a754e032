package runtime

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// refSignature is the cache key as written with ir.Type.String.
func refSignature(defs []*trace.TreeDef, leaves []*trace.Array) string {
	var b strings.Builder
	for _, d := range defs {
		b.WriteString(d.String())
		b.WriteByte('|')
	}
	for _, l := range leaves {
		b.WriteString(l.Type().String())
		if l.IsWeak() {
			b.WriteString("~")
		}
		b.WriteByte(',')
	}
	return b.String()
}

// TestAppendSignature checks the allocation-free cache key against one built
// from ir.Type.String, on random shapes, weak scalars, pinned-host arrays and
// nested argument trees.
func TestAppendSignature(t *testing.T) {
	r := testseed.Rand(t, 3)
	toHost := Jit(func(x *trace.Array) *trace.Array { return trace.Neg(x) }, OutSpaces(ir.PinnedHost))
	for i := 0; i < 20; i++ {
		var args []any
		for k := r.IntN(4); k >= 0; k-- {
			shape := make([]int, r.IntN(4))
			n := 1
			for d := range shape {
				shape[d] = r.IntN(4)
				n *= shape[d]
			}
			x := FromSlice(make([]float32, n), shape...)
			switch r.IntN(5) {
			case 0:
				args = append(args, trace.Scalar(r.Float64()))
			case 1:
				args = append(args, toHost(x))
			case 2:
				args = append(args, []*trace.Array{x, trace.Scalar(1)})
			case 3:
				args = append(args, (*trace.Array)(nil))
			default:
				args = append(args, x)
			}
		}
		leaves, defs, err := flattenArgs(args)
		if err != nil {
			t.Fatal(err)
		}
		want := refSignature(defs, leaves)
		if got := string(appendSignature(nil, defs, leaves)); got != want {
			t.Fatalf("signature %q, want %q", got, want)
		}
		// The fast path for array arguments gives the structure Flatten gives.
		for k, a := range args {
			_, d, err := trace.Flatten(a)
			if err != nil {
				t.Fatal(err)
			}
			if d.String() != defs[k].String() {
				t.Fatalf("argument %d: structure %q, want %q", k, defs[k], d)
			}
		}
	}
}
