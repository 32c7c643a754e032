package trace

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ferryml/ferry/ir"
)

// normAxisList normalises a list of axes of x for op, naming what (e.g.
// "lhs contracting dims") in errors.
func normAxisList(op, what string, x *Array, axes []int) []int {
	r := x.Rank()
	out := make([]int, len(axes))
	for i, a := range axes {
		if a < -r || a >= r {
			panic(Errorf(op, "%s %v: axis %d out of range for %v", what, axes, a, x.typ))
		}
		if a < 0 {
			a += r
		}
		out[i] = a
	}
	return out
}

// promoteNumeric promotes xs for op and checks the result is numeric.
func promoteNumeric(op string, xs ...*Array) []*Array {
	args, dt, _ := promote(op, xs...)
	if dt == ir.Bool {
		panic(Errorf(op, "needs numeric operands, got %s", typeList(xs)))
	}
	return args
}

// DotGeneral is lax.dot_general: it multiplies x and y, summing over the
// contracting axes (lhsContract[i] of x with rhsContract[i] of y) and matching the
// batch axes pairwise. The result axes are the batch axes, then x's remaining
// axes, then y's remaining axes, in order. Negative axes count from the end;
// dtypes are promoted as in Add.
func DotGeneral(x, y *Array, lhsBatch, rhsBatch, lhsContract, rhsContract []int) *Array {
	const op = "DotGeneral"
	needArrays(op, x, y)
	lb := normAxisList(op, "lhs batch dims", x, lhsBatch)
	rb := normAxisList(op, "rhs batch dims", y, rhsBatch)
	lc := normAxisList(op, "lhs contracting dims", x, lhsContract)
	rc := normAxisList(op, "rhs contracting dims", y, rhsContract)
	if len(lb) != len(rb) {
		panic(Errorf(op, "%d lhs batch dims %v but %d rhs batch dims %v", len(lb), lhsBatch, len(rb), rhsBatch))
	}
	if len(lc) != len(rc) {
		panic(Errorf(op, "%d lhs contracting dims %v but %d rhs contracting dims %v", len(lc), lhsContract, len(rc), rhsContract))
	}
	checkUnique := func(x *Array, side string, axes []int) {
		seen := map[int]bool{}
		for _, a := range axes {
			if seen[a] {
				panic(Errorf(op, "%s axis %d of %v is used twice among the batch and contracting dims", side, a, x.typ))
			}
			seen[a] = true
		}
	}
	checkUnique(x, "lhs", append(slices.Clone(lb), lc...))
	checkUnique(y, "rhs", append(slices.Clone(rb), rc...))
	for i := range lb {
		if x.typ.Shape[lb[i]] != y.typ.Shape[rb[i]] {
			panic(Errorf(op, "batch axis %d of %v (size %d) does not match axis %d of %v (size %d)", lb[i], x.typ, x.typ.Shape[lb[i]], rb[i], y.typ, y.typ.Shape[rb[i]]))
		}
	}
	for i := range lc {
		if x.typ.Shape[lc[i]] != y.typ.Shape[rc[i]] {
			panic(Errorf(op, "contracting axis %d of %v (size %d) does not match axis %d of %v (size %d)", lc[i], x.typ, x.typ.Shape[lc[i]], rc[i], y.typ, y.typ.Shape[rc[i]]))
		}
	}
	args := promoteNumeric(op, x, y)
	return dotGeneral(args[0], args[1], lb, rb, lc, rc)
}

// dotGeneral emits dot_general on checked, promoted operands.
func dotGeneral(x, y *Array, lb, rb, lc, rc []int) *Array {
	c := func(s []int) []int {
		if s == nil {
			return []int{}
		}
		return slices.Clone(s)
	}
	return Apply1(ir.DotGeneral, ir.Attrs{"lhs_batch": c(lb), "rhs_batch": c(rb), "lhs_contract": c(lc), "rhs_contract": c(rc)}, x, y)
}

