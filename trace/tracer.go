package trace

import (
	"bytes"
	encbin "encoding/binary"
	"fmt"
	"hash/fnv"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ferryml/ferry/ir"
)

// Tracer records ops into one region of an ir.Func while a function is traced.
// A tracer is active between Push and Pop; arrays of an inactive tracer must not
// be used (that is a leaked tracer). Tracers nest: rt.Jit, Grad, Scan and Cond
// each make one, and ops go to the innermost tracer involved.
type Tracer struct {
	fn       *ir.Func
	region   *ir.Region
	level    int
	active   atomic.Bool
	closed   bool
	captures []*Array
	capIdx   map[*Array]*ir.Value
	consts   map[*Array]*ir.Value
	planner  *plannerState // see SetRematPlanner
}

// NewTracer returns a tracer recording into region (a region of fn).
func NewTracer(fn *ir.Func, region *ir.Region) *Tracer {
	return &Tracer{fn: fn, region: region, capIdx: map[*Array]*ir.Value{}, consts: map[*Array]*ir.Value{}}
}

// NewFuncTracer returns a tracer recording into the body of a new function.
func NewFuncTracer(name string) *Tracer {
	f := ir.NewFunc(name)
	return NewTracer(f, f.Body)
}

// Func returns the function being recorded.
func (t *Tracer) Func() *ir.Func { return t.fn }

// Region returns the region being recorded.
func (t *Tracer) Region() *ir.Region { return t.region }

// Param adds a parameter of type typ to the region and returns its tracer array.
func (t *Tracer) Param(typ ir.Type) *Array {
	v := t.region.AddParam(typ)
	return &Array{typ: v.Type, val: v, tr: t}
}

// ParamLike adds a parameter standing for the argument a: of a's type, and
// weakly typed when a is (a jitted function's rt.Scalar argument meets the
// other operand's dtype as it does eagerly, as weak_type avals in JAX).
func (t *Tracer) ParamLike(a *Array) *Array {
	p := t.Param(a.Type())
	p.weak = a.weak
	return p
}

// HostParam adds a parameter of type typ placed in pinned_host (typ's
// space is ignored) that the traced function may use as if it were on
// device: an op other than device_put, optimization_barrier and control
// flow (which read pinned_host arrays themselves) reads a device copy of it
// made where it is used. rt.Jit's memory budget places optimizer state so.
func (t *Tracer) HostParam(typ ir.Type) *Array {
	typ.Space = ir.PinnedHost
	p := t.Param(typ)
	p.moveIn = true
	return p
}

// Wrap returns the array of this tracer standing for v (a value of its region).
func (t *Tracer) Wrap(v *ir.Value) *Array { return &Array{typ: v.Type, val: v, tr: t} }

// Captures returns the arrays from outside this tracer (concrete arrays or tracers
// of enclosing traces) that the recorded ops used. Each was given a region
// parameter after the explicit ones, in this order.
func (t *Tracer) Captures() []*Array { return t.captures }

// Level returns the nesting depth of the tracer (1 for the outermost).
func (t *Tracer) Level() int { return t.level }

// Push makes t the innermost active tracer of the calling goroutine. Pop
// must be called on the same goroutine before it exits (defer it).
func (t *Tracer) Push() {
	if t.closed {
		panic(Errorf("trace", "tracer reused after Close"))
	}
	key, id := gkey(), goid()
	stacksMu.Lock()
	st := stacks[key]
	if st != nil && st.goid != id {
		// A goroutine that exited without popping left this stack behind,
		// and its g now runs another goroutine: drop the stale tracers.
		for _, old := range st.ts {
			old.active.Store(false)
		}
		activeTracers.Add(-int64(len(st.ts)))
		st = nil
	}
	if st == nil {
		st = &tracerStack{goid: id}
		stacks[key] = st
	}
	t.level = len(st.ts) + 1
	st.ts = append(st.ts, t)
	stacksMu.Unlock()
	t.active.Store(true)
	activeTracers.Add(1)
}

// Pop deactivates t; it must be the innermost active tracer of the goroutine.
func (t *Tracer) Pop() {
	key := gkey()
	stacksMu.Lock()
	st := stacks[key]
	if st == nil || len(st.ts) == 0 || st.ts[len(st.ts)-1] != t {
		stacksMu.Unlock()
		panic(Errorf("trace", "tracers popped out of order"))
	}
	if len(st.ts) == 1 {
		delete(stacks, key)
	} else {
		st.ts[len(st.ts)-1] = nil
		st.ts = st.ts[:len(st.ts)-1]
	}
	stacksMu.Unlock()
	t.active.Store(false)
	activeTracers.Add(-1)
}

