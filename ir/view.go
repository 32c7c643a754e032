package ir

import (
	"slices"
	"strconv"
	"strings"
)

// StridedView (a view, for short) maps the flat row-major index i of a value to the flat element index
// Offset + Σ_d coord_d(i)·Strides[d] of the array it reads, where coord(i)
// is i's coordinate in Shape. It is how a kernel reads an operand through
// broadcast_in_dim, transpose, slice and reshape without copying: the one
// place these index formulas are written (ViewOf). Views are kept simple
// (NewStridedView): size-1 dimensions dropped, contiguous dimensions merged.
type StridedView struct {
	Shape   []int
	Strides []int
	Offset  int
}

// NewStridedView returns the simplified view of shape with strides and offset: size-1
// dimensions dropped and neighbours merged where the outer stride is the
// inner one times the inner extent.
func NewStridedView(shape, strides []int, offset int) StridedView {
	var v StridedView
	v.Offset = offset
	for d, n := range shape {
		if n == 1 {
			continue
		}
		if k := len(v.Shape) - 1; k >= 0 && v.Strides[k] == strides[d]*n {
			v.Shape[k] *= n
			v.Strides[k] = strides[d]
			continue
		}
		v.Shape = append(v.Shape, n)
		v.Strides = append(v.Strides, strides[d])
	}
	return v
}

// ViewOf returns the view through which result 0 of op reads operand 0,
// from the op table's View rule (OpInfo.View): broadcast_in_dim, transpose,
// slice and, as the identity, reshape. ok is false for every other op.
func ViewOf(op *Op) (v StridedView, ok bool) {
	if int(op.Code) >= len(opTable) || opTable[op.Code].View == nil {
		return StridedView{}, false
	}
	return opTable[op.Code].View(op), true
}

// The View rules of the op table.
func viewBroadcastInDim(op *Op) StridedView {
	return BroadcastView(op.Args[0].Type.Shape, op.Results[0].Type.Shape, op.Attrs.Ints("dims"))
}

func viewTranspose(op *Op) StridedView {
	return TransposeView(op.Args[0].Type.Shape, op.Attrs.Ints("perm"))
}

func viewSlice(op *Op) StridedView {
	return SliceView(op.Args[0].Type.Shape, op.Results[0].Type.Shape, op.Attrs.Ints("start"), op.Attrs.Ints("strides"))
}

func viewReshape(*Op) StridedView { return StridedView{} }

// BroadcastView is the view of broadcast_in_dim from shape in to shape out,
// operand dimension i becoming result dimension dims[i] (size-1 operand
// dimensions broadcast: stride 0).
func BroadcastView(in, out Shape, dims []int) StridedView {
	ist := in.Strides()
	st := make([]int, len(out))
	for i, d := range dims {
		if in[i] != 1 {
			st[d] = ist[i]
		}
	}
	return NewStridedView(out, st, 0)
}

// TransposeView is the view of transpose of shape in by perm (result
// dimension i is operand dimension perm[i]).
func TransposeView(in Shape, perm []int) StridedView {
	ist := in.Strides()
	out := make([]int, len(perm))
	st := make([]int, len(perm))
	for i, p := range perm {
		out[i], st[i] = in[p], ist[p]
	}
	return NewStridedView(out, st, 0)
}

// SliceView is the view of a slice of shape in from start with strides,
// whose result has shape out.
func SliceView(in, out Shape, start, strides []int) StridedView {
	ist := in.Strides()
	st := make([]int, len(out))
	off := 0
	for i := range st {
		st[i] = ist[i] * strides[i]
		off += start[i] * ist[i]
	}
	return NewStridedView(out, st, off)
}

// IsIdentity reports whether v maps every index to itself.
func (v StridedView) IsIdentity() bool {
	return v.Offset == 0 && (len(v.Shape) == 0 || len(v.Shape) == 1 && v.Strides[0] == 1)
}

// IsConstant reports whether v maps every index to Offset.
func (v StridedView) IsConstant() bool {
	for _, s := range v.Strides {
		if s != 0 {
			return false
		}
	}
	return true
}

// At maps one flat index.
func (v StridedView) At(i int) int {
	j := v.Offset
	for d := len(v.Shape) - 1; d >= 0; d-- {
		n := v.Shape[d]
		j += (i % n) * v.Strides[d]
		i /= n
	}
	return j
}

// Indices writes the mapped index of every i in [lo, lo+len(out)), walking
// the innermost dimension in runs.
func (v StridedView) Indices(lo int, out []int) {
	w := v.Runs(lo, len(out))
	for w.Next() {
		for t := range w.N {
			out[w.K+t] = w.J + t*w.Stride
		}
	}
}

// Runs walks the mapped indices of [lo, lo+n) one run at a time: a stretch
// of the innermost dimension, whose elements are Stride apart in the
// operand (0: one element repeated). Gathers copy a run at once.
//
//	w := v.Runs(lo, n)
//	for w.Next() {
//		// elements lo+w.K … lo+w.K+w.N-1 read operand indices w.J, w.J+w.Stride, …
//	}
func (v *StridedView) Runs(lo, n int) ViewRuns {
	return ViewRuns{v: v, left: n, lo: lo}
}

// ViewRuns is a walk over a view's runs (StridedView.Runs). After Next
// returns true, K is the run's first element (from the walk's start), N its
// length, J the operand index of its first element and Stride the step
// between the operand indices of its elements.
type ViewRuns struct {
	K, N, J, Stride int

	v       *StridedView
	left    int
	lo      int
	started bool
	small   [8]int // the coordinates of rank ≤ 8 (kept in the walk: no allocation)
	big     []int  // of a larger rank
}

