package trace_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// otDotGeneralRef is dot_general on reference tensors: result axes are the batch
// axes, then a's free axes, then b's free axes.
func otDotGeneralRef(a, b otTensor, lb, rb, lc, rc []int) otTensor {
	free := func(r int, used ...[]int) []int {
		var f []int
		for i := 0; i < r; i++ {
			if !slices.Contains(used[0], i) && !slices.Contains(used[1], i) {
				f = append(f, i)
			}
		}
		return f
	}
	af, bf := free(len(a.shape), lb, lc), free(len(b.shape), rb, rc)
	var shape, csizes []int
	for _, d := range lb {
		shape = append(shape, a.shape[d])
	}
	for _, d := range af {
		shape = append(shape, a.shape[d])
	}
	for _, d := range bf {
		shape = append(shape, b.shape[d])
	}
	for _, d := range lc {
		csizes = append(csizes, a.shape[d])
	}
	out := otNew(shape...)
	ai, bi := make([]int, len(a.shape)), make([]int, len(b.shape))
	for o := range out.data {
		idx := otUnravel(o, shape)
		k := 0
		for i := range lb {
			ai[lb[i]], bi[rb[i]] = idx[k], idx[k]
			k++
		}
		for _, d := range af {
			ai[d] = idx[k]
			k++
		}
		for _, d := range bf {
			bi[d] = idx[k]
			k++
		}
		s := 0.0
		for c := 0; c < otNumel(csizes); c++ {
			cidx := otUnravel(c, csizes)
			for i := range lc {
				ai[lc[i]], bi[rc[i]] = cidx[i], cidx[i]
			}
			s += a.at(ai...) * b.at(bi...)
		}
		out.data[o] = s
	}
	return out
}

// otMatMulRef is NumPy's matmul written out with loops.
func otMatMulRef(a, b otTensor) otTensor {
	as, bs := slices.Clone(a.shape), slices.Clone(b.shape)
	dropN, dropM := len(as) == 1, len(bs) == 1
	if dropN {
		as = []int{1, as[0]}
	}
	if dropM {
		bs = []int{bs[0], 1}
	}
	n, k, m := as[len(as)-2], as[len(as)-1], bs[len(bs)-1]
	ab, bb := as[:len(as)-2], bs[:len(bs)-2]
	batch, ok := otBcastShape(ab, bb)
	if !ok {
		panic("otMatMulRef: batch dims do not broadcast")
	}
	A, B := otTensor{as, a.data}, otTensor{bs, b.data}
	shape := append(slices.Clone(batch), n, m)
	out := otNew(shape...)
	for o := range out.data {
		idx := otUnravel(o, shape)
		bidx := idx[:len(batch)]
		i, j := idx[len(batch)], idx[len(batch)+1]
		s := 0.0
		for p := 0; p < k; p++ {
			ia := append(slices.Clone(bidx[len(batch)-len(ab):]), i, p)
			ib := append(slices.Clone(bidx[len(batch)-len(bb):]), p, j)
			for d := range ab {
				if ab[d] == 1 {
					ia[d] = 0
				}
			}
			for d := range bb {
				if bb[d] == 1 {
					ib[d] = 0
				}
			}
			s += A.at(ia...) * B.at(ib...)
		}
		out.data[o] = s
	}
	final := slices.Clone(batch)
	if !dropN {
		final = append(final, n)
	}
	if !dropM {
		final = append(final, m)
	}
	return otTensor{final, out.data}
}

