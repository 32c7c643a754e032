package ir

// Clone returns a deep copy of f: new values with the same IDs, types, indices
// and locations, new ops with copied attributes (int lists and literals are
// copied too), and new regions, so that changing the copy never changes f. The
// copy draws new IDs from where f does (NextID is the same). Values that are
// used but not defined in f (a malformed function) are copied on first use so
// that the copy stays self-contained; Verify reports them in either function.
func Clone(f *Func) *Func {
	if f == nil {
		return nil
	}
	g := &Func{Name: f.Name, nextID: f.nextID}
	c := cloner{g: g, vals: map[*Value]*Value{}, ops: map[*Op]*Op{}, regions: map[*Region]*Region{}}
	if f.Body != nil {
		g.Body = c.region(f.Body)
	}
	return g
}

type cloner struct {
	g       *Func
	vals    map[*Value]*Value
	ops     map[*Op]*Op
	regions map[*Region]*Region
}

// value returns the copy of v, making one (without a defining op) the first
// time an undefined value is seen.
func (c *cloner) value(v *Value) *Value {
	if v == nil {
		return nil
	}
	if nv, ok := c.vals[v]; ok {
		return nv
	}
	nv := &Value{ID: v.ID, Type: v.Type.Clone(), Index: v.Index}
	c.vals[v] = nv
	return nv
}

func (c *cloner) values(vs []*Value) []*Value {
	if vs == nil {
		return nil
	}
	out := make([]*Value, len(vs))
	for i, v := range vs {
		out[i] = c.value(v)
	}
	return out
}

func (c *cloner) region(r *Region) *Region {
	if r == nil {
		return nil
	}
	if nr, ok := c.regions[r]; ok {
		return nr // a region used twice stays shared, as in f
	}
	nr := &Region{fn: c.g}
	c.regions[r] = nr
	nr.Params = c.values(r.Params)
	for _, op := range r.Ops {
		nr.Ops = append(nr.Ops, c.op(op))
	}
	nr.Results = c.values(r.Results)
	return nr
}

func (c *cloner) op(op *Op) *Op {
	if op == nil {
		return nil
	}
	if no, ok := c.ops[op]; ok {
		return no
	}
	no := &Op{Code: op.Code, Loc: op.Loc}
	c.ops[op] = no
	no.Args = c.values(op.Args)
	no.Attrs = CloneAttrs(op.Attrs)
	if op.Regions != nil {
		no.Regions = make([]*Region, len(op.Regions))
		for i, r := range op.Regions {
			no.Regions[i] = c.region(r)
		}
	}
	if op.Results != nil {
		no.Results = make([]*Value, len(op.Results))
		for i, v := range op.Results {
			nv := c.value(v)
			if nv != nil && v.Op == op {
				nv.Op = no
			}
			no.Results[i] = nv
		}
	}
	return no
}

// CloneAttrs returns a copy of a whose int lists and literals are copied, so
// that changing them in the copy never changes a. Other values are immutable
// and shared. A nil map stays nil.
func CloneAttrs(a Attrs) Attrs {
	if a == nil {
		return nil
	}
	out := make(Attrs, len(a))
	for k, v := range a {
		switch x := v.(type) {
		case []int:
			if x != nil {
				v = append([]int{}, x...)
			}
		case *Literal:
			switch {
			case x == nil:
			case int64(len(x.Data)) == x.Type.Bytes():
				v = x.Clone() // aligned storage
			default:
				v = &Literal{Type: x.Type.WithShape(x.Type.Shape), Data: append([]byte{}, x.Data...)}
			}
		}
		out[k] = v
	}
	return out
}