// MatMul is the matrix product with NumPy's matmul semantics: 2-D operands
// multiply as matrices; a 1-D x is a row vector and a 1-D y a column vector
// (that axis is removed from the result); operands of rank above 2 are stacks of
// matrices in their last two axes, whose leading (batch) axes broadcast together,
// and the result is batch + [n, m]. Scalars are an error (use Mul). Dtypes are
// promoted as in Add.
func MatMul(x, y *Array) *Array {
	const op = "MatMul"
	needArrays(op, x, y)
	xr, yr := x.Rank(), y.Rank()
	if xr == 0 || yr == 0 {
		panic(Errorf(op, "operands must have rank ≥ 1, got %s (use Mul for scalars)", typeList([]*Array{x, y})))
	}
	xs, ys := x.typ.Shape, y.typ.Shape
	k := xs[xr-1]
	yk := 0
	if yr > 1 {
		yk = yr - 2
	}
	if ys[yk] != k {
		panic(Errorf(op, "shapes %s: inner dimensions %d and %d differ", typeList([]*Array{x, y}), k, ys[yk]))
	}
	var batch ir.Shape
	if xr > 2 || yr > 2 {
		var ok bool
		batch, ok = broadcastShapes(xs[:max(xr-2, 0)], ys[:max(yr-2, 0)])
		if !ok {
			panic(Errorf(op, "batch dimensions of %s do not broadcast", typeList([]*Array{x, y})))
		}
	}
	args := promoteNumeric(op, x, y)
	x, y = args[0], args[1]
	switch {
	case yr == 1:
		// (..., n, k) · (k) → (..., n)
		return dotGeneral(x, y, nil, nil, []int{xr - 1}, []int{0})
	case xr == 1:
		// (k) · (..., k, m) → (..., m)
		return dotGeneral(x, y, nil, nil, []int{0}, []int{yr - 2})
	}
	n, m := xs[xr-2], ys[yr-1]
	final := append(slices.Clone(batch), n, m)
	xbSize, ybSize := ir.Shape(xs[:xr-2]).Size(), ir.Shape(ys[:yr-2]).Size()
	var r *Array
	switch {
	case ybSize == 1:
		// y is one matrix: contract x's last axis with it directly.
		if yr > 2 {
			y = Apply1(ir.Reshape, ir.Attrs{"shape": []int{k, m}}, y)
		}
		if xbSize == 1 && xr > 2 {
			x = Apply1(ir.Reshape, ir.Attrs{"shape": []int{n, k}}, x)
		}
		r = dotGeneral(x, y, nil, nil, []int{x.Rank() - 1}, []int{0})
	case xbSize == 1:
		// x is one matrix: (n,k)·(B...,k,m) → (n,B...,m), then move n.
		if xr > 2 {
			x = Apply1(ir.Reshape, ir.Attrs{"shape": []int{n, k}}, x)
		}
		r = dotGeneral(x, y, nil, nil, []int{1}, []int{yr - 2})
		nb := yr - 2
		perm := make([]int, 0, nb+2)
		for i := 1; i <= nb; i++ {
			perm = append(perm, i)
		}
		perm = append(perm, 0, nb+1)
		r = Apply1(ir.Transpose, ir.Attrs{"perm": perm}, r)
	default:
		nb := len(batch)
		x = broadcastTo(x, append(slices.Clone(batch), n, k))
		y = broadcastTo(y, append(slices.Clone(batch), k, m))
		bd := make([]int, nb)
		for i := range bd {
			bd[i] = i
		}
		r = dotGeneral(x, y, bd, bd, []int{nb + 1}, []int{nb})
	}
	if !r.typ.Shape.Equal(final) {
		r = Apply1(ir.Reshape, ir.Attrs{"shape": []int(final)}, r)
	}
	return r
}

// Dot is NumPy's dot: for scalars it is Mul; for a 1-D y it sums over the last
// axis of x and y; otherwise it sums over the last axis of x and the
// second-to-last axis of y, and the result axes are x's remaining axes followed
// by y's. Dtypes are promoted as in Add.
func Dot(x, y *Array) *Array {
	const op = "Dot"
	needArrays(op, x, y)
	if x.Rank() == 0 || y.Rank() == 0 {
		return Mul(x, y)
	}
	xc := x.Rank() - 1
	yc := 0
	if y.Rank() > 1 {
		yc = y.Rank() - 2
	}
	if x.typ.Shape[xc] != y.typ.Shape[yc] {
		panic(Errorf(op, "shapes %s: axis %d of x (size %d) and axis %d of y (size %d) differ", typeList([]*Array{x, y}), xc, x.typ.Shape[xc], yc, y.typ.Shape[yc]))
	}
	args := promoteNumeric(op, x, y)
	return dotGeneral(args[0], args[1], nil, nil, []int{xc}, []int{yc})
}