func TestOpsMatMul(t *testing.T) {
	r := otRand(t)
	cases := [][2][]int{
		{{3, 4}, {4, 5}}, {{4}, {4, 5}}, {{3, 4}, {4}}, {{4}, {4}}, {{2, 3, 4}, {4, 5}}, {{3, 4}, {2, 4, 5}},
		{{2, 1, 3, 4}, {5, 4, 6}}, {{1, 3, 4}, {2, 4, 5}}, {{2, 3, 4}, {1, 4, 5}}, {{2, 3, 4}, {2, 4, 5}},
		{{0, 3, 4}, {4, 5}}, {{3, 0}, {0, 5}}, {{1, 1, 3, 4}, {4, 2}}, {{4}, {3, 4, 2}}, {{2, 3, 4}, {4}},
		{{1, 3, 4}, {1, 4, 5}}, {{2, 3, 4}, {3, 2, 4, 5}},
	}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.BFloat16, ir.Int32} {
		for _, c := range cases {
			gen := otNormal
			if dt.IsInteger() {
				gen = otInts(-5, 5)
			}
			x, xr := otMake(r, dt, gen, c[0]...)
			y, yr := otMake(r, dt, gen, c[1]...)
			tol := 4 * otTol(dt)
			if dt == ir.BFloat16 {
				tol = 0.05
			}
			otCheck(t, otName("MatMul", dt, ir.Shape(c[0]), ir.Shape(c[1])), trace.MatMul(x, y), dt, otMatMulRef(xr, yr), tol)
		}
	}
	// Mixed dtypes promote.
	x, xr := otMake(r, ir.Int32, otInts(-3, 3), 2, 3)
	y, yr := otMake(r, ir.Float32, otNormal, 3, 2)
	otCheck(t, "MatMul/i32@f32", trace.MatMul(x, y), ir.Float32, otMatMulRef(xr, yr), 1e-5)

	a, _ := otMake(r, ir.Float32, otNormal, 2, 3, 4)
	b, _ := otMake(r, ir.Float32, otNormal, 3, 4, 5)
	otExpectError(t, "MatMul", func() { trace.MatMul(a, b) }, "batch dimensions of f32[2,3,4] and f32[3,4,5] do not broadcast")
	otExpectError(t, "MatMul", func() { trace.MatMul(a, a) }, "inner dimensions 4 and 3 differ")
	otExpectError(t, "MatMul", func() { trace.MatMul(a, trace.Scalar(2)) }, "rank ≥ 1")
	otExpectError(t, "MatMul", func() { trace.MatMul(otFrom(ir.Bool, nil, 0), otFrom(ir.Bool, nil, 0)) }, "numeric")
}

func TestOpsDot(t *testing.T) {
	r := otRand(t)
	cases := [][2][]int{{{4}, {4}}, {{3, 4}, {4}}, {{3, 4}, {4, 5}}, {{2, 3, 4}, {5, 4, 6}}, {{4}, {2, 4, 3}}, {{2, 3}, {}}, {{}, {}}}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Int64} {
		for _, c := range cases {
			x, xr := otMake(r, dt, otInts(-4, 4), c[0]...)
			y, yr := otMake(r, dt, otInts(-4, 4), c[1]...)
			var want otTensor
			switch {
			case len(c[0]) == 0 || len(c[1]) == 0:
				want = otMap2(xr, yr, func(a, b float64) float64 { return a * b })
			case len(c[1]) == 1:
				want = otDotGeneralRef(xr, yr, nil, nil, []int{len(c[0]) - 1}, []int{0})
			default:
				want = otDotGeneralRef(xr, yr, nil, nil, []int{len(c[0]) - 1}, []int{len(c[1]) - 2})
			}
			otCheck(t, otName("Dot", dt, ir.Shape(c[0]), ir.Shape(c[1])), trace.Dot(x, y), dt, want, 0)
		}
	}
	a, _ := otMake(r, ir.Float32, otNormal, 2, 3)
	otExpectError(t, "Dot", func() { trace.Dot(a, a) }, "axis 1 of x (size 3) and axis 0 of y (size 2) differ")
}