// Close marks the tracer finished: its arrays may no longer be used.
func (t *Tracer) Close() { t.closed = true }

// Output returns the region value for a result array of the traced function,
// capturing it if it comes from outside.
func (t *Tracer) Output(a *Array) *ir.Value { return t.valueOf(a) }

// tracerStack is the stack of active tracers of one goroutine.
type tracerStack struct {
	goid int64 // the goroutine's id, to tell a reused g (see gkey)
	ts   []*Tracer
}

var (
	stacksMu      sync.Mutex
	stacks        = map[uintptr]*tracerStack{} // by gkey
	activeTracers atomic.Int64
)

// current returns the innermost active tracer of this goroutine, or nil.
func current() *Tracer { return active(false) }

// active returns the innermost (outermost: the first) active tracer of this
// goroutine, or nil.
func active(outermost bool) *Tracer {
	if activeTracers.Load() == 0 {
		return nil
	}
	key := gkey()
	stacksMu.Lock()
	defer stacksMu.Unlock()
	st := stacks[key]
	if st == nil || len(st.ts) == 0 {
		return nil
	}
	if outermost {
		return st.ts[0]
	}
	return st.ts[len(st.ts)-1]
}

// Current returns the innermost active tracer of the calling goroutine, or nil
// when no function is being traced (eager mode).
func Current() *Tracer { return current() }

// goid returns the calling goroutine's id, parsed from a stack trace.
func goid() int64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	b := bytes.TrimPrefix(buf[:n], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		id, err := strconv.ParseInt(string(b[:i]), 10, 64)
		if err == nil {
			return id
		}
	}
	return 0
}

// valueOf returns the region value for a in t, capturing outside arrays.
func (t *Tracer) valueOf(a *Array) *ir.Value {
	if a.tr == t {
		return a.val
	}
	if v, ok := t.capIdx[a]; ok {
		return v
	}
	if a.tr == nil && a.typ.Rank() == 0 && a.buf != nil {
		// Concrete scalars become constants in the IR.
		if v, ok := t.consts[a]; ok {
			return v
		}
		if l, err := a.buf.Literal(); err == nil {
			op, err := t.fn.NewOp(ir.Constant, nil, ir.Attrs{"value": l.Clone()})
			if err == nil {
				t.region.Ops = append(t.region.Ops, op)
				t.consts[a] = op.Result()
				return op.Result()
			}
		}
	}
	v := t.region.AddParam(a.typ)
	t.capIdx[a] = v
	t.captures = append(t.captures, a)
	return v
}

func checkLive(op string, a *Array) {
	if a == nil {
		panic(Errorf(op, "nil array operand"))
	}
	if a.tr != nil && (a.tr.closed || !a.tr.active.Load()) {
		panic(Errorf(op, "leaked tracer %v: an array traced inside a jitted, differentiated or scanned function was used after that function returned (was it stored in a variable outside the function?)", a.typ))
	}
}

// Apply runs op code on args: eagerly when no arg is traced and no trace is
// active, else recorded into the innermost tracer involved. Attributes and
// regions are as the op table (ir.OpInfo) says. It panics with *Error on bad
// operands. Library code builds every op through Apply.
func Apply(code ir.Code, attrs ir.Attrs, regions []*ir.Region, args ...*Array) []*Array {
	return apply(code, attrs, regions, args, nil)
}

// apply is Apply appending the results to res (eager results only: a
// caller wanting one result passes room for it, which saves allocating the
// result slice).
func apply(code ir.Code, attrs ir.Attrs, regions []*ir.Region, args []*Array, res []*Array) []*Array {
	name := code.String()
	target := current()
	for _, a := range args {
		checkLive(name, a)
		if a.tr != nil && (target == nil || a.tr.level > target.level) {
			target = a.tr
		}
	}
	for _, a := range args {
		if a != nil && a.moveIn {
			return apply(code, attrs, regions, moveInHostParams(code, args), res)
		}
	}
	checkHostOperands(code, attrs, args)
	checkCollective(code, attrs)
	if target == nil {
		return applyEager(code, attrs, regions, args, res)
	}
	if attrs == nil {
		attrs = ir.Attrs{}
	}
	vals := make([]*ir.Value, len(args))
	for i, a := range args {
		vals[i] = target.valueOf(a)
	}
	op, err := target.fn.NewOp(code, vals, attrs, regions...)
	if err != nil {
		panic(Errorf(name, "%v", err))
	}
	for _, r := range op.Results {
		checkShape(name, r.Type.Shape, r.Type.DType)
	}
	file, line := CallerLocation()
	op.Loc = file + ":" + strconv.Itoa(line)
	target.region.Ops = append(target.region.Ops, op)
	out := make([]*Array, len(op.Results))
	for i, r := range op.Results {
		out[i] = &Array{typ: r.Type, val: r, tr: target}
	}
	return out
}

