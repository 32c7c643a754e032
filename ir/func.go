package ir

import (
	"fmt"
	"sort"
)

// Value is an SSA value: the result of an op or a parameter of a region. Every
// value has exactly one definition and a Type (dtype, shape, memory space,
// sharding).
type Value struct {
	// ID is unique within the Func; the printer shows it as %ID.
	ID int
	// Type is the abstract value.
	Type Type
	// Op is the defining op, or nil for a region parameter.
	Op *Op
	// Index is the result index in Op, or the parameter index in its region.
	Index int
}

// String returns %ID.
func (v *Value) String() string { return fmt.Sprintf("%%%d", v.ID) }

// Op is one operation: an opcode, operands, attributes, nested regions and results.
type Op struct {
	Code    Code
	Args    []*Value
	Results []*Value
	Attrs   Attrs
	Regions []*Region
	// Loc is the Go source position (file:line) of the user call that made the
	// op, when known.
	Loc string
}

// Result returns the first (usually only) result.
func (o *Op) Result() *Value { return o.Results[0] }

// Info returns the op's metadata.
func (o *Op) Info() *OpInfo { return o.Code.Info() }

// Describe names an op in messages: its code and, when known, the user's
// source location, as in "add (quick.go:12)".
func (o *Op) Describe() string {
	if o.Loc != "" {
		return fmt.Sprintf("%v (%s)", o.Code, o.Loc)
	}
	return o.Code.String()
}

// Region is a list of ops with parameters and results: a function body, or the
// body of a scan, while or cond. Regions are isolated from above: every value a
// region uses is one of its parameters or defined inside it.
type Region struct {
	Params  []*Value
	Ops     []*Op
	Results []*Value
	fn      *Func
}

// Func is a function: a name and a body region. It owns the ID counter of all
// values in it, nested regions included.
type Func struct {
	Name   string
	Body   *Region
	nextID int
}

// NewFunc returns an empty function with an empty body.
func NewFunc(name string) *Func {
	f := &Func{Name: name}
	f.Body = f.NewRegion()
	return f
}

// NewRegion returns an empty region whose values draw IDs from f.
func (f *Func) NewRegion() *Region { return &Region{fn: f} }

// Func returns the function the region belongs to.
func (r *Region) Func() *Func { return r.fn }

func (f *Func) newValue(t Type, def *Op, idx int) *Value {
	v := &Value{ID: f.nextID, Type: t.Clone(), Op: def, Index: idx}
	f.nextID++
	return v
}

// NextID is the ID the next new value will get.
func (f *Func) NextID() int { return f.nextID }

// ReserveIDs makes sure new values get IDs ≥ n (used by the parser).
func (f *Func) ReserveIDs(n int) {
	if n > f.nextID {
		f.nextID = n
	}
}

// NewValueWithID makes a value with a given ID (used by the parser; the caller
// keeps IDs unique).
func (f *Func) NewValueWithID(id int, t Type, def *Op, idx int) *Value {
	v := &Value{ID: id, Type: t.Clone(), Op: def, Index: idx}
	if id >= f.nextID {
		f.nextID = id + 1
	}
	return v
}

// AddParam appends a parameter of type t.
func (r *Region) AddParam(t Type) *Value {
	v := r.fn.newValue(t, nil, len(r.Params))
	r.Params = append(r.Params, v)
	return v
}

// NewOp builds an op with fresh result values whose types come from the op's
// shape rule. It does not append it to any region.
func (f *Func) NewOp(code Code, args []*Value, attrs Attrs, regions ...*Region) (*Op, error) {
	ts := make([]Type, len(args))
	for i, a := range args {
		if a == nil {
			return nil, fmt.Errorf("%v: operand %d is nil", code, i)
		}
		ts[i] = a.Type
	}
	if attrs == nil {
		attrs = Attrs{}
	}
	out, err := InferTypes(code, ts, attrs, regions)
	if err != nil {
		return nil, err
	}
	op := &Op{Code: code, Args: append([]*Value(nil), args...), Attrs: attrs, Regions: regions}
	for i, t := range out {
		op.Results = append(op.Results, f.newValue(t, op, i))
	}
	return op, nil
}

// AddOp builds an op (see Func.NewOp) and appends it to r.
func (r *Region) AddOp(code Code, args []*Value, attrs Attrs, regions ...*Region) (*Op, error) {
	op, err := r.fn.NewOp(code, args, attrs, regions...)
	if err != nil {
		return nil, err
	}
	r.Ops = append(r.Ops, op)
	return op, nil
}

// ParamTypes returns the types of the region's parameters.
func (r *Region) ParamTypes() []Type {
	ts := make([]Type, len(r.Params))
	for i, p := range r.Params {
		ts[i] = p.Type
	}
	return ts
}

// ResultTypes returns the types of the region's results.
func (r *Region) ResultTypes() []Type {
	ts := make([]Type, len(r.Results))
	for i, p := range r.Results {
		ts[i] = p.Type
	}
	return ts
}

// Walk calls fn for every op of r in order, entering nested regions before the
// op that holds them.
func (r *Region) Walk(fn func(op *Op)) {
	for _, op := range r.Ops {
		for _, sub := range op.Regions {
			sub.Walk(fn)
		}
		fn(op)
	}
}

// Attrs holds an op's attributes by name. Values are int, []int, float64, bool,
// string, DType, MemorySpace or *Literal.
type Attrs map[string]any

// Keys returns the attribute names in sorted order.
func (a Attrs) Keys() []string {
	ks := make([]string, 0, len(a))
	for k := range a {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Int returns an int attribute (0 if absent).
func (a Attrs) Int(name string) int { v, _ := a[name].(int); return v }

// Ints returns an []int attribute (nil if absent).
func (a Attrs) Ints(name string) []int { v, _ := a[name].([]int); return v }

// Float returns a float64 attribute.
func (a Attrs) Float(name string) float64 { v, _ := a[name].(float64); return v }

// Bool returns a bool attribute (false if absent).
func (a Attrs) Bool(name string) bool { v, _ := a[name].(bool); return v }

// String returns a string attribute.
func (a Attrs) String(name string) string { v, _ := a[name].(string); return v }

// DType returns a DType attribute.
func (a Attrs) DType(name string) DType { v, _ := a[name].(DType); return v }

// Space returns a MemorySpace attribute.
func (a Attrs) Space(name string) MemorySpace { v, _ := a[name].(MemorySpace); return v }

// Literal returns a *Literal attribute.
func (a Attrs) Literal(name string) *Literal { v, _ := a[name].(*Literal); return v }