func TestOpsDotGeneral(t *testing.T) {
	r := otRand(t)
	cases := []struct {
		a, b           []int
		lb, rb, lc, rc []int
	}{
		{[]int{3, 4}, []int{4, 5}, nil, nil, []int{1}, []int{0}},
		{[]int{2, 3, 4}, []int{2, 5, 4}, []int{0}, []int{0}, []int{2}, []int{2}},
		{[]int{4, 2, 3}, []int{3, 2, 5}, []int{1}, []int{1}, []int{-1}, []int{0}},
		{[]int{2, 3}, []int{4}, nil, nil, nil, nil},
		{[]int{2, 3, 4}, []int{4, 3}, nil, nil, []int{1, 2}, []int{1, 0}},
		{[]int{2, 3}, []int{2, 3}, []int{0, 1}, []int{0, 1}, nil, nil},
		{[]int{0, 3}, []int{3, 2}, nil, nil, []int{1}, []int{0}},
	}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Int32, ir.BFloat16} {
		for _, c := range cases {
			x, xr := otMake(r, dt, otInts(-4, 4), c.a...)
			y, yr := otMake(r, dt, otInts(-4, 4), c.b...)
			norm := func(axes []int, rank int) []int {
				out := make([]int, len(axes))
				for i, a := range axes {
					out[i] = (a + rank) % rank
				}
				return out
			}
			want := otDotGeneralRef(xr, yr, norm(c.lb, len(c.a)), norm(c.rb, len(c.b)), norm(c.lc, len(c.a)), norm(c.rc, len(c.b)))
			tol := 0.0
			if dt == ir.BFloat16 {
				tol = 0.02
			}
			otCheck(t, otName("DotGeneral", dt, c), trace.DotGeneral(x, y, c.lb, c.rb, c.lc, c.rc), dt, want, tol)
		}
	}
	a, _ := otMake(r, ir.Float32, otNormal, 2, 3)
	b, _ := otMake(r, ir.Float32, otNormal, 4, 3)
	otExpectError(t, "DotGeneral", func() { trace.DotGeneral(a, b, []int{0}, []int{0}, nil, nil) }, "batch axis 0 of f32[2,3] (size 2) does not match axis 0 of f32[4,3] (size 4)")
	otExpectError(t, "DotGeneral", func() { trace.DotGeneral(a, b, nil, nil, []int{0}, []int{1}) }, "contracting axis 0")
	otExpectError(t, "DotGeneral", func() { trace.DotGeneral(a, b, nil, nil, []int{1, 1}, []int{1, 1}) }, "used twice")
	otExpectError(t, "DotGeneral", func() { trace.DotGeneral(a, b, nil, nil, []int{2}, []int{1}) }, "axis 2 out of range")
	otExpectError(t, "DotGeneral", func() { trace.DotGeneral(a, b, nil, nil, []int{1}, nil) }, "contracting dims")
}

