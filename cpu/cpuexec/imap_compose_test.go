package cpuexec

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomView returns a stage viewing a row-major array of the given shape:
// dims permuted, sliced (start, step), some broadcast (stride 0), as the
// shape ops of a fused group build them.
func randomView(r *rand.Rand, shape []int) (stage, bool, []int) {
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
	st, ident := newStage(outShape, outSt, off)
	return st, ident, outShape
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

// TestComposeMatchesChain checks compose against applying the two stages in
// turn, over random views and reshapes, and that the composable chains the
// attention head split makes do compose.
func TestComposeMatchesChain(t *testing.T) {
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
		c, ok := compose(a, b)
		if !ok {
			continue
		}
		composed++
		for i := range size(out) {
			if got, want := c.apply(i), b.apply(a.apply(i)); got != want {
				t.Fatalf("compose(%+v, %+v) = %+v: index %d maps to %d, want %d", a, b, c, i, got, want)
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
	tr, _ := newStage([]int{B, H, S, D}, []int{S * H * D, D, H * D, 1}, 0)
	sl, _ := newStage([]int{1, 1, S, D}, []int{H * S * D, S * D, D, 1}, 1*H*S*D+2*S*D)
	c, ok := compose(sl, tr)
	if !ok {
		t.Fatalf("slice after transpose did not compose")
	}
	for i := range S * D {
		if got, want := c.apply(i), tr.apply(sl.apply(i)); got != want {
			t.Fatalf("head slice: index %d maps to %d, want %d", i, got, want)
		}
	}
	m := imap{sl}.then(tr, false)
	if len(m) != 1 {
		t.Fatalf("then kept %d stages, want 1", len(m))
	}
	if !slices.Equal(m[0].shape, c.shape) {
		t.Fatalf("then stage %+v, compose %+v", m[0], c)
	}
}