// ellipsisBase is the first of the private-use runes standing for the axes an
// ellipsis covers in Einsum.
const ellipsisBase = 0xE000

// einsumTerm parses one subscript term into labels: letters, and an ellipsis
// expanded to ell placeholder runes (right-aligned over maxEll).
func einsumTerm(spec, term string) (letters []rune, hasEll bool, err error) {
	for i := 0; i < len(term); i++ {
		c := term[i]
		switch {
		case c == '.':
			if !strings.HasPrefix(term[i:], "...") {
				return nil, false, fmt.Errorf("spec %q: a lone '.' (an ellipsis is \"...\")", spec)
			}
			if hasEll {
				return nil, false, fmt.Errorf("spec %q: more than one ellipsis in term %q", spec, term)
			}
			hasEll = true
			letters = append(letters, -1) // position of the ellipsis
			i += 2
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			letters = append(letters, rune(c))
		default:
			return nil, false, fmt.Errorf("spec %q: bad character %q (indices are letters a-z, A-Z)", spec, c)
		}
	}
	return letters, hasEll, nil
}

// expandEll replaces the ellipsis marker (-1) by placeholders for n axes,
// right-aligned among maxEll.
func expandEll(labels []rune, n, maxEll int) []rune {
	var out []rune
	for _, l := range labels {
		if l == -1 {
			for j := maxEll - n; j < maxEll; j++ {
				out = append(out, rune(ellipsisBase+j))
			}
			continue
		}
		out = append(out, l)
	}
	return out
}

func labelName(l rune) string {
	if l >= ellipsisBase {
		return fmt.Sprintf("ellipsis axis %d", int(l-ellipsisBase))
	}
	return fmt.Sprintf("index '%c'", l)
}

// einsumOperand is an operand with one label per axis.
type einsumOperand struct {
	x      *Array
	labels []rune
}

// Einsum evaluates an Einstein summation over the operands, like jnp.einsum.
// spec lists one term of index letters per operand, separated by commas, and
// optionally "->" and the output term ("ij,jk->ik"). Without "->" (implicit mode)
// the output holds the indices that appear exactly once, in alphabetical order.
// An index shared by operands and kept in the output is a batch index; one left
// out of the output is summed; an index repeated within one term takes the
// diagonal ("ii->i"). "..." stands for the remaining leading axes, which
// broadcast across operands (size 1 against n) and come first in an implicit
// output. Operands are contracted left to right with dot_general; dtypes are
// promoted as in Add.
func Einsum(spec string, operands ...*Array) *Array {
	const op = "Einsum"
	needArrays(op, operands...)
	if len(operands) == 0 {
		panic(Errorf(op, "no operands for spec %q", spec))
	}
	s := strings.ReplaceAll(spec, " ", "")
	lhs, outTerm, explicit := strings.Cut(s, "->")
	if explicit && strings.Contains(outTerm, "->") {
		panic(Errorf(op, "spec %q has more than one \"->\"", spec))
	}
	terms := strings.Split(lhs, ",")
	if len(terms) != len(operands) {
		panic(Errorf(op, "spec %q has %d operand terms but %d arrays were given", spec, len(terms), len(operands)))
	}
	e := &einsumState{spec: spec, sizes: map[rune]int{}, counts: map[rune]int{}}
	raw, ells := e.parseTerms(terms, operands)
	e.labelOperands(operands, raw, ells)
	if explicit {
		e.explicitOutput(outTerm)
	} else {
		e.implicitOutput()
	}
	e.promote()
	e.reduceOperands()
	return e.contract()
}

// einsumState is the state of one Einsum: its operands with their labels,
// the size of every label and the output labels.
type einsumState struct {
	spec string
	// maxEll is the most axes an ellipsis stands for in any operand.
	maxEll int
	ops    []einsumOperand
	// sizes is each label's size; counts how many operand axes carry it.
	sizes, counts map[rune]int
	out           []rune
}