// otEinsumRef evaluates an einsum spec by brute force over every assignment of
// the indices. "..." becomes digit labels, right-aligned, broadcasting size 1.
func otEinsumRef(spec string, xs ...otTensor) otTensor {
	spec = strings.ReplaceAll(spec, " ", "")
	lhs, rhs, explicit := strings.Cut(spec, "->")
	terms := strings.Split(lhs, ",")
	ell := 0
	for i, term := range terms {
		if strings.Contains(term, "...") {
			ell = max(ell, len(xs[i].shape)-(len(term)-3))
		}
	}
	expand := func(term string, n int) []rune {
		var out []rune
		pre, post, has := strings.Cut(term, "...")
		out = append(out, []rune(pre)...)
		if has {
			for j := ell - n; j < ell; j++ {
				out = append(out, rune('0'+j))
			}
			out = append(out, []rune(post)...)
		}
		return out
	}
	labels := make([][]rune, len(terms))
	size := map[rune]int{}
	count := map[rune]int{}
	for i, term := range terms {
		n := 0
		if strings.Contains(term, "...") {
			n = len(xs[i].shape) - (len(term) - 3)
		}
		labels[i] = expand(term, n)
		for d, l := range labels[i] {
			size[l] = max(size[l], xs[i].shape[d])
			count[l]++
		}
	}
	var out []rune
	if explicit {
		out = expand(rhs, ell)
	} else {
		for j := 0; j < ell; j++ {
			out = append(out, rune('0'+j))
		}
		var once []rune
		for l, c := range count {
			if c == 1 && (l < '0' || l > '9') {
				once = append(once, l)
			}
		}
		slices.Sort(once)
		out = append(out, once...)
	}
	all := slices.Clone(out)
	for l := range size {
		if !slices.Contains(all, l) {
			all = append(all, l)
		}
	}
	sizes := make([]int, len(all))
	for i, l := range all {
		sizes[i] = size[l]
	}
	res := otNew(sizes[:len(out)]...)
	for c := 0; c < otNumel(sizes); c++ {
		idx := otUnravel(c, sizes)
		val := map[rune]int{}
		for i, l := range all {
			val[l] = idx[i]
		}
		p := 1.0
		for k, x := range xs {
			xi := make([]int, len(x.shape))
			for d, l := range labels[k] {
				if x.shape[d] != 1 {
					xi[d] = val[l]
				}
			}
			p *= x.at(xi...)
		}
		res.data[otRavel(idx[:len(out)], sizes[:len(out)])] += p
	}
	return res
}

func TestOpsEinsum(t *testing.T) {
	r := otRand(t)
	cases := []struct {
		spec   string
		shapes [][]int
	}{
		{"ij,jk->ik", [][]int{{3, 4}, {4, 5}}},
		{"ij,jk", [][]int{{3, 4}, {4, 5}}},
		{"ji,jk->ki", [][]int{{4, 3}, {4, 5}}},
		{"ij->ji", [][]int{{3, 4}}},
		{"ij->", [][]int{{3, 4}}},
		{"ij", [][]int{{3, 4}}},
		{"ji", [][]int{{3, 4}}},
		{"ii->i", [][]int{{4, 4}}},
		{"ii", [][]int{{4, 4}}},
		{"iij->j", [][]int{{3, 3, 4}}},
		{"bij,bjk->bik", [][]int{{2, 3, 4}, {2, 4, 5}}},
		{"i,i->", [][]int{{5}, {5}}},
		{"i,i", [][]int{{5}, {5}}},
		{"i,j->ij", [][]int{{3}, {4}}},
		{"ij,ij->ij", [][]int{{3, 4}, {3, 4}}},
		{"ij,kl->", [][]int{{2, 3}, {4, 5}}},
		{"...ij,...jk->...ik", [][]int{{2, 3, 4}, {4, 5}}},
		{"...ij,...jk", [][]int{{2, 1, 3, 4}, {5, 4, 6}}},
		{"...i,i->...", [][]int{{2, 3, 4}, {4}}},
		{"i...->...i", [][]int{{3, 2, 4}}},
		{"...->", [][]int{{2, 3}}},
		{"bhqd,bhkd->bhqk", [][]int{{2, 3, 4, 5}, {2, 3, 6, 5}}},
		{"abc,cd,de->abe", [][]int{{2, 3, 4}, {4, 5}, {5, 6}}},
		{"ij,jk,kl->il", [][]int{{2, 3}, {3, 4}, {4, 5}}},
		{"Ab,bC->CA", [][]int{{2, 3}, {3, 4}}},
		{"i->", [][]int{{0}}},
		{"ij,jk->ik", [][]int{{3, 0}, {0, 5}}},
		{"ij,jk->ik", [][]int{{0, 2}, {2, 5}}},
		{" ij , jk -> ki ", [][]int{{3, 4}, {4, 5}}},
		{"bi,bi->b", [][]int{{4, 3}, {4, 3}}},
		{"ijk,jil->kl", [][]int{{2, 3, 4}, {3, 2, 5}}},
	}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Int32, ir.BFloat16} {
		for _, c := range cases {
			var xs []*trace.Array
			var refs []otTensor
			for _, s := range c.shapes {
				x, xr := otMake(r, dt, otInts(-3, 3), s...)
				xs = append(xs, x)
				refs = append(refs, xr)
			}
			tol := 0.0
			if dt == ir.BFloat16 {
				tol = 0.02
			}
			otCheck(t, otName("Einsum", dt, c.spec), trace.Einsum(c.spec, xs...), dt, otEinsumRef(c.spec, refs...), tol)
		}
	}
	// Mixed dtypes promote.
	a, ar := otMake(r, ir.Int32, otInts(-3, 3), 2, 3)
	b, br := otMake(r, ir.Float32, otNormal, 3)
	otCheck(t, "Einsum/promote", trace.Einsum("ij,j->i", a, b), ir.Float32, otEinsumRef("ij,j->i", ar, br), 1e-5)

	x, _ := otMake(r, ir.Float32, otNormal, 3, 4)
	y, _ := otMake(r, ir.Float32, otNormal, 5, 6)
	otExpectError(t, "Einsum", func() { trace.Einsum("ij,jk->ik", x) }, "2 operand terms but 1 arrays")
	otExpectError(t, "Einsum", func() { trace.Einsum("ij,jk->ik", x, y) }, "index 'j' has size 5 in operand 1")
	otExpectError(t, "Einsum", func() { trace.Einsum("ij->ik", x) }, "output index 'k' appears in no operand")
	otExpectError(t, "Einsum", func() { trace.Einsum("ij->ii", x) }, "index 'i' repeated in the output")
	otExpectError(t, "Einsum", func() { trace.Einsum("i$j", x) }, "bad character '$'")
	otExpectError(t, "Einsum", func() { trace.Einsum("ijk", x) }, "has 3 indices but f32[3,4] has rank 2")
	otExpectError(t, "Einsum", func() { trace.Einsum("i.j", x) }, "lone '.'")
	otExpectError(t, "Einsum", func() { trace.Einsum("ij->i->j", x) }, "more than one")
	otExpectError(t, "Einsum", func() { trace.Einsum("......", x) }, "more than one ellipsis")
	otExpectError(t, "Einsum", func() { trace.Einsum("ii", x) }, "index 'i' has size 4")
}

