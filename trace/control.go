package trace

import (
	"math"
	"strings"

	"github.com/ferryml/ferry/ir"
)

// Structured control flow: Scan, Cond, While and ForLoop, as in jax.lax. Each
// traces its body functions into regions and emits one region op, eagerly
// executed on concrete arrays or recorded into the enclosing trace. Arrays the
// bodies close over are passed to the op as extra operands (the region's
// consts), so closures work as in JAX. Scan, Cond and ForLoop are
// differentiable; While is not (its trip count is not known statically).

// ScanOption configures Scan and ScanTree.
type ScanOption func(*scanConfig)

type scanConfig struct {
	reverse   bool
	length    int
	hasLength bool
}

// ScanReverse makes the scan run from the last element of xs to the first
// (lax.scan's reverse=True). The ys are still stacked in xs order.
func ScanReverse() ScanOption { return func(c *scanConfig) { c.reverse = true } }

// ScanLength sets the number of iterations, needed when there are no xs
// (lax.scan's length). With xs it must equal their leading dimension.
func ScanLength(n int) ScanOption {
	return func(c *scanConfig) { c.length, c.hasLength = n, true }
}

// Scan loops body over the leading axis of xs, threading a carry, like
// jax.lax.scan:
//
//	carry := init
//	for i := range n { carry, y[i] = body(carry, xs[i]) }
//	return carry, stack(y)
//
// body receives the carry and one slice of each xs (the leading axis removed)
// and returns the new carry, which must have exactly the carry's types (dtype,
// shape and memory space), and the per-iteration outputs, which Scan stacks on
// a new leading axis of size n. body is traced once. Scan is differentiable with
// respect to init, xs and the arrays body closes over; see ScanTree for trees.
func Scan(body func(carry, x []*Array) (newCarry, y []*Array), init, xs []*Array, opts ...ScanOption) (carry, ys []*Array) {
	return adScan("Scan", body, init, xs, opts)
}

func adScan(name string, body func(carry, x []*Array) ([]*Array, []*Array), init, xs []*Array, opts []ScanOption) ([]*Array, []*Array) {
	if body == nil {
		panic(Errorf(name, "nil body"))
	}
	var cfg scanConfig
	for _, o := range opts {
		o(&cfg)
	}
	for i, a := range init {
		if a == nil {
			panic(Errorf(name, "init[%d] is nil", i))
		}
		checkLive(name, a)
	}
	n := -1
	for i, x := range xs {
		if x == nil {
			panic(Errorf(name, "xs[%d] is nil", i))
		}
		checkLive(name, x)
		if x.Rank() == 0 {
			panic(Errorf(name, "xs[%d] is a scalar %v: scanned arrays need a leading axis", i, x.Type()))
		}
		if n >= 0 && x.typ.Shape[0] != n {
			panic(Errorf(name, "xs[%d] has leading dimension %d, but xs[0] has %d", i, x.typ.Shape[0], n))
		}
		n = x.typ.Shape[0]
	}
	if cfg.hasLength {
		if cfg.length < 0 {
			panic(Errorf(name, "negative length %d", cfg.length))
		}
		if n >= 0 && n != cfg.length {
			panic(Errorf(name, "ScanLength(%d) differs from the leading dimension %d of xs", cfg.length, n))
		}
		n = cfg.length
	}
	if n < 0 {
		panic(Errorf(name, "no xs to scan over: give the number of iterations with ScanLength"))
	}
	if ps := currentPlanner(); ps != nil {
		body = ps.planScanBody(body, n)
	}
	dst := adDstFunc()
	S := NewTracer(dst, dst.NewRegion())
	defer S.Close()
	nexp := len(init) + len(xs)
	adWith(S, func() {
		cp := make([]*Array, len(init))
		for i, a := range init {
			cp[i] = S.Param(a.Type())
		}
		xp := make([]*Array, len(xs))
		for i, x := range xs {
			xp[i] = S.Param(x.Type().WithShape(x.typ.Shape[1:]))
		}
		nc, y := body(cp, xp)
		if len(nc) != len(init) {
			panic(Errorf(name, "body returned %d carry arrays, want %d (the carry's length must not change)", len(nc), len(init)))
		}
		var vals []*ir.Value
		for i, c := range nc {
			if c == nil {
				panic(Errorf(name, "body returned a nil carry[%d]", i))
			}
			checkLive(name, c)
			if !c.Type().Equal(init[i].Type()) {
				panic(Errorf(name, "body returned carry[%d] as %v, but the carry is %v (a carry must keep its dtype, shape and memory space)", i, c.Type(), init[i].Type()))
			}
			vals = append(vals, S.Output(c))
		}
		for i, a := range y {
			if a == nil {
				panic(Errorf(name, "body returned a nil y[%d]", i))
			}
			checkLive(name, a)
			vals = append(vals, S.Output(a))
		}
		S.region.Results = vals
	})
	caps := S.Captures()
	var slots []adSlot
	for _, p := range S.region.Params[nexp:] {
		slots = append(slots, adSlot{v: p})
	}
	for _, p := range S.region.Params[:nexp] {
		slots = append(slots, adSlot{v: p})
	}
	adArrange(S.region, slots)
	args := append(append(append([]*Array{}, caps...), init...), xs...)
	attrs := ir.Attrs{"num_consts": len(caps), "num_carry": len(init), "length": n, "reverse": cfg.reverse}
	outs := Apply(ir.Scan, attrs, []*ir.Region{S.region}, args...)
	return outs[:len(init)], outs[len(init):]
}