// Apply1 is Apply for ops with one result.
func Apply1(code ir.Code, attrs ir.Attrs, args ...*Array) *Array {
	var res [1]*Array
	return apply(code, attrs, nil, args, res[:0])[0]
}

// Executor runs functions on concrete buffers for eager mode. The runtime package
// registers the default one when it is imported.
type Executor interface {
	// FromLiteral copies a host literal into a new buffer in the literal's space.
	FromLiteral(l *ir.Literal) (Buffer, error)
	// Execute runs the function build() returns on args. Calls with the same
	// non-empty key have identical functions, so the executor may cache the
	// compiled form by key; an empty key means do not cache.
	Execute(key string, build func() *ir.Func, args []Buffer) ([]Buffer, error)
}

var executor atomic.Pointer[Executor]

// SetExecutor registers the eager executor.
func SetExecutor(e Executor) { executor.Store(&e) }

func exec(op string) Executor {
	e := executor.Load()
	if e == nil {
		panic(Errorf(op, "no executor registered: import github.com/ferryml/ferry/runtime to run arrays"))
	}
	return *e
}

// FromLiteral makes a concrete array holding a copy of l. It panics with *Error
// if that fails; NewFromLiteral returns the error instead.
func FromLiteral(l *ir.Literal) *Array {
	a, err := NewFromLiteral(l)
	if err != nil {
		panic(WrapError("FromLiteral", err))
	}
	return a
}

// NewFromLiteral makes a concrete array holding a copy of l, or returns an error
// (for example when no executor is registered).
func NewFromLiteral(l *ir.Literal) (*Array, error) {
	e := executor.Load()
	if e == nil {
		return nil, fmt.Errorf("no executor registered: import github.com/ferryml/ferry/runtime to run arrays")
	}
	if err := ir.CheckShape(l.Type.Shape, l.Type.DType); err != nil {
		return nil, err
	}
	b, err := (*e).FromLiteral(l)
	if err != nil {
		return nil, err
	}
	return FromBuffer(b), nil
}

// HasExecutor reports whether an eager executor is registered.
func HasExecutor() bool { return executor.Load() != nil }

func applyEager(code ir.Code, attrs ir.Attrs, regions []*ir.Region, args []*Array, res []*Array) []*Array {
	name := code.String()
	for i, a := range args {
		if a.buf == nil {
			panic(Errorf(name, "operand %d (%v) has no values: it is abstract (trace.Abstract) or its buffer is gone", i, a.typ))
		}
	}
	ex := exec(name)
	if oe, ok := ex.(OpExecutor); ok {
		return applyEagerOp(oe, code, attrs, regions, args, res)
	}
	bufs := make([]Buffer, len(args))
	types := make([]ir.Type, len(args))
	for i, a := range args {
		bufs[i] = a.buf
		types[i] = a.typ
	}
	if ts, err := ir.InferTypes(code, types, attrs, regions); err != nil {
		panic(Errorf(name, "%v", err))
	} else {
		for _, t := range ts {
			checkShape(name, t.Shape, t.DType)
		}
	}
	key := ""
	if len(regions) == 0 {
		key = string(appendOpKey(nil, code, attrs, types))
	}
	op := &EagerOp{Code: code, Attrs: attrs, Regions: regions, Types: types}
	outs, err := ex.Execute(key, op.Build, bufs)
	if err != nil {
		panic(WrapError(name, err))
	}
	for _, b := range outs {
		res = append(res, FromBuffer(b))
	}
	return res
}

// applyEagerOp runs an eager op through an OpExecutor, in pooled memory.
func applyEagerOp(ex OpExecutor, code ir.Code, attrs ir.Attrs, regions []*ir.Region, args []*Array, res []*Array) []*Array {
	op := eagerOps.Get().(*EagerOp)
	defer op.reset()
	op.Code, op.Attrs, op.Regions = code, attrs, regions
	for _, a := range args {
		op.bufs = append(op.bufs, a.buf)
		op.Types = append(op.Types, a.typ)
	}
	if len(regions) == 0 {
		op.Key = appendOpKey(op.Key[:0], code, attrs, op.Types)
	}
	outs, err := ex.ExecuteOp(op, op.bufs, op.outs[:0])
	if err != nil {
		panic(WrapError(code.String(), err))
	}
	for _, b := range outs {
		res = append(res, FromBuffer(b))
	}
	op.outs = outs
	return res
}

