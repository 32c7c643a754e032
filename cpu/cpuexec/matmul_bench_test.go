package cpuexec

import (
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

// BenchmarkMatmulStep measures a product step (an attention score product:
// 96 heads of 32×32 by 32, keys transposed; and a 256×384×384 dense layer,
// weight [out, in]) run from the plan's layout beside the reference
// executor's kernel, which works the layout out at every call.
func BenchmarkMatmulStep(b *testing.B) {
	r := testseed.Rand(b, 52)
	cases := []struct {
		name           string
		lshape, rshape []int
		attrs          ir.Attrs
	}{
		{"attn_96x32x32x32", []int{8, 32, 12, 32}, []int{8, 32, 12, 32},
			ir.Attrs{"lhs_batch": []int{0, 2}, "rhs_batch": []int{0, 2}, "lhs_contract": []int{3}, "rhs_contract": []int{3}}},
		{"dense_256x384x384", []int{256, 384}, []int{384, 384},
			ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{1}}},
	}
	for _, c := range cases {
		f := ir.NewFunc("dot")
		x, y := f.Body.AddParam(ir.TypeOf(ir.Float32, c.lshape...)), f.Body.AddParam(ir.TypeOf(ir.Float32, c.rshape...))
		op := addOp(b, f.Body, ir.DotGeneral, []*ir.Value{x, y}, c.attrs)
		f.Body.Results = op.Results
		args := randArgs(r, f)
		out := []*ir.Literal{ir.NewLiteral(op.Result().Type)}
		p := naivePlan(f, planOpts{})
		e, err := New(p)
		if err != nil {
			b.Fatal(err)
		}
		mm := e.body.steps[0].mm
		b.Run(c.name+"/plan", func(b *testing.B) {
			for range b.N {
				if err := mm.run(args, out); err != nil {
					b.Fatal(err)
				}
			}
		})
		k, err := eval.Prepare(op)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name+"/reference", func(b *testing.B) {
			for range b.N {
				if err := k.Into(args, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
