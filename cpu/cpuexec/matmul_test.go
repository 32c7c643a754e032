package cpuexec

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// randomDot builds a function of one dot_general of dtype dt with random
// dimension numbers: up to two batch, free and contracting axes each, of
// random sizes, the axes of each operand in a random order.
func randomDot(t *testing.T, r *rand.Rand, dt ir.DType) *ir.Func {
	nb, nm, nn, nk := r.IntN(3), r.IntN(3), r.IntN(3), r.IntN(3)
	size := func() int {
		if r.IntN(8) == 0 {
			return 1
		}
		return 2 + r.IntN(6)
	}
	sizes := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = size()
		}
		return s
	}
	bs, ms, ns, ks := sizes(nb), sizes(nm), sizes(nn), sizes(nk)
	if nk > 0 && r.IntN(3) == 0 {
		ks[0] = 40 + r.IntN(40) // a longer sum
	}
	// operand lays out the given groups of axes in a random order and
	// returns its shape and where each batch and contracting axis went.
	operand := func(free []int) (shape []int, batch, contract []int) {
		type axis struct{ role, i, n int }
		var axes []axis
		for i, n := range bs {
			axes = append(axes, axis{0, i, n})
		}
		for i, n := range free {
			axes = append(axes, axis{1, i, n})
		}
		for i, n := range ks {
			axes = append(axes, axis{2, i, n})
		}
		r.Shuffle(len(axes), func(i, j int) { axes[i], axes[j] = axes[j], axes[i] })
		batch, contract = make([]int, nb), make([]int, nk)
		for d, a := range axes {
			shape = append(shape, a.n)
			switch a.role {
			case 0:
				batch[a.i] = d
			case 2:
				contract[a.i] = d
			}
		}
		return shape, batch, contract
	}
	lshape, lb, lc := operand(ms)
	rshape, rb, rc := operand(ns)
	f := ir.NewFunc("dot")
	a, b := f.Body.AddParam(ir.TypeOf(dt, lshape...)), f.Body.AddParam(ir.TypeOf(dt, rshape...))
	d := add1(t, f.Body, ir.DotGeneral, ir.Attrs{"lhs_batch": lb, "rhs_batch": rb, "lhs_contract": lc, "rhs_contract": rc}, a, b)
	f.Body.Results = []*ir.Value{d}
	return f
}

// TestMatmulStep runs products of random layouts and dtypes as plan steps
// and compares them bit for bit with the reference executor's.
func TestMatmulStep(t *testing.T) {
	r := testseed.Rand(t, 48)
	n := 60
	if testing.Short() {
		n = 20
	}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.BFloat16, ir.Float16, ir.Int32} {
		for i := range n {
			f := randomDot(t, r, dt)
			t.Run(fmt.Sprintf("%v/%d", dt, i), func(t *testing.T) {
				p := naivePlan(f, planOpts{})
				e, err := New(p)
				require.NoError(t, err)
				st := e.body.steps[0]
				require.Equal(t, stepMatmul, st.kind, "%s", f.Body.Ops[0].Describe())
				if dt == ir.Float32 || dt == ir.Float64 {
					require.Nil(t, st.mm.kernel, "a float product ran by the reference kernel")
				}
				runBoth(t, p, randArgs(r, f))
			})
		}
	}
}

// TestMatmulPlainLayouts checks that 16-bit products of plain and
// transposed matrices, batched or not, are read in place (not by the
// reference kernel).
func TestMatmulPlainLayouts(t *testing.T) {
	r := testseed.Rand(t, 49)
	for _, c := range []struct {
		lshape, rshape []int
		attrs          ir.Attrs
	}{
		{[]int{5, 7}, []int{7, 9}, matmulAttrs()},
		{[]int{7, 5}, []int{9, 7}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{0}, "rhs_contract": []int{1}}},
		{[]int{3, 5, 7}, []int{3, 9, 7}, ir.Attrs{"lhs_batch": []int{0}, "rhs_batch": []int{0}, "lhs_contract": []int{2}, "rhs_contract": []int{2}}},
	} {
		for _, dt := range []ir.DType{ir.BFloat16, ir.Float16} {
			f := ir.NewFunc("dot")
			a, b := f.Body.AddParam(ir.TypeOf(dt, c.lshape...)), f.Body.AddParam(ir.TypeOf(dt, c.rshape...))
			f.Body.Results = []*ir.Value{add1(t, f.Body, ir.DotGeneral, c.attrs, a, b)}
			p := naivePlan(f, planOpts{})
			e, err := New(p)
			require.NoError(t, err)
			require.Nil(t, e.body.steps[0].mm.kernel, "%v %v·%v ran by the reference kernel", dt, c.lshape, c.rshape)
			runBoth(t, p, randArgs(r, f))
		}
	}
}
