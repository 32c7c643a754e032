package cpuexec

import "github.com/ferryml/ferry/ir"

// compose returns the single stage equal to applying a and then b, when one
// exists: a maps an output index into b's domain (b.shape flattened row-major),
// b maps that into its operand. It exists when every dimension of a moves
// within one mixed-radix digit of b's domain without carrying into the next
// (a dimension that spans whole digits is split first). A reshape followed by
// a transpose, broadcast or slice, the chains a fused group builds from
// attention's head split, compose; the caller keeps the chain otherwise.
func compose(a, b stage) (stage, bool) {
	r := len(b.shape)
	if total := ir.Shape(b.shape).Size(); total == 0 || a.off < 0 || a.off >= total {
		return stage{}, false
	}
	place := ir.Shape(b.shape).Strides() // place[k] = Π b.shape[k+1:]
	// used[k]: digit k's offset plus the largest step of the dims on it.
	used := make([]int, r)
	off := b.off
	for k := range r {
		used[k] = a.off / place[k] % b.shape[k]
		off += used[k] * b.st[k]
	}
	var shape, st []int
	// add places one dimension (extent n, stride s in b's domain).
	var add func(n, s int) bool
	add = func(n, s int) bool {
		if s < 0 {
			return false
		}
		if s == 0 || n == 1 {
			shape, st = append(shape, n), append(st, 0)
			return true
		}
		k := 0
		for k < r && s%place[k] != 0 {
			k++
		}
		if k == r {
			return false
		}
		c := s / place[k]
		if used[k]+c*(n-1) < b.shape[k] {
			used[k] += c * (n - 1)
			shape, st = append(shape, n), append(st, c*b.st[k])
			return true
		}
		// The dimension covers digit k whole (and more): split it into the
		// outer part, one step of the next digit up, and the inner part.
		if used[k] != 0 || b.shape[k]%c != 0 || k == 0 {
			return false
		}
		in := b.shape[k] / c
		if n%in != 0 {
			return false
		}
		if !add(n/in, s*in) {
			return false
		}
		used[k] = c * (in - 1)
		shape, st = append(shape, in), append(st, c*b.st[k])
		return true
	}
	for d, n := range a.shape {
		if !add(n, a.st[d]) {
			return stage{}, false
		}
	}
	s, _ := newStage(shape, st, off)
	return s, true
}
