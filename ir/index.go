package ir

// IndexRule is the index rule of an element-moving op that no strided view
// expresses, because a position depends on an operand's values
// (dynamic_slice, dynamic_update_slice, gather) or the result is pieced
// together from several sources (concatenate, pad, dynamic_update_slice):
// the one statement of where each result element comes from, which
// renderers of the executable plan read (IndexRuleOf makes it).
//
// Element i of the result has coordinates c in Shape. The pieces are tried
// in order: element i is read from the first piece whose guard holds at c
// (the last piece has none), at the flat index Σ_d (t_d / Step_d)·Stride_d
// of the piece's operand, t_d being dimension d's position (IndexDim).
type IndexRule struct {
	// Shape is the iteration space: the result's shape or, for gather, a
	// shape of as many elements ([outer, indices, inner]).
	Shape Shape
	// Pieces are the sources, in order.
	Pieces []IndexPiece
}

// IndexPiece is one source of an IndexRule: an operand and, per dimension
// of the rule's Shape, how the coordinate gives its position.
type IndexPiece struct {
	Operand int
	Dims    []IndexDim
}

// IndexDim says how coordinate c of one dimension gives the position t =
// (c if Coord) − Lo ± Start's value clamped to [0, Start.Max], guarded (when
// Size ≥ 0) by t ≥ 0, t mod Step = 0 and t / Step < Size; the piece's
// operand index gains (t / Step)·Stride.
type IndexDim struct {
	Coord  bool
	Lo     int
	Start  *IndexStart
	Step   int
	Size   int
	Stride int
}

// IndexStart is a position read from an integer operand: element 0 of
// Operand (a scalar start), or, when AtCoord, its element at the
// dimension's coordinate (gather's indices), clamped to [0, Max] and
// subtracted from the position when Neg.
type IndexStart struct {
	Operand int
	AtCoord bool
	Max     int
	Neg     bool
}

// IndexRuleOf returns the index rule of result 0 of op: dynamic_slice,
// dynamic_update_slice, concatenate, pad and gather (pieces whose operand
// is empty are left out). ok is false for every other op, and for a gather
// from an empty axis, which has no element to read.
func IndexRuleOf(op *Op) (r *IndexRule, ok bool) {
	out := op.Results[0].Type.Shape
	switch op.Code {
	case DynamicSlice:
		p := coordPiece(0, op.Args[0].Type.Shape, out)
		for d := range p.Dims {
			p.Dims[d].Start = &IndexStart{Operand: 1 + d, Max: op.Args[0].Type.Shape[d] - out[d]}
		}
		return &IndexRule{Shape: out, Pieces: []IndexPiece{p}}, true
	case DynamicUpdateSlice:
		x, u := op.Args[0].Type.Shape, op.Args[1].Type.Shape
		up := coordPiece(1, u, out)
		for d := range up.Dims {
			up.Dims[d].Start = &IndexStart{Operand: 2 + d, Max: x[d] - u[d], Neg: true}
			up.Dims[d].Size = u[d]
		}
		return &IndexRule{Shape: out, Pieces: []IndexPiece{up, coordPiece(0, x, out)}}, true
	case Concatenate:
		return concatRule(op, out), true
	case Pad:
		x := op.Args[0].Type.Shape
		r := &IndexRule{Shape: out}
		if x.Size() > 0 {
			xp := coordPiece(0, x, out)
			low, interior := op.Attrs.Ints("low"), op.Attrs.Ints("interior")
			for d := range xp.Dims {
				xp.Dims[d].Lo, xp.Dims[d].Step, xp.Dims[d].Size = low[d], interior[d]+1, x[d]
			}
			r.Pieces = append(r.Pieces, xp)
		}
		r.Pieces = append(r.Pieces, IndexPiece{Operand: 1, Dims: make([]IndexDim, len(out))})
		for d := range out {
			r.Pieces[len(r.Pieces)-1].Dims[d] = IndexDim{Coord: true, Step: 1, Size: -1}
		}
		return r, true
	case Gather:
		return gatherRule(op)
	}
	return nil, false
}

// coordPiece reads operand k of shape in at the result coordinates (of
// shape out, of the same rank), unguarded.
func coordPiece(k int, in, out Shape) IndexPiece {
	st := in.Strides()
	p := IndexPiece{Operand: k, Dims: make([]IndexDim, len(out))}
	for d := range out {
		p.Dims[d] = IndexDim{Coord: true, Step: 1, Size: -1, Stride: st[d]}
	}
	return p
}

func concatRule(op *Op, out Shape) *IndexRule {
	axis := op.Attrs.Int("axis")
	r := &IndexRule{Shape: out}
	off := 0
	for k, a := range op.Args {
		n := a.Type.Shape[axis]
		if n > 0 {
			p := coordPiece(k, a.Type.Shape, out)
			p.Dims[axis].Lo, p.Dims[axis].Size = off, n
			r.Pieces = append(r.Pieces, p)
		}
		off += n
	}
	if len(r.Pieces) > 0 {
		r.Pieces[len(r.Pieces)-1].Dims[axis].Size = -1
	}
	return r
}

func gatherRule(op *Op) (*IndexRule, bool) {
	x := op.Args[0].Type.Shape
	axis := op.Attrs.Int("axis")
	n := x[axis]
	if n == 0 {
		return nil, false
	}
	outer, inner := Shape(x[:axis]).Size(), Shape(x[axis+1:]).Size()
	dims := []IndexDim{
		{Coord: true, Step: 1, Size: -1, Stride: n * inner},
		{Start: &IndexStart{Operand: 1, AtCoord: true, Max: n - 1}, Step: 1, Size: -1, Stride: inner},
		{Coord: true, Step: 1, Size: -1, Stride: 1},
	}
	return &IndexRule{Shape: Shape{outer, op.Args[1].Type.Size(), inner}, Pieces: []IndexPiece{{Operand: 0, Dims: dims}}}, true
}

// Source returns the piece and the operand flat index element i comes
// from; value(k, j) is element j of operand k as an integer (the starts).
func (r *IndexRule) Source(i int, value func(k, j int) int64) (piece, index int) {
	st := r.Shape.Strides()
	for pi, p := range r.Pieces {
		index = 0
		in := true
		for d, dim := range p.Dims {
			c := 0
			if r.Shape[d] > 0 {
				c = i / st[d] % r.Shape[d]
			}
			t := dim.Pos(c, value)
			if dim.Size >= 0 && (t < 0 || t%int64(dim.Step) != 0 || t/int64(dim.Step) >= int64(dim.Size)) {
				in = false
			}
			index += int(t/int64(dim.Step)) * dim.Stride
		}
		if in || pi == len(r.Pieces)-1 {
			return pi, index
		}
	}
	return -1, 0
}

// Pos is the position of coordinate c; value(k, j) is element j of operand
// k as an integer.
func (d IndexDim) Pos(c int, value func(k, j int) int64) int64 {
	t := -int64(d.Lo)
	if d.Coord {
		t += int64(c)
	}
	if s := d.Start; s != nil {
		j := 0
		if s.AtCoord {
			j = c
		}
		v := min(max(value(s.Operand, j), 0), int64(s.Max))
		if s.Neg {
			v = -v
		}
		t += v
	}
	return t
}