// ScanTree is Scan over trees, the form to use from user code: the carry C and
// the scanned X and stacked Y may be any trees of arrays (structs, slices, maps).
// body gets the carry and X with every leaf sliced at the current index, and
// returns the new carry (same structure and leaf types) and a Y whose leaves
// are stacked on a new leading axis:
//
//	type Layer struct{ W1, W2 *trace.Array }             // stacked: [L, ...]
//	x, _ := trace.ScanTree(func(x *trace.Array, l Layer) (*trace.Array, struct{}) {
//		return trace.MatMul(trace.MatMul(x, l.W1), l.W2), struct{}{}
//	}, x0, layers)
func ScanTree[C, X, Y any](body func(carry C, x X) (C, Y), init C, xs X, opts ...ScanOption) (C, Y) {
	if body == nil {
		panic(Errorf("ScanTree", "nil body"))
	}
	cl, cdef, err := Flatten(init)
	if err != nil {
		panic(Errorf("ScanTree", "flattening init: %v", err))
	}
	xl, xdef, err := Flatten(xs)
	if err != nil {
		panic(Errorf("ScanTree", "flattening xs: %v", err))
	}
	var ydef *TreeDef
	flat := func(c, x []*Array) ([]*Array, []*Array) {
		cv, err := UnflattenAs[C](cdef, c)
		if err != nil {
			panic(Errorf("ScanTree", "%v", err))
		}
		xv, err := UnflattenAs[X](xdef, x)
		if err != nil {
			panic(Errorf("ScanTree", "%v", err))
		}
		nc, y := body(cv, xv)
		ncl, ncdef, err := Flatten(nc)
		if err != nil {
			panic(Errorf("ScanTree", "flattening the new carry: %v", err))
		}
		if !ncdef.Equal(cdef) {
			panic(Errorf("ScanTree", "body changed the carry's structure: %s", ncdef.Diff(cdef)))
		}
		yl, yd, err := Flatten(y)
		if err != nil {
			panic(Errorf("ScanTree", "flattening y: %v", err))
		}
		ydef = yd
		return ncl, yl
	}
	c, ys := adScan("ScanTree", flat, cl, xl, opts)
	cv, err := UnflattenAs[C](cdef, c)
	if err != nil {
		panic(Errorf("ScanTree", "%v", err))
	}
	yv, err := UnflattenAs[Y](ydef, ys)
	if err != nil {
		panic(Errorf("ScanTree", "%v", err))
	}
	return cv, yv
}

// Cond returns trueFn(operands) if pred is true, else falseFn(operands), like
// jax.lax.cond. pred is a scalar: bool, or a number compared with zero. Both
// branches are traced (once each) and must return the same number of arrays
// with the same types; only one runs. Arrays the branches close over become
// extra operands. Cond is differentiable with respect to the operands and the
// arrays the branches close over.
func Cond(pred *Array, trueFn, falseFn func(operands []*Array) []*Array, operands ...*Array) []*Array {
	if trueFn == nil || falseFn == nil {
		panic(Errorf("Cond", "nil branch"))
	}
	checkLive("Cond", pred)
	if pred.Rank() != 0 {
		panic(Errorf("Cond", "the predicate must be a scalar, got %v", pred.Type()))
	}
	if pred.DType() != ir.Bool {
		pred = adBin(ir.Ne, pred, adScalar(0, pred.DType()))
	}
	for i, a := range operands {
		if a == nil {
			panic(Errorf("Cond", "operand %d is nil", i))
		}
		checkLive("Cond", a)
	}
	m := len(operands)
	dst := adDstFunc()
	names := []string{"true", "false"}
	ts := make([]*Tracer, 2)
	for b, fn := range []func([]*Array) []*Array{trueFn, falseFn} {
		t := NewTracer(dst, dst.NewRegion())
		ts[b] = t
		defer t.Close()
		adWith(t, func() {
			ps := make([]*Array, m)
			for i, a := range operands {
				ps[i] = t.Param(a.Type())
			}
			rs := fn(ps)
			var vals []*ir.Value
			for i, r := range rs {
				if r == nil {
					panic(Errorf("Cond", "the %s branch returned a nil result %d", names[b], i))
				}
				checkLive("Cond", r)
				vals = append(vals, t.Output(r))
			}
			t.region.Results = vals
		})
	}
	r0, r1 := ts[0].region.ResultTypes(), ts[1].region.ResultTypes()
	same := len(r0) == len(r1)
	for i := 0; same && i < len(r0); i++ {
		same = r0[i].Equal(r1[i])
	}
	if !same {
		panic(Errorf("Cond", "the branches return different types: true branch %s, false branch %s", adTypeList(r0), adTypeList(r1)))
	}
	u, slots := adUnify(ts, m)
	regions := make([]*ir.Region, 2)
	for b, t := range ts {
		var s []adSlot
		for _, p := range t.region.Params[:m] {
			s = append(s, adSlot{v: p})
		}
		adArrange(t.region, append(s, slots[b]...))
		regions[b] = t.region
	}
	args := append(append([]*Array{pred}, operands...), u.arrs...)
	return Apply(ir.Cond, nil, regions, args...)
}

