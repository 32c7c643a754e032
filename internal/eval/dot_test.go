package eval

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

type dotCase struct {
	lhs, rhs       []int
	lb, rb, lc, rc []int
}

var dotCases = []dotCase{
	{[]int{3, 4}, []int{4, 5}, nil, nil, []int{1}, []int{0}},
	{[]int{4}, []int{4}, nil, nil, []int{0}, []int{0}},
	{[]int{}, []int{}, nil, nil, nil, nil},
	{[]int{2, 3}, []int{4}, nil, nil, nil, nil},
	{[]int{2, 3, 4}, []int{2, 4, 5}, []int{0}, []int{0}, []int{2}, []int{1}},
	{[]int{4, 2, 3}, []int{5, 2, 4}, []int{1}, []int{1}, []int{0}, []int{2}},
	{[]int{2, 3, 4, 5}, []int{5, 4, 6}, nil, nil, []int{2, 3}, []int{1, 0}},
	{[]int{0, 4}, []int{4, 3}, nil, nil, []int{1}, []int{0}},
	{[]int{3, 0}, []int{0, 5}, nil, nil, []int{1}, []int{0}},
	{[]int{2, 3}, []int{3, 0}, nil, nil, []int{1}, []int{0}},
	{[]int{1, 1}, []int{1, 1}, nil, nil, []int{1}, []int{0}},
	{[]int{3, 2, 5}, []int{2, 5, 3}, []int{1, 0}, []int{0, 2}, []int{2}, []int{1}},
	{[]int{33, 70}, []int{70, 41}, nil, nil, []int{1}, []int{0}},
	{[]int{64, 128}, []int{96, 128}, nil, nil, []int{1}, []int{1}},
	// Layouts the gemm reads in place or through a packed copy.
	{[]int{70, 33}, []int{70, 41}, nil, nil, []int{0}, []int{0}},                           // transposed lhs
	{[]int{70, 33}, []int{41, 70}, nil, nil, []int{0}, []int{1}},                           // both transposed
	{[]int{5, 3, 7}, []int{3, 7, 4}, []int{1}, []int{0}, []int{2}, []int{1}},               // batch axis in the middle
	{[]int{7, 5, 3}, []int{4, 7, 3}, []int{2}, []int{2}, []int{0}, []int{1}},               // batch last: copies
	{[]int{4, 3, 5}, []int{3, 5, 6}, nil, nil, []int{2, 1}, []int{1, 0}},                   // contracting pairs reordered
	{[]int{1, 3, 1, 4}, []int{4, 1, 5}, nil, nil, []int{3}, []int{0}},                      // unit axes
	{[]int{2, 2, 9, 11}, []int{2, 2, 11, 3}, []int{0, 1}, []int{0, 1}, []int{3}, []int{2}}, // two batch axes
	{[]int{3, 50, 97}, []int{3, 97, 40}, []int{0}, []int{0}, []int{2}, []int{1}},           // batched, several blocks
	// Layouts read through offset tables (f32, f64).
	{[]int{2, 5, 3, 4}, []int{2, 6, 3, 4}, []int{0, 2}, []int{0, 2}, []int{3}, []int{3}},                  // attention heads: batch axes that do not merge
	{[]int{2, 3, 5, 4}, []int{3, 4, 6}, nil, nil, []int{1, 3}, []int{0, 1}},                               // head merge: split rows and contraction
	{[]int{2, 3, 5, 7}, []int{2, 7, 3, 4}, []int{0, 1}, []int{0, 2}, []int{3}, []int{1}},                  // probabilities × values
	{[]int{4, 3, 2}, []int{2, 5, 4, 3}, []int{2}, []int{0}, []int{0, 1}, []int{2, 3}},                     // everything transposed
	{[]int{3, 70, 2, 30, 11}, []int{3, 2, 30, 9, 70}, []int{0, 2}, []int{0, 1}, []int{3, 1}, []int{2, 4}}, // several blocks, strided
}

// dotValues draws moderate values with a few specials.
func dotValues(r *rand.Rand) float64 {
	switch r.IntN(200) {
	case 0:
		return math.NaN()
	case 1:
		return math.Inf(1)
	case 2:
		return math.Inf(-1)
	}
	return r.Float64()*4 - 2
}

