package passes

import (
	"github.com/ferryml/ferry/ir"
)

// walkRegions calls fn for r and every region nested in it, inner regions
// first. Fusion regions are visited only when withFusion is set.
func walkRegions(r *ir.Region, withFusion bool, fn func(*ir.Region) error) error {
	for _, op := range r.Ops {
		if op.Code == ir.Fusion && !withFusion {
			continue
		}
		for _, sub := range op.Regions {
			if err := walkRegions(sub, withFusion, fn); err != nil {
				return err
			}
		}
	}
	return fn(r)
}

// rewriteOps is the driver of the local rewrite passes (canonicalize,
// constantFold): in every region of f, innermost first and fusion bodies
// included, it offers each op, its operands already substituted, to rewrite.
// When rewrite returns replacements (one per result of op) and the ops that
// define them, those ops take op's place and every later use of op's results,
// region results included, reads the replacements; a nil result keeps op.
func rewriteOps(f *ir.Func, rewrite func(f *ir.Func, op *ir.Op) ([]*ir.Value, []*ir.Op)) error {
	return walkRegions(f.Body, true, func(r *ir.Region) error {
		s := subst{}
		out := make([]*ir.Op, 0, len(r.Ops))
		for _, op := range r.Ops {
			s.apply(op)
			rep, extra := rewrite(f, op)
			if rep == nil {
				out = append(out, op)
				continue
			}
			out = append(out, extra...)
			for i, v := range op.Results {
				s[v] = rep[i]
			}
		}
		r.Ops = out
		s.applyResults(r)
		return nil
	})
}

// subst maps replaced values to their replacements.
type subst map[*ir.Value]*ir.Value

// get follows replacement chains.
func (s subst) get(v *ir.Value) *ir.Value {
	for {
		n, ok := s[v]
		if !ok || n == v {
			return v
		}
		v = n
	}
}

// apply rewrites the operands of op.
func (s subst) apply(op *ir.Op) {
	if len(s) == 0 {
		return
	}
	for i, a := range op.Args {
		op.Args[i] = s.get(a)
	}
}

// applyResults rewrites the results of r.
func (s subst) applyResults(r *ir.Region) {
	if len(s) == 0 {
		return
	}
	for i, v := range r.Results {
		r.Results[i] = s.get(v)
	}
}

// isRegionOp reports whether op holds nested regions.
func isRegionOp(op *ir.Op) bool { return len(op.Regions) > 0 }

// users maps every value of r to the ops of r that use it, in order (an op
// appears once per operand slot).
func users(r *ir.Region) map[*ir.Value][]*ir.Op {
	u := map[*ir.Value][]*ir.Op{}
	for _, op := range r.Ops {
		for _, a := range op.Args {
			u[a] = append(u[a], op)
		}
	}
	return u
}

// returned is the set of values r returns.
func returned(r *ir.Region) map[*ir.Value]bool {
	m := make(map[*ir.Value]bool, len(r.Results))
	for _, v := range r.Results {
		m[v] = true
	}
	return m
}

// splat returns the one element of v when v is a constant whose elements all
// have the same bits, possibly broadcast or reshaped, as a scalar literal.
func splat(v *ir.Value) (*ir.Literal, bool) {
	for v.Op != nil && (v.Op.Code == ir.BroadcastInDim || v.Op.Code == ir.Reshape) {
		v = v.Op.Args[0]
	}
	if v.Op == nil || v.Op.Code != ir.Constant {
		return nil, false
	}
	l := v.Op.Attrs.Literal("value")
	n := l.Type.Size()
	sz := l.Type.DType.Size()
	if n == 0 || len(l.Data) != n*sz {
		return nil, false
	}
	first := l.Data[:sz]
	for i := 1; i < n; i++ {
		e := l.Data[i*sz : (i+1)*sz]
		for j := range e {
			if e[j] != first[j] {
				return nil, false
			}
		}
	}
	s := ir.NewLiteral(ir.Type{DType: l.Type.DType, Shape: ir.Shape{}})
	copy(s.Data, first)
	return s, true
}

// isScalarConst reports whether op is a constant of exactly one element.
func isScalarConst(op *ir.Op) bool {
	return op.Code == ir.Constant && op.Result().Type.Size() == 1
}

// identityPerm reports whether p is 0, 1, …, len(p)-1.
func identityPerm(p []int) bool {
	for i, x := range p {
		if x != i {
			return false
		}
	}
	return true
}

// bytesOf is the byte size of v.
func bytesOf(v *ir.Value) int64 { return v.Type.Bytes() }

// stableTopo reorders ops so that every op comes after the producers of its
// operands (producers outside ops are ignored), keeping the order given by key
// (smaller first) among ready ops. ops must form a DAG.
func stableTopo(ops []*ir.Op, key func(*ir.Op) int) []*ir.Op {
	def := map[*ir.Value]*ir.Op{}
	for _, op := range ops {
		for _, v := range op.Results {
			def[v] = op
		}
	}
	indeg := make(map[*ir.Op]int, len(ops))
	succ := map[*ir.Op][]*ir.Op{}
	for _, op := range ops {
		seen := map[*ir.Op]bool{}
		for _, a := range op.Args {
			if p, ok := def[a]; ok && p != op && !seen[p] {
				seen[p] = true
				indeg[op]++
				succ[p] = append(succ[p], op)
			}
		}
	}
	h := &opHeap{key: key}
	for _, op := range ops {
		if indeg[op] == 0 {
			h.push(op)
		}
	}
	out := make([]*ir.Op, 0, len(ops))
	for h.len() > 0 {
		op := h.pop()
		out = append(out, op)
		for _, s := range succ[op] {
			indeg[s]--
			if indeg[s] == 0 {
				h.push(s)
			}
		}
	}
	if len(out) != len(ops) {
		// A cycle: keep the original order (the verifier will report it).
		return ops
	}
	return out
}

// opHeap is a min-heap of ops by key.
type opHeap struct {
	key func(*ir.Op) int
	ops []*ir.Op
}

func (h *opHeap) len() int { return len(h.ops) }

func (h *opHeap) less(i, j int) bool { return h.key(h.ops[i]) < h.key(h.ops[j]) }

func (h *opHeap) push(op *ir.Op) {
	h.ops = append(h.ops, op)
	i := len(h.ops) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.ops[i], h.ops[p] = h.ops[p], h.ops[i]
		i = p
	}
}

func (h *opHeap) pop() *ir.Op {
	top := h.ops[0]
	n := len(h.ops) - 1
	h.ops[0] = h.ops[n]
	h.ops = h.ops[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.less(l, m) {
			m = l
		}
		if r < n && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h.ops[i], h.ops[m] = h.ops[m], h.ops[i]
		i = m
	}
	return top
}
