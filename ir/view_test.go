package ir_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomView returns a view viewing a row-major array of the given shape:
// dims permuted, sliced (start, step), some broadcast (stride 0), as the
// shape ops of a fused group build them.
func randomView(r *rand.Rand, shape []int) (ir.StridedView, bool, []int) {
	strides := make([]int, len(shape))
	p := 1
	for d := len(shape) - 1; d >= 0; d-- {
		strides[d] = p
		p *= shape[d]
	}
	perm := r.Perm(len(shape))
	var outShape, outSt []int
	off := 0
	for _, d := range perm {
		n, s := shape[d], strides[d]
		switch r.IntN(4) {
		case 0: // slice with a start and a step
			step := 1 + r.IntN(2)
			start := r.IntN(n)
			cnt := (n - start + step - 1) / step
			off += start * s
			n, s = cnt, s*step
		case 1:
			if r.IntN(2) == 0 { // broadcast a new dim
				outShape, outSt = append(outShape, 1+r.IntN(3)), append(outSt, 0)
			}
		}
		outShape, outSt = append(outShape, n), append(outSt, s)
	}
	st := ir.NewStridedView(outShape, outSt, off)
	return st, st.IsIdentity(), outShape
}

func randomShape(r *rand.Rand) []int {
	s := make([]int, 1+r.IntN(4))
	for i := range s {
		s[i] = 1 + r.IntN(5)
	}
	return s
}

