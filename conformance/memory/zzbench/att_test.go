package attbench

import (
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

func BenchmarkAttention(b *testing.B) {
	a := rt.Jit(func(k *trace.Array) nn.Attention { return nn.NewAttention(k, ir.Float32, 256, 8) })(random.NewKey(1))
	xs := make([]float32, 2*512*256)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	x := rt.FromSlice(xs, 2, 512, 256)
	f := rt.Jit(func(a nn.Attention, x *trace.Array) *trace.Array { return a.Apply(x) })
	g := rt.Jit(func(a nn.Attention, x *trace.Array) nn.Attention {
		return trace.Grad(func(a nn.Attention) *trace.Array { return trace.Sum(trace.Square(a.Apply(x))) })(a)
	})
	b.Run("fwd", func(b *testing.B) {
		f(a, x).Delete()
		for range b.N {
			f(a, x).Delete()
		}
	})
	b.Run("grad", func(b *testing.B) {
		g(a, x)
		for range b.N {
			g(a, x)
		}
	})
}