// parseTerms parses the operand terms and returns their labels (the
// ellipsis marked by -1) and the number of axes each ellipsis stands for.
func (e *einsumState) parseTerms(terms []string, operands []*Array) (raw [][]rune, ells []int) {
	const op = "Einsum"
	spec := e.spec
	raw = make([][]rune, len(terms))
	ells = make([]int, len(terms))
	for i, t := range terms {
		labels, hasEll, err := einsumTerm(spec, t)
		if err != nil {
			panic(Errorf(op, "%v", err))
		}
		n := len(labels)
		r := operands[i].Rank()
		if hasEll {
			n--
			if n > r {
				panic(Errorf(op, "spec %q: term %q of operand %d has %d indices, more than the rank of %v", spec, t, i, n, operands[i].typ))
			}
			ells[i] = r - n
		} else if n != r {
			panic(Errorf(op, "spec %q: term %q of operand %d has %d indices but %v has rank %d", spec, t, i, n, operands[i].typ, r))
		}
		e.maxEll = max(e.maxEll, ells[i])
		raw[i] = labels
	}
	return raw, ells
}

// labelOperands expands the ellipses and sizes every label, checking that
// the operands agree (ellipsis axes broadcast).
func (e *einsumState) labelOperands(operands []*Array, raw [][]rune, ells []int) {
	e.ops = make([]einsumOperand, len(operands))
	for i, x := range operands {
		labels := expandEll(raw[i], ells[i], e.maxEll)
		for ax, l := range labels {
			d := x.typ.Shape[ax]
			e.counts[l]++
			prev, seen := e.sizes[l]
			switch {
			case !seen || prev == d:
				e.sizes[l] = d
			case l >= ellipsisBase && (prev == 1 || d == 1):
				e.sizes[l] = max(prev, d)
			default:
				panic(Errorf("Einsum", "spec %q: %s has size %d in operand %d (%v) but size %d elsewhere", e.spec, labelName(l), d, i, x.typ, prev))
			}
		}
		e.ops[i] = einsumOperand{x: x, labels: labels}
	}
}

// explicitOutput sets the output labels from the term after "->".
func (e *einsumState) explicitOutput(outTerm string) {
	const op = "Einsum"
	spec := e.spec
	labels, _, err := einsumTerm(spec, outTerm)
	if err != nil {
		panic(Errorf(op, "%v", err))
	}
	e.out = expandEll(labels, e.maxEll, e.maxEll)
	seen := map[rune]bool{}
	for _, l := range e.out {
		if seen[l] {
			panic(Errorf(op, "spec %q: %s repeated in the output", spec, labelName(l)))
		}
		seen[l] = true
		if _, ok := e.sizes[l]; !ok {
			panic(Errorf(op, "spec %q: output %s appears in no operand", spec, labelName(l)))
		}
	}
}

// implicitOutput sets the output labels of a spec without "->": the
// ellipsis axes, then the indices that appear once, in alphabetical order.
func (e *einsumState) implicitOutput() {
	for j := 0; j < e.maxEll; j++ {
		e.out = append(e.out, rune(ellipsisBase+j))
	}
	var once []rune
	for l, c := range e.counts {
		if c == 1 && l < ellipsisBase {
			once = append(once, l)
		}
	}
	slices.Sort(once)
	e.out = append(e.out, once...)
}

// promote promotes the operands' dtypes as in Add.
func (e *einsumState) promote() {
	xs := make([]*Array, len(e.ops))
	for i := range e.ops {
		xs[i] = e.ops[i].x
	}
	xs = promoteNumeric("Einsum", xs...)
	for i := range e.ops {
		e.ops[i].x = xs[i]
	}
}

// keepOutput returns the set of output labels.
func (e *einsumState) keepOutput() map[rune]bool {
	keep := map[rune]bool{}
	for _, l := range e.out {
		keep[l] = true
	}
	return keep
}

// reduceOperands takes the diagonals of every operand and sums out the
// indices private to it.
func (e *einsumState) reduceOperands() {
	ops := e.ops
	for i := range ops {
		ops[i] = einsumDiagonals(ops[i])
		keep := e.keepOutput()
		for j := range ops {
			if j != i {
				for _, l := range ops[j].labels {
					keep[l] = true
				}
			}
		}
		ops[i] = einsumSumOut(ops[i], keep)
	}
}

// contract contracts the operands left to right and transposes the
// result into the output order.
func (e *einsumState) contract() *Array {
	ops, out := e.ops, e.out
	cur := ops[0]
	for i := 1; i < len(ops); i++ {
		keep := e.keepOutput()
		for _, o := range ops[i+1:] {
			for _, l := range o.labels {
				keep[l] = true
			}
		}
		cur = einsumPair(cur, ops[i], keep)
	}
	cur = einsumSumOut(cur, e.keepOutput())
	perm := make([]int, len(out))
	for i, l := range out {
		perm[i] = slices.Index(cur.labels, l)
	}
	if len(perm) != cur.x.Rank() || slices.Contains(perm, -1) {
		panic(Errorf("Einsum", "internal error: labels %q vs output %q", string(cur.labels), string(out)))
	}
	return Transpose(cur.x, perm...)
}