func size(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// TestComposeViewsMatchesChain checks ComposeViews against applying the two stages in
// turn, over random views and reshapes, and that the composable chains the
// attention head split makes do compose.
func TestComposeViewsMatchesChain(t *testing.T) {
	r := testseed.Rand(t, 5)
	composed := 0
	for range 4000 {
		src := randomShape(r)
		b, bid, mid := randomView(r, src)
		if bid {
			continue
		}
		// a views mid, possibly after a reshape of mid (a view of the same
		// flat index with another factorisation).
		midShape := mid
		if r.IntN(2) == 0 {
			n := size(mid)
			var f []int
			for n > 1 {
				d := 2 + r.IntN(3)
				for n%d != 0 && d > 2 {
					d--
				}
				if n%d != 0 {
					d = n // a prime factor left
				}
				f = append(f, d)
				n /= d
			}
			if len(f) > 0 {
				midShape = f
			}
		}
		a, aid, out := randomView(r, midShape)
		if aid {
			continue
		}
		c, ok := ir.ComposeViews(a, b)
		if !ok {
			continue
		}
		composed++
		for i := range size(out) {
			if got, want := c.At(i), b.At(a.At(i)); got != want {
				t.Fatalf("ir.ComposeViews(%+v, %+v) = %+v: index %d maps to %d, want %d", a, b, c, i, got, want)
			}
		}
	}
	if composed < 1000 {
		t.Fatalf("only %d of the random chains composed", composed)
	}

	// Attention's head split: x[b, s, h*d] reshaped to [b, s, h, d] then
	// transposed to [b, h, s, d]: reshape is the identity on flat indices, the
	// transpose one stage; then a slice of the result (one head).
	B, S, H, D := 2, 5, 3, 4
	tr := ir.NewStridedView([]int{B, H, S, D}, []int{S * H * D, D, H * D, 1}, 0)
	sl := ir.NewStridedView([]int{1, 1, S, D}, []int{H * S * D, S * D, D, 1}, 1*H*S*D+2*S*D)
	c, ok := ir.ComposeViews(sl, tr)
	if !ok {
		t.Fatalf("slice after transpose did not compose")
	}
	for i := range S * D {
		if got, want := c.At(i), tr.At(sl.At(i)); got != want {
			t.Fatalf("head slice: index %d maps to %d, want %d", i, got, want)
		}
	}
	m := ir.ViewChain{sl}.Then(tr)
	if len(m) != 1 {
		t.Fatalf("then kept %d views, want 1", len(m))
	}
	if !slices.Equal(m[0].Shape, c.Shape) {
		t.Fatalf("Then view %+v, compose %+v", m[0], c)
	}
}

// TestViewOfMatchesCoordinates checks ViewOf's index of every element of
// random broadcast_in_dim, transpose and slice ops against the element's
// coordinates mapped by the op's definition, and Indices against At.
func TestViewOfMatchesCoordinates(t *testing.T) {
	r := testseed.Rand(t, 11)
	for range 500 {
		in := ir.Shape(randomShape(r))
		x := &ir.Value{Type: ir.TypeOf(ir.Float32, in...)}
		var op *ir.Op
		var src func(c []int) []int // output coordinate → operand coordinate
		switch r.IntN(3) {
		case 0:
			perm := r.Perm(len(in))
			out := make([]int, len(in))
			for i, p := range perm {
				out[i] = in[p]
			}
			op = &ir.Op{Code: ir.Transpose, Attrs: ir.Attrs{"perm": perm}, Results: []*ir.Value{{Type: ir.TypeOf(ir.Float32, out...)}}}
			src = func(c []int) []int {
				s := make([]int, len(c))
				for i, p := range perm {
					s[p] = c[i]
				}
				return s
			}
		case 1:
			start, strides, out := make([]int, len(in)), make([]int, len(in)), make([]int, len(in))
			for d, n := range in {
				start[d], strides[d] = r.IntN(n), 1+r.IntN(2)
				out[d] = (n - start[d] + strides[d] - 1) / strides[d]
			}
			op = &ir.Op{Code: ir.Slice, Attrs: ir.Attrs{"start": start, "strides": strides}, Results: []*ir.Value{{Type: ir.TypeOf(ir.Float32, out...)}}}
			src = func(c []int) []int {
				s := make([]int, len(c))
				for d := range c {
					s[d] = start[d] + c[d]*strides[d]
				}
				return s
			}
		default:
			// Insert a new dimension at a random place; operand dims of
			// size 1 broadcast too.
			at := r.IntN(len(in) + 1)
			var dims, out []int
			for d := range in {
				if d == at {
					out = append(out, 1+r.IntN(3))
				}
				dims = append(dims, len(out))
				n := in[d]
				if n == 1 {
					n = 1 + r.IntN(3)
				}
				out = append(out, n)
			}
			if at == len(in) {
				out = append(out, 1+r.IntN(3))
			}
			op = &ir.Op{Code: ir.BroadcastInDim, Attrs: ir.Attrs{"dims": dims}, Results: []*ir.Value{{Type: ir.TypeOf(ir.Float32, out...)}}}
			src = func(c []int) []int {
				s := make([]int, len(in))
				for i, d := range dims {
					if in[i] != 1 {
						s[i] = c[d]
					}
				}
				return s
			}
		}
		op.Args = []*ir.Value{x}
		v, ok := ir.ViewOf(op)
		if !ok {
			t.Fatalf("ViewOf(%v) not ok", op.Code)
		}
		out := op.Results[0].Type.Shape
		n := out.Size()
		idx := make([]int, n)
		v.Indices(0, idx)
		ist := in.Strides()
		for i := range n {
			c := make([]int, len(out))
			for d, rem := len(out)-1, i; d >= 0; d-- {
				c[d] = rem % out[d]
				rem /= out[d]
			}
			want := 0
			for d, k := range src(c) {
				want += k * ist[d]
			}
			if got := v.At(i); got != want || idx[i] != want {
				t.Fatalf("%v %v→%v: element %d (%v) maps to %d (Indices %d), want %d", op.Code, in, out, i, c, got, idx[i], want)
			}
		}
	}
}

// TestViewRunsMatchAt walks random views from random starting elements,
// through Indices (and so Runs), against At element by element, ranks past
// the walk's eight inline coordinates included.
func TestViewRunsMatchAt(t *testing.T) {
	r := testseed.Rand(t, 13)
	for range 2000 {
		shape := randomShape(r)
		if r.IntN(10) == 0 {
			for len(shape) < 10 {
				shape = append(shape, 1+r.IntN(2))
			}
		}
		v, _, out := randomView(r, shape)
		n := size(out)
		lo := r.IntN(n)
		got := make([]int, r.IntN(n-lo+1))
		v.Indices(lo, got)
		for k, j := range got {
			if want := v.At(lo + k); j != want {
				t.Fatalf("view %v from %d: element %d maps to %d, At gives %d", v, lo, lo+k, j, want)
			}
		}
	}
}
