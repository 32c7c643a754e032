package trace

import "github.com/ferryml/ferry/ir"

// CustomVJP returns a function with a user-defined reverse-mode derivative, in
// the spirit of jax.custom_vjp.
//
// fwd computes the outputs from the arguments, plus residuals: whatever arrays
// the backward pass needs. bwd receives the residuals and the cotangents of the
// outputs (zeros for outputs that do not influence the differentiated result,
// never nil) and returns one cotangent per argument, of the argument's shape (nil
// for zero, and for integer arguments).
//
// Called outside any trace, the function just runs fwd and returns its outputs.
// Under Grad, VJP, rt.Jit, Scan and the other transformations, fwd's ops are
// recorded as usual, but differentiation does not look inside them: the
// cotangents of the outputs go through bwd. bwd is itself traced with ordinary
// ops, so a second differentiation differentiates bwd.
//
//	clipGrad := trace.CustomVJP(
//		func(x []*trace.Array) ([]*trace.Array, []*trace.Array) { return x, nil },
//		func(_, ct []*trace.Array) []*trace.Array { return []*trace.Array{trace.Clip(ct[0], lo, hi)} })
//	y := clipGrad(x)[0]
func CustomVJP(fwd func(args []*Array) (outs, residuals []*Array), bwd func(residuals, cts []*Array) []*Array) func(args ...*Array) []*Array {
	if fwd == nil || bwd == nil {
		panic(Errorf("CustomVJP", "fwd and bwd must be non-nil"))
	}
	return func(args ...*Array) []*Array {
		for _, a := range args {
			checkLive("CustomVJP", a)
		}
		outs, res := fwd(args)
		for i, o := range outs {
			if o == nil {
				panic(Errorf("CustomVJP", "fwd returned a nil output %d", i))
			}
			checkLive("CustomVJP", o)
		}
		for i, r := range res {
			if r == nil {
				panic(Errorf("CustomVJP", "fwd returned a nil residual %d", i))
			}
			checkLive("CustomVJP", r)
		}
		if current() == nil || len(outs) == 0 {
			return outs
		}
		t, inVals, resVals := adCustomPrepare(args, res)
		marked := make([]*Array, len(outs))
		for i, o := range outs {
			marked[i] = Apply1(ir.DevicePut, ir.Attrs{"space": o.Space()}, o)
		}
		adCustomFinish(t, inVals, resVals, marked, bwd)
		return marked
	}
}

// adCustomPrepare returns the innermost tracer and the values of a custom_vjp
// call's inputs and residuals in it (capturing them if needed). It must run
// before the call's markers are emitted, so that every value the markers refer
// to is defined before them.
func adCustomPrepare(ins, res []*Array) (*Tracer, []*ir.Value, []*ir.Value) {
	t := current()
	if t == nil {
		return nil, nil, nil
	}
	vals := func(as []*Array) []*ir.Value {
		out := make([]*ir.Value, len(as))
		for i, a := range as {
			out[i] = t.valueOf(a)
		}
		return out
	}
	return t, vals(ins), vals(res)
}

// adCustomFinish marks the outputs (identity device_puts just recorded in t) as
// one custom_vjp call.
func adCustomFinish(t *Tracer, inVals, resVals []*ir.Value, outs []*Array, bwd func(res, cts []*Array) []*Array) {
	if t == nil || len(outs) == 0 {
		return
	}
	g := &adGroup{inputs: inVals, residuals: resVals, bwd: bwd}
	for _, o := range outs {
		if o.tr != t {
			return // not recorded in t: nothing to differentiate through
		}
		g.outputs = append(g.outputs, o.val)
	}
	for i, o := range outs {
		adSetMark(o.val, &adMark{group: g, index: i})
	}
}

// adCallBwd runs a custom_vjp backward function and checks what it returns.
func adCallBwd(bwd func(res, cts []*Array) []*Array, ins, res, outs, cts []*Array) []*Array {
	full := make([]*Array, len(outs))
	for i, o := range outs {
		if i < len(cts) && cts[i] != nil {
			full[i] = cts[i]
		} else {
			full[i] = adZeros(adCtType(o.Type()))
		}
	}
	got := bwd(res, full)
	if len(got) != len(ins) {
		panic(Errorf("CustomVJP", "bwd returned %d cotangents for %d arguments", len(got), len(ins)))
	}
	out := make([]*Array, len(ins))
	for i, g := range got {
		if g == nil || !ins[i].DType().IsFloat() {
			continue
		}
		checkLive("CustomVJP", g)
		if !g.typ.Shape.Equal(ins[i].typ.Shape) {
			panic(Errorf("CustomVJP", "bwd returned a cotangent of shape %v for argument %d of type %v", g.typ.Shape, i, ins[i].typ))
		}
		out[i] = adConvert(g, ins[i].DType())
	}
	return out
}