func testDot(t *testing.T) {
	r := newRand(t)
	dts := acceptedDTypes(ir.DotGeneral, func(dt ir.DType) ([]ir.Type, ir.Attrs) {
		return []ir.Type{ir.TypeOf(dt, 2), ir.TypeOf(dt, 2)}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{0}, "rhs_contract": []int{0}}
	})
	require.Len(t, dts, len(ir.AllDTypes)-1)
	for _, dt := range dts {
		for _, c := range dotCases {
			a := randLit(r, dt, c.lhs, dotValues)
			b := randLit(r, dt, c.rhs, dotValues)
			attrs := ir.Attrs{"lhs_batch": nz(c.lb), "rhs_batch": nz(c.rb), "lhs_contract": nz(c.lc), "rhs_contract": nz(c.rc)}
			res := runOp(t, ir.DotGeneral, []*ir.Literal{a, b}, attrs)[0]
			checkDot(t, c, a, b, res)
		}
	}
}

func nz(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func free(rank int, x, y []int) []int {
	var out []int
	for i := 0; i < rank; i++ {
		if !slices.Contains(x, i) && !slices.Contains(y, i) {
			out = append(out, i)
		}
	}
	return out
}

func sizes(shape, axes []int) []int {
	out := make([]int, len(axes))
	for i, a := range axes {
		out[i] = shape[a]
	}
	return out
}

// checkDot compares res with a loop-nest reference: for every result index
// (batch, lhs free, rhs free), the sum over the contracting multi-index.
func checkDot(t *testing.T, c dotCase, a, b, res *ir.Literal) {
	t.Helper()
	dt := a.Type.DType
	lf, rf := free(len(c.lhs), c.lb, c.lc), free(len(c.rhs), c.rb, c.rc)
	bs, lfs, rfs, cs := sizes(c.lhs, c.lb), sizes(c.lhs, lf), sizes(c.rhs, rf), sizes(c.lhs, c.lc)
	oshape := slices.Concat(bs, lfs, rfs)
	require.True(t, ir.Shape(oshape).Equal(res.Type.Shape), "shape %v, want %v", res.Type.Shape, oshape)
	k := ir.Shape(cs).Size()
	for o := 0; o < res.Type.Size(); o++ {
		oi := unravel(o, oshape)
		li, ri := make([]int, len(c.lhs)), make([]int, len(c.rhs))
		for i := range c.lb {
			li[c.lb[i]], ri[c.rb[i]] = oi[i], oi[i]
		}
		for i, ax := range lf {
			li[ax] = oi[len(bs)+i]
		}
		for i, ax := range rf {
			ri[ax] = oi[len(bs)+len(lf)+i]
		}
		var sum, sumAbs float64
		var isum int64
		for j := 0; j < k; j++ {
			ci := unravel(j, cs)
			for i := range c.lc {
				li[c.lc[i]], ri[c.rc[i]] = ci[i], ci[i]
			}
			p, q := ravel(li, c.lhs), ravel(ri, c.rhs)
			if isFloat(dt) {
				sum += getF(a, p) * getF(b, q)
				sumAbs += math.Abs(getF(a, p) * getF(b, q))
			} else {
				isum += getI(a, p) * getI(b, q)
			}
		}
		if !isFloat(dt) {
			require.Equal(t, wrapTo(dt, isum), getI(res, o), "dot %v %+v [%d]", dt, c, o)
			continue
		}
		got := getF(res, o)
		if math.IsNaN(sum) || math.IsInf(sum, 0) {
			require.True(t, closeTo(got, sum, dt, 0, false), "dot %v %+v [%d]: got %g want %g", dt, c, o, got, sum)
			continue
		}
		want := refRound(sum, dt)
		var tol float64
		switch dt {
		case ir.Float64:
			tol = float64(k+1) * 0x1p-52 * sumAbs
		case ir.Float32:
			tol = ulpOf(want, fmtF32) + float64(k+1)*0x1p-23*sumAbs
		default: // f16, bf16: float32 accumulation, one final rounding
			tol = ulpOf(want, formatOf(dt)) + float64(k+1)*0x1p-23*sumAbs
		}
		require.InDelta(t, want, got, tol, "dot %v %+v [%d]", dt, c, o)
	}
}

// TestDotLayoutBits checks that a product's bits do not depend on where
// its operands lie: the same f32 and f64 products with each operand stored
// in a random axis order (dot_general's dimension numbers following the
// axes) give the same bits as with the operands stored in the order
// [batch, free, contracting] (lhs) and [batch, contracting, free] (rhs).
// The compiler's layout pass, which folds transposes into dot_general,
// relies on it.
func TestDotLayoutBits(t *testing.T) {
	r := newRand(t)
	for _, dt := range []ir.DType{ir.Float32, ir.Float64} {
		for _, c := range dotCases {
			if len(c.lhs) == 0 || ir.Shape(c.lhs).Size() == 0 {
				continue
			}
			a := randLit(r, dt, c.lhs, dotValues)
			b := randLit(r, dt, c.rhs, dotValues)
			lf, rf := free(len(c.lhs), c.lb, c.lc), free(len(c.rhs), c.rb, c.rc)
			// Canonical layouts and dimension numbers.
			ca := permuteLit(t, a, slices.Concat(c.lb, lf, c.lc))
			cb := permuteLit(t, b, slices.Concat(c.rb, c.rc, rf))
			nb, nl, nc := len(c.lb), len(lf), len(c.lc)
			want := runOp(t, ir.DotGeneral, []*ir.Literal{ca, cb}, ir.Attrs{
				"lhs_batch": iota(0, nb), "lhs_contract": iota(nb+nl, nc), "rhs_batch": iota(0, nb), "rhs_contract": iota(nb, nc)})[0]
			for range 3 {
				// A random storage order of each operand, keeping the free
				// axes in order (they give the result's layout).
				pa, pb := keepOrder(r.Perm(len(c.lhs)), lf), keepOrder(r.Perm(len(c.rhs)), rf)
				xa, xb := permuteLit(t, a, pa), permuteLit(t, b, pb)
				inv := func(p []int, axes []int) []int {
					out := make([]int, len(axes))
					for i, ax := range axes {
						out[i] = slices.Index(p, ax)
					}
					return out
				}
				got := runOp(t, ir.DotGeneral, []*ir.Literal{xa, xb}, ir.Attrs{
					"lhs_batch": inv(pa, c.lb), "lhs_contract": inv(pa, c.lc), "rhs_batch": inv(pb, c.rb), "rhs_contract": inv(pb, c.rc)})[0]
				require.Equal(t, want.Data, got.Data, "%v %+v stored as %v, %v", dt, c, pa, pb)
			}
		}
	}
}

func iota(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// keepOrder reorders the entries of perm that are in axes so that they
// appear in increasing order, leaving the other entries where they are.
func keepOrder(perm, axes []int) []int {
	var pos, vals []int
	for i, p := range perm {
		if slices.Contains(axes, p) {
			pos, vals = append(pos, i), append(vals, p)
		}
	}
	slices.Sort(vals)
	for i, q := range pos {
		perm[q] = vals[i]
	}
	return perm
}

// permuteLit returns transpose(l, perm).
func permuteLit(t *testing.T, l *ir.Literal, perm []int) *ir.Literal {
	return runOp(t, ir.Transpose, []*ir.Literal{l}, ir.Attrs{"perm": perm})[0]
}

// TestDotLayouts checks which operand layouts the gemm reads in place.
func TestDotLayouts(t *testing.T) {
	for _, c := range []struct {
		name                     string
		shape, batch, rows, cols []int
		ok, trans                bool
		ld, stride               int
	}{
		{"lhs [M,K]", []int{3, 4}, nil, []int{0}, []int{1}, true, false, 4, 0},
		{"lhs [K,M]", []int{4, 3}, nil, []int{1}, []int{0}, true, true, 3, 0},
		{"rhs [K,N]", []int{4, 5}, nil, []int{0}, []int{1}, true, false, 5, 0},
		{"rhs [N,K]", []int{5, 4}, nil, []int{1}, []int{0}, true, true, 4, 0},
		{"lhs [B,M,K]", []int{2, 3, 4}, []int{0}, []int{1}, []int{2}, true, false, 4, 12},
		{"lhs [B,K,M]", []int{2, 4, 3}, []int{0}, []int{2}, []int{1}, true, true, 3, 12},
		{"lhs [M,B,K]", []int{3, 2, 4}, []int{1}, []int{0}, []int{2}, true, false, 8, 4},
		{"lhs [B,M1,M2,K]", []int{2, 3, 5, 4}, []int{0}, []int{1, 2}, []int{3}, true, false, 4, 60},
		{"lhs [M,K1,K2]", []int{3, 4, 5}, nil, []int{0}, []int{1, 2}, true, false, 20, 0},
		{"lhs [K,M,B]", []int{4, 3, 2}, []int{2}, []int{1}, []int{0}, false, false, 0, 0},
		{"lhs [M,K2,K1] contracted as (K1,K2)", []int{3, 5, 4}, nil, []int{0}, []int{2, 1}, false, false, 0, 0},
		{"lhs [1,M,1,K]", []int{1, 3, 1, 4}, nil, []int{1}, []int{0, 3}, true, false, 4, 0},
	} {
		rows, cols := dimsProduct(c.shape, c.rows), dimsProduct(c.shape, c.cols)
		l, ok := inPlace(c.shape, c.batch, c.rows, c.cols, rows, cols)
		require.Equal(t, c.ok, ok, c.name)
		if ok {
			require.Equal(t, matLayout{trans: c.trans, ld: c.ld, stride: c.stride}, l, c.name)
		}
	}
}

// TestDotHalf runs bf16 and f16 dot_general (gemm.SgemmHalf: operands
// widened while packed, float32 accumulation, one rounding per result) on
// fresh random inputs of odd sizes, transposed, batched and copied layouts,
// and long contractions cut into several k slices. Each result must match
// the float64 loop-nest reference within float32 accumulation error plus
// one rounding, and equal bit for bit the former path: the same product in
// f32 on widened operands, rounded (NaN payloads included).
func TestDotHalf(t *testing.T) {
	r := newRand(t)
	cases := []dotCase{
		{[]int{37, 53}, []int{53, 71}, nil, nil, []int{1}, []int{0}},
		{[]int{53, 37}, []int{71, 53}, nil, nil, []int{0}, []int{1}},                            // both transposed
		{[]int{19, 900}, []int{900, 67}, nil, nil, []int{1}, []int{0}},                          // k in several slices
		{[]int{900, 13}, []int{70, 900}, nil, nil, []int{0}, []int{1}},                          // same, transposed
		{[]int{5, 64, 32}, []int{5, 64, 32}, []int{0}, []int{0}, []int{2}, []int{2}},            // attention scores
		{[]int{3, 41, 29}, []int{29, 3, 23}, []int{0}, []int{1}, []int{2}, []int{0}},            // batch axis in the middle
		{[]int{7, 5, 3}, []int{4, 7, 3}, []int{2}, []int{2}, []int{0}, []int{1}},                // batch last: copies
		{[]int{2, 3, 11, 13}, []int{13, 2, 3, 9}, []int{0, 1}, []int{1, 2}, []int{3}, []int{0}}, // two batch axes
		{[]int{4, 9, 450}, []int{4, 450, 7}, []int{0}, []int{0}, []int{2}, []int{1}},            // batched, several k slices
		{[]int{1, 1}, []int{1, 1}, nil, nil, []int{1}, []int{0}},
	}
	for _, dt := range []ir.DType{ir.BFloat16, ir.Float16} {
		for _, c := range cases {
			a := randLit(r, dt, c.lhs, dotValues)
			b := randLit(r, dt, c.rhs, dotValues)
			attrs := ir.Attrs{"lhs_batch": nz(c.lb), "rhs_batch": nz(c.rb), "lhs_contract": nz(c.lc), "rhs_contract": nz(c.rc)}
			res := runOp(t, ir.DotGeneral, []*ir.Literal{a, b}, attrs)[0]
			require.Equal(t, dt, res.Type.DType)
			checkDot(t, c, a, b, res)

			wide := func(l *ir.Literal) *ir.Literal {
				w := lit(ir.Type{DType: ir.Float32, Shape: l.Type.Shape})
				copy(viewAs[float32](w.Data), toF32(l))
				return w
			}
			res32 := runOp(t, ir.DotGeneral, []*ir.Literal{wide(a), wide(b)}, attrs)[0]
			want := lit(res.Type)
			fromF32(want, viewAs[float32](res32.Data))
			require.Equal(t, want.Data, res.Data, "%v %+v: not the bits of the f32 product rounded", dt, c)
		}
	}
}