// coords returns the walk's current coordinate of every dimension.
func (w *ViewRuns) coords() []int {
	if w.big != nil {
		return w.big
	}
	return w.small[:len(w.v.Shape)]
}

// start places the walk on element lo.
func (w *ViewRuns) start() {
	v := w.v
	w.started, w.J = true, v.Offset
	r := len(v.Shape)
	if r == 0 {
		return
	}
	if r > len(w.small) {
		w.big = make([]int, r)
	}
	idx := w.coords()
	rem := w.lo
	for d := r - 1; d >= 0; d-- {
		idx[d] = rem % v.Shape[d]
		rem /= v.Shape[d]
		w.J += idx[d] * v.Strides[d]
	}
	w.Stride = v.Strides[r-1]
}

// Next moves to the next run, or reports false at the end.
func (w *ViewRuns) Next() bool {
	v := w.v
	if !w.started {
		w.start()
	} else {
		w.K += w.N
		w.left -= w.N
		r := len(v.Shape)
		if r == 0 || w.left <= 0 {
			w.left = 0
			return false
		}
		w.J += w.N * w.Stride
		idx := w.coords()
		idx[r-1] += w.N
		for d := r - 1; d > 0 && idx[d] == v.Shape[d]; d-- {
			w.J -= idx[d] * v.Strides[d]
			idx[d] = 0
			idx[d-1]++
			w.J += v.Strides[d-1]
		}
	}
	if w.left <= 0 {
		return false
	}
	if len(v.Shape) == 0 {
		w.N = w.left // one element repeated
		return true
	}
	r := len(v.Shape)
	w.N = min(v.Shape[r-1]-w.coords()[r-1], w.left)
	return true
}

// String formats v as "off+[shape:stride,...]", the form plan dumps use.
func (v StridedView) String() string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(v.Offset))
	b.WriteString("+[")
	for d := range v.Shape {
		if d > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(v.Shape[d]))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(v.Strides[d]))
	}
	b.WriteByte(']')
	return b.String()
}

// ComposeViews returns the single view equal to applying a and then b, when
// one exists: a maps an output index into b's domain (b.Shape flattened
// row-major), b maps that into its operand. It exists when every dimension of
// a moves within one mixed-radix digit of b's domain without carrying into
// the next (a dimension that spans whole digits is split first). A reshape
// followed by a transpose, broadcast or slice (attention's head split)
// composes; the caller keeps the chain otherwise.
func ComposeViews(a, b StridedView) (StridedView, bool) {
	r := len(b.Shape)
	if total := Shape(b.Shape).Size(); total == 0 || a.Offset < 0 || a.Offset >= total {
		return StridedView{}, false
	}
	place := Shape(b.Shape).Strides() // place[k] = Π b.Shape[k+1:]
	c := composer{b: b, place: place, used: make([]int, r)}
	off := b.Offset
	for k := range r {
		c.used[k] = a.Offset / place[k] % b.Shape[k]
		off += c.used[k] * b.Strides[k]
	}
	for d, n := range a.Shape {
		if !c.add(n, a.Strides[d]) {
			return StridedView{}, false
		}
	}
	return NewStridedView(c.shape, c.strides, off), true
}

// composer places a's dimensions on the digits of b's domain.
type composer struct {
	b              StridedView
	place          []int
	used           []int // per digit: its offset plus the largest step of the dims on it
	shape, strides []int
}

// add places one dimension (extent n, stride s in b's domain).
func (c *composer) add(n, s int) bool {
	b, r := c.b, len(c.b.Shape)
	if s < 0 {
		return false
	}
	if s == 0 || n == 1 {
		c.shape, c.strides = append(c.shape, n), append(c.strides, 0)
		return true
	}
	k := 0
	for k < r && s%c.place[k] != 0 {
		k++
	}
	if k == r {
		return false
	}
	m := s / c.place[k]
	if c.used[k]+m*(n-1) < b.Shape[k] {
		c.used[k] += m * (n - 1)
		c.shape, c.strides = append(c.shape, n), append(c.strides, m*b.Strides[k])
		return true
	}
	// The dimension covers digit k whole (and more): split it into the outer
	// part, one step of the next digit up, and the inner part.
	if c.used[k] != 0 || b.Shape[k]%m != 0 || k == 0 {
		return false
	}
	in := b.Shape[k] / m
	if n%in != 0 {
		return false
	}
	if !c.add(n/in, s*in) {
		return false
	}
	c.used[k] = m * (in - 1)
	c.shape, c.strides = append(c.shape, in), append(c.strides, m*b.Strides[k])
	return true
}

// ViewChain is a chain of views applied in order (empty: the identity), for
// reads whose views do not compose into one.
type ViewChain []StridedView

// Then returns the chain followed by v (composed with the last view when
// they compose; dropped when v is the identity).
func (c ViewChain) Then(v StridedView) ViewChain {
	if v.IsIdentity() {
		return c
	}
	if k := len(c) - 1; k >= 0 {
		if w, ok := ComposeViews(c[k], v); ok {
			if w.IsIdentity() {
				return slices.Clip(c[:k]) // the two cancel
			}
			return append(slices.Clip(c[:k]), w)
		}
	}
	return append(slices.Clip(c), v)
}

// IsConstant reports whether every index maps to the same place.
func (c ViewChain) IsConstant() bool { return len(c) > 0 && c[0].IsConstant() }

// At maps one flat index through every view.
func (c ViewChain) At(i int) int {
	for k := range c {
		i = c[k].At(i)
	}
	return i
}

// String formats the chain's views joined by " then ", or "id" when empty.
func (c ViewChain) String() string {
	if len(c) == 0 {
		return "id"
	}
	parts := make([]string, len(c))
	for i, v := range c {
		parts[i] = v.String()
	}
	return strings.Join(parts, " then ")
}