// EagerOp is one op applied to concrete arrays, as an OpExecutor receives
// it. It is valid only during ExecuteOp.
type EagerOp struct {
	Code    ir.Code
	Attrs   ir.Attrs // may be nil
	Regions []*ir.Region
	Types   []ir.Type // the operands' types
	// Key identifies the op's function (the code, attributes and operand
	// types) for a compile cache; it is empty, and the op must not be
	// cached, when the op has regions.
	Key []byte

	bufs, outs []Buffer
}

var eagerOps = sync.Pool{New: func() any { return new(EagerOp) }}

// reset clears op, so that it keeps no array alive, and pools it.
func (op *EagerOp) reset() {
	clear(op.bufs)
	clear(op.outs)
	clear(op.Types)
	op.Attrs, op.Regions = nil, nil
	op.bufs, op.outs, op.Types, op.Key = op.bufs[:0], op.outs[:0], op.Types[:0], op.Key[:0]
	eagerOps.Put(op)
}

// Build returns the op as a function of its operands. It panics with
// *Error when the operands do not fit the op.
func (op *EagerOp) Build() *ir.Func {
	name := op.Code.String()
	attrs := op.Attrs
	if attrs == nil {
		attrs = ir.Attrs{}
	}
	if ts, err := ir.InferTypes(op.Code, op.Types, attrs, op.Regions); err != nil {
		panic(Errorf(name, "%v", err))
	} else {
		for _, t := range ts {
			checkShape(name, t.Shape, t.DType)
		}
	}
	f := ir.NewFunc(name)
	// Regions of eager region ops were recorded in functions of their own:
	// keep the wrapper's value IDs clear of theirs.
	f.ReserveIDs(maxValueID(op.Regions) + 1)
	vals := make([]*ir.Value, len(op.Types))
	for i, t := range op.Types {
		vals[i] = f.Body.AddParam(t)
	}
	o, err := f.Body.AddOp(op.Code, vals, attrs, op.Regions...)
	if err != nil {
		panic(Errorf(name, "%v", err))
	}
	f.Body.Results = o.Results
	return f
}

// OpExecutor is an Executor that also runs EagerOps: without a closure and
// a key string per op, and with the results appended to results (whose
// memory it may reuse). The runtime's executor is one. Implementations
// check the op (Build does) before running it for the first time.
type OpExecutor interface {
	Executor
	ExecuteOp(op *EagerOp, args []Buffer, results []Buffer) ([]Buffer, error)
}

// appendOpKey appends the eager cache key of an op to b: the code and the
// operand types in binary (the code, the number of operands and, per
// operand, its dtype, memory space, rank and dimensions, so that the
// attributes' text that follows starts at a position the prefix fixes),
// then the attributes. Binary, because formatting the types as text cost a
// few percent of an eager op.
func appendOpKey(b []byte, code ir.Code, attrs ir.Attrs, types []ir.Type) []byte {
	b = encbin.LittleEndian.AppendUint16(b, uint16(code))
	b = encbin.AppendUvarint(b, uint64(len(types)))
	for _, t := range types {
		b = append(b, byte(t.DType), byte(t.Space))
		b = encbin.AppendUvarint(b, uint64(len(t.Shape)))
		for _, d := range t.Shape {
			b = encbin.AppendVarint(b, int64(d))
		}
		// The sharding too (one byte when there is none): a program built for
		// sharded operands must never serve unsharded ones, or the reverse.
		if t.Sharding == nil {
			b = append(b, 0)
		} else {
			b = fmt.Appendf(b, "\x01%v;", t.Sharding)
		}
	}
	for _, k := range attrs.Keys() {
		b = append(b, k...)
		b = append(b, '=')
		switch v := attrs[k].(type) {
		case *ir.Literal:
			h := fnv.New64a()
			h.Write(v.Data)
			b = fmt.Appendf(b, "lit<%v,%x,%d>", v.Type, h.Sum64(), len(v.Data))
		default:
			b = fmt.Appendf(b, "%v", v)
		}
		b = append(b, ';')
	}
	return b
}

// maxValueID returns the largest value ID in the regions (-1 if none).
func maxValueID(regions []*ir.Region) int {
	m := -1
	see := func(vs []*ir.Value) {
		for _, v := range vs {
			if v != nil && v.ID > m {
				m = v.ID
			}
		}
	}
	for _, r := range regions {
		see(r.Params)
		r.Walk(func(op *ir.Op) {
			see(op.Results)
			for _, sub := range op.Regions {
				see(sub.Params)
			}
		})
	}
	return m
}