func adTypeList(ts []ir.Type) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return "(" + strings.Join(s, ", ") + ")"
}

// While runs body on the state while cond(state) is true, like
// jax.lax.while_loop, and returns the final state. cond returns a bool scalar;
// body returns a new state with exactly the state's types. Both are traced once.
// While is not reverse-differentiable (its trip count is dynamic):
// differentiating through it is an *Error; use Scan or ForLoop with static
// bounds instead.
func While(cond func(state []*Array) *Array, body func(state []*Array) []*Array, init ...*Array) []*Array {
	if cond == nil || body == nil {
		panic(Errorf("While", "nil cond or body"))
	}
	for i, a := range init {
		if a == nil {
			panic(Errorf("While", "state %d is nil", i))
		}
		checkLive("While", a)
	}
	m := len(init)
	dst := adDstFunc()
	C := NewTracer(dst, dst.NewRegion())
	Bd := NewTracer(dst, dst.NewRegion())
	defer C.Close()
	defer Bd.Close()
	params := func(t *Tracer) []*Array {
		ps := make([]*Array, m)
		for i, a := range init {
			ps[i] = t.Param(a.Type())
		}
		return ps
	}
	adWith(C, func() {
		p := cond(params(C))
		if p == nil {
			panic(Errorf("While", "cond returned nil"))
		}
		checkLive("While", p)
		if p.Rank() != 0 || p.DType() != ir.Bool {
			panic(Errorf("While", "cond must return a bool scalar, got %v", p.Type()))
		}
		C.region.Results = []*ir.Value{C.Output(p)}
	})
	adWith(Bd, func() {
		rs := body(params(Bd))
		if len(rs) != m {
			panic(Errorf("While", "body returned %d state arrays, want %d", len(rs), m))
		}
		var vals []*ir.Value
		for i, r := range rs {
			if r == nil {
				panic(Errorf("While", "body returned a nil state[%d]", i))
			}
			checkLive("While", r)
			if !r.Type().Equal(init[i].Type()) {
				panic(Errorf("While", "body returned state[%d] as %v, but the state is %v (the state must keep its dtype, shape and memory space)", i, r.Type(), init[i].Type()))
			}
			vals = append(vals, Bd.Output(r))
		}
		Bd.region.Results = vals
	})
	ts := []*Tracer{C, Bd}
	u, slots := adUnify(ts, m)
	regions := make([]*ir.Region, 2)
	for b, t := range ts {
		s := append([]adSlot{}, slots[b]...)
		for _, p := range t.region.Params[:m] {
			s = append(s, adSlot{v: p})
		}
		adArrange(t.region, s)
		regions[b] = t.region
	}
	args := append(append([]*Array{}, u.arrs...), init...)
	return Apply(ir.While, ir.Attrs{"num_consts": len(u.arrs)}, regions, args...)
}

// ForLoop runs state = body(i, state) for i = lo, lo+1, ..., hi-1 and returns
// the final state, like jax.lax.fori_loop with static bounds. i is an i32
// scalar. body must return the state with exactly its types. It is a Scan over
// the indices, so it is differentiable; with hi <= lo it returns state as is.
func ForLoop(lo, hi int, body func(i *Array, state []*Array) []*Array, state ...*Array) []*Array {
	if body == nil {
		panic(Errorf("ForLoop", "nil body"))
	}
	if lo < math.MinInt32 || hi > math.MaxInt32 {
		panic(Errorf("ForLoop", "bounds [%d, %d) do not fit in int32", lo, hi))
	}
	if hi <= lo {
		for _, a := range state {
			checkLive("ForLoop", a)
		}
		return append([]*Array(nil), state...)
	}
	n := hi - lo
	idx := Apply1(ir.Iota, ir.Attrs{"dtype": ir.Int32, "shape": []int{n}, "dim": 0})
	if lo != 0 {
		idx = adAdd(idx, adFull(ir.Int32, ir.Shape{n}, float64(lo)))
	}
	c, _ := adScan("ForLoop", func(c, x []*Array) ([]*Array, []*Array) {
		return body(x[0], c), nil
	}, state, []*Array{idx}, nil)
	return c
}