// einsumDiagonals takes the diagonal for every label repeated within o.
func einsumDiagonals(o einsumOperand) einsumOperand {
	for {
		p, q := -1, -1
		for i := 0; i < len(o.labels) && q < 0; i++ {
			for j := i + 1; j < len(o.labels); j++ {
				if o.labels[i] == o.labels[j] {
					p, q = i, j
					break
				}
			}
		}
		if q < 0 {
			return o
		}
		shape := o.x.typ.Shape
		ip := Apply1(ir.Iota, ir.Attrs{"dtype": ir.Int32, "shape": []int(shape.Clone()), "dim": p})
		iq := Apply1(ir.Iota, ir.Attrs{"dtype": ir.Int32, "shape": []int(shape.Clone()), "dim": q})
		mask := Apply1(ir.Eq, nil, ip, iq)
		masked := Apply1(ir.Select, nil, mask, o.x, Full(shape, 0, o.x.typ.DType))
		o = einsumOperand{
			x:      Apply1(ir.ReduceSum, ir.Attrs{"axes": []int{q}}, masked),
			labels: slices.Delete(slices.Clone(o.labels), q, q+1),
		}
	}
}

// einsumSumOut sums the axes of o whose labels are not in keep.
func einsumSumOut(o einsumOperand, keep map[rune]bool) einsumOperand {
	var axes []int
	var labels []rune
	for i, l := range o.labels {
		if keep[l] {
			labels = append(labels, l)
		} else {
			axes = append(axes, i)
		}
	}
	if len(axes) == 0 {
		return o
	}
	return einsumOperand{x: Apply1(ir.ReduceSum, ir.Attrs{"axes": axes}, o.x), labels: labels}
}

// einsumPair contracts two operands, keeping the labels in keep.
func einsumPair(a, b einsumOperand, keep map[rune]bool) einsumOperand {
	inB := map[rune]bool{}
	for _, l := range b.labels {
		inB[l] = true
	}
	inA := map[rune]bool{}
	for _, l := range a.labels {
		inA[l] = true
	}
	// Sum what neither the other operand nor later ones need.
	ka, kb := map[rune]bool{}, map[rune]bool{}
	for l := range keep {
		ka[l], kb[l] = true, true
	}
	for l := range inB {
		ka[l] = true
	}
	for l := range inA {
		kb[l] = true
	}
	a, b = einsumSumOut(a, ka), einsumSumOut(b, kb)
	// Broadcast size-1 ellipsis axes against the other operand.
	a.x = einsumMatch(a, b)
	b.x = einsumMatch(b, a)
	var lb, rb, lc, rc []int
	var batch, free []rune
	for i, l := range a.labels {
		j := slices.Index(b.labels, l)
		if j < 0 {
			continue
		}
		if keep[l] {
			lb, rb = append(lb, i), append(rb, j)
			batch = append(batch, l)
		} else {
			lc, rc = append(lc, i), append(rc, j)
		}
	}
	for _, l := range a.labels {
		if !inB[l] {
			free = append(free, l)
		}
	}
	for _, l := range b.labels {
		if !inA[l] {
			free = append(free, l)
		}
	}
	return einsumOperand{x: dotGeneral(a.x, b.x, lb, rb, lc, rc), labels: append(batch, free...)}
}

// einsumMatch broadcasts the size-1 axes of a whose label has a larger size in b.
func einsumMatch(a, b einsumOperand) *Array {
	shape := a.x.Shape()
	changed := false
	for i, l := range a.labels {
		if j := slices.Index(b.labels, l); j >= 0 && shape[i] == 1 && b.x.typ.Shape[j] != 1 {
			shape[i] = b.x.typ.Shape[j]
			changed = true
		}
	}
	if !changed {
		return a.x
	}
	dims := make([]int, len(shape))
	for i := range dims {
		dims[i] = i
	}
	return Apply1(ir.BroadcastInDim, ir.Attrs{"shape": []int(shape), "dims": dims}, a.x)
}