func TestOpsLinalgTraced(t *testing.T) {
	f32 := func(dims ...int) ir.Type { return ir.TypeOf(ir.Float32, dims...) }
	// A batched activation times a weight matrix: no broadcast of the weights.
	ops, out := otTrace(func(a ...*trace.Array) *trace.Array {
		return trace.MatMul(a[0], a[1])
	}, f32(8, 16, 32), f32(32, 64))
	codes := otCodes(ops)
	if codes[ir.DotGeneral] != 1 || codes[ir.BroadcastInDim] != 0 || len(ops) != 1 {
		t.Errorf("MatMul([8,16,32], [32,64]) recorded %v", codes)
	}
	if !out.Type().Equal(f32(8, 16, 64)) {
		t.Errorf("result %v", out.Type())
	}
	ops, out = otTrace(func(a ...*trace.Array) *trace.Array {
		return trace.Einsum("bhqd,bhkd->bhqk", a[0], a[1])
	}, f32(2, 4, 8, 16), f32(2, 4, 10, 16))
	codes = otCodes(ops)
	if codes[ir.DotGeneral] != 1 || !out.Type().Equal(f32(2, 4, 8, 10)) {
		t.Errorf("attention einsum recorded %v with result %v", codes, out.Type())
	}
	for _, op := range ops {
		if op.Code == ir.DotGeneral {
			if b := op.Attrs.Ints("lhs_batch"); !slices.Equal(b, []int{0, 1}) {
				t.Errorf("attention einsum batch dims %v, want [0 1]", b)
			}
		}
	}
}
