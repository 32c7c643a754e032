package trace

import (
	"fmt"
	"reflect"

	"github.com/ferryml/ferry/ir"
)

// Reverse-mode automatic differentiation.
//
// Differentiation happens at trace time, as in JAX: the function is traced into
// IR, the IR is replayed in the caller's context (so the primal values are
// concrete in eager mode, or recorded ops of the enclosing trace under rt.Jit or
// an outer Grad), and a VJP rule per op builds the backward pass from ordinary
// ops. Everything composes: Grad inside rt.Jit, rt.Jit inside Grad, Grad of
// Grad, Grad through Scan, Cond, ForLoop and CustomVJP.
//
// Conventions shared by every entry point:
//
//   - Only float arrays are differentiated. Integer and bool inputs get zero
//     gradients of their own dtype; integer and bool intermediates carry no
//     cotangent.
//   - Arrays the function closes over (captured from outside) are constants: they
//     get no gradient here, though an enclosing differentiation still sees them.
//   - A gradient has its input's dtype and shape, and lives on device, whatever
//     the input's memory space: cotangents are device arrays (the transpose of
//     a device_put from pinned_host keeps the cotangent on device), so the
//     gradients of parameters kept in pinned_host are device arrays, as XLA
//     counts them. Move them to host with DevicePut where wanted.
//   - Programming errors panic with *Error located at the user's line;
//     differentiating through While is such an error (use Scan or ForLoop).

// VJP traces fn at primals and returns its outputs and a pullback: a function
// from cotangents of the outputs (one per output, of its shape and dtype; nil
// means zero) to cotangents of the primals (one per primal, never nil; zeros
// where the outputs do not depend on it). This is jax.vjp on flat arrays, the
// core that Grad and the rest are built on. The pullback may be called several
// times, in the context VJP was called in (or a trace nested inside it).
func VJP(fn func(primals []*Array) []*Array, primals []*Array) (outs []*Array, pullback func(cts []*Array) []*Array) {
	if fn == nil {
		panic(Errorf("VJP", "nil function"))
	}
	for i, p := range primals {
		if p == nil {
			panic(Errorf("VJP", "primal %d is nil", i))
		}
		checkLive("VJP", p)
	}
	if ps := currentPlanner(); ps != nil {
		if cur := current(); cur != nil && cur.level == 1 {
			fn = ps.planFunc(fn)
		}
	}
	t := NewFuncTracer("vjp")
	func() {
		defer t.Close()
		adWith(t, func() {
			params := make([]*Array, len(primals))
			for i, p := range primals {
				params[i] = t.Param(p.Type())
			}
			res := fn(params)
			vals := make([]*ir.Value, len(res))
			for i, r := range res {
				if r == nil {
					panic(Errorf("VJP", "the function returned a nil array as output %d", i))
				}
				checkLive("VJP", r)
				vals[i] = t.Output(r)
			}
			t.region.Results = vals
		})
	}()
	r := t.region
	rp := make([]*Array, len(r.Params))
	act := make([]bool, len(r.Params))
	for i, p := range primals {
		rp[i], act[i] = p, true
	}
	copy(rp[len(primals):], t.Captures())
	lin := adLinearize(r, rp, act)
	outs = lin.results
	pullback = func(cts []*Array) []*Array {
		if len(cts) != len(outs) {
			panic(Errorf("VJP", "pullback takes %d cotangents (one per output), got %d", len(outs), len(cts)))
		}
		for i, c := range cts {
			if c == nil {
				continue
			}
			checkLive("VJP", c)
			if c.DType() != outs[i].DType() || !c.typ.Shape.Equal(outs[i].typ.Shape) {
				panic(Errorf("VJP", "cotangent %d is %v, want %v (the output's dtype and shape)", i, c.Type(), outs[i].Type()))
			}
		}
		pc := lin.backward(cts)
		grads := make([]*Array, len(primals))
		for i, p := range primals {
			if g := pc[i]; g != nil {
				grads[i] = adConvert(g, p.DType())
			} else {
				grads[i] = adZeros(p.Type().WithSpace(ir.Device))
			}
		}
		return grads
	}
	return outs, pullback
}

// JVP returns fn's outputs at primals and the Jacobian-vector product of fn with
// tangents (one per primal, of its shape and dtype; nil means zero): the
// forward-mode derivative, jax.jvp on flat arrays. It is computed by
// transposing the VJP (two reverse passes), so it costs about two gradients.
// Non-float outputs get zero tangents.
func JVP(fn func(primals []*Array) []*Array, primals, tangents []*Array) (outs, tangentOuts []*Array) {
	if len(tangents) != len(primals) {
		panic(Errorf("JVP", "%d tangents for %d primals", len(tangents), len(primals)))
	}
	outs, pb := VJP(fn, primals)
	var fi []int
	var u0 []*Array
	for i, o := range outs {
		if adFloat(o.DType()) {
			fi = append(fi, i)
			u0 = append(u0, adZeros(o.Type().WithSpace(ir.Device)))
		}
	}
	_, pb2 := VJP(func(u []*Array) []*Array {
		cts := make([]*Array, len(outs))
		for q, i := range fi {
			cts[i] = u[q]
		}
		return pb(cts)
	}, u0)
	ts := make([]*Array, len(primals))
	for i, t := range tangents {
		if t == nil || !adFloat(primals[i].DType()) {
			continue
		}
		checkLive("JVP", t)
		if t.DType() != primals[i].DType() || !t.typ.Shape.Equal(primals[i].typ.Shape) {
			panic(Errorf("JVP", "tangent %d is %v, want %v (the primal's dtype and shape)", i, t.Type(), primals[i].Type()))
		}
		ts[i] = t
	}
	r := pb2(ts)
	tangentOuts = make([]*Array, len(outs))
	for i, o := range outs {
		tangentOuts[i] = adZeros(o.Type().WithSpace(ir.Device))
	}
	for q, i := range fi {
		tangentOuts[i] = r[q]
	}
	return outs, tangentOuts
}

// Grad returns a function computing the gradient of fn, which maps a tree of
// arrays (a params struct, a slice, a map, a single *Array...) to a float scalar
// (the loss). The gradient has the same type and structure as the argument,
// like jax.grad:
//
//	type Params struct{ W, B *trace.Array }
//	loss := func(p Params) *trace.Array { ... }
//	g := trace.Grad(loss)(params) // g.W, g.B
//
// For a function of several arguments use GradFirst (loss(params, batch),
// differentiated with respect to params), Grad2 or Grad3 (every argument),
// or close over the arguments not differentiated (trace.Grad(func(p Params)
// *trace.Array { return loss(p, batch) })); GradN takes any argnums, untyped.
// Grad works eagerly, under rt.Jit, and nested (Grad of Grad).
func Grad[P any](fn func(params P) *Array) func(params P) P {
	vg := ValueAndGrad(fn)
	return func(params P) P {
		_, g := vg(params)
		return g
	}
}

// ValueAndGrad is Grad also returning the value of fn (jax.value_and_grad).
func ValueAndGrad[P any](fn func(params P) *Array) func(params P) (*Array, P) {
	if fn == nil {
		panic(Errorf("Grad", "nil function"))
	}
	vga := ValueAndGradAux(func(p P) (*Array, struct{}) { return fn(p), struct{}{} })
	return func(params P) (*Array, P) {
		v, _, g := vga(params)
		return v, g
	}
}

// ValueAndGradAux is ValueAndGrad for a function that also returns auxiliary
// data (jax.value_and_grad with has_aux=True): any tree of arrays, such as
// metrics or updated state, returned as computed and not differentiated.
func ValueAndGradAux[P, A any](fn func(params P) (*Array, A)) func(params P) (*Array, A, P) {
	if fn == nil {
		panic(Errorf("Grad", "nil function"))
	}
	return func(params P) (*Array, A, P) {
		leaves, def, err := Flatten(params)
		if err != nil {
			panic(Errorf("Grad", "flattening the argument: %v", err))
		}
		adCheckParams("Grad", "the argument", def, leaves)
		var auxDef *TreeDef
		outs, pb := VJP(func(ls []*Array) []*Array {
			p, err := UnflattenAs[P](def, ls)
			if err != nil {
				panic(Errorf("Grad", "%v", err))
			}
			loss, aux := fn(p)
			adCheckLoss("Grad", loss)
			al, ad, err := Flatten(aux)
			if err != nil {
				panic(Errorf("Grad", "flattening the auxiliary result: %v", err))
			}
			auxDef = ad
			return append([]*Array{loss}, al...)
		}, leaves)
		cts := make([]*Array, len(outs))
		cts[0] = adScalar(1, outs[0].DType())
		gl := pb(cts)
		g, err := UnflattenAs[P](def, gl)
		if err != nil {
			panic(Errorf("Grad", "%v", err))
		}
		aux, err := UnflattenAs[A](auxDef, outs[1:])
		if err != nil {
			panic(Errorf("Grad", "%v", err))
		}
		return outs[0], aux, g
	}
}

// adCheckParams checks that the leaves a gradient is taken with respect to
// are floats, as jax.grad requires ("grad requires real- or complex-valued
// inputs"): the gradient with respect to an integer or bool has no meaning,
// and zeros would hide the mistake. what names the argument, def its tree.
func adCheckParams(op, what string, def *TreeDef, leaves []*Array) {
	var paths []string
	for i, l := range leaves {
		if l == nil || adFloat(l.DType()) {
			continue
		}
		if paths == nil {
			paths = def.Paths()
		}
		name := what
		if i < len(paths) && paths[i] != "" {
			name += " " + paths[i]
		}
		panic(Errorf(op, "grad requires float inputs, but %s is %v: differentiate with respect to float arrays only (close over the others, or use VJP, whose cotangent for an integer input is nil)", name, l.Type()))
	}
}

// adCheckLoss checks that a differentiated function returned a float scalar.
func adCheckLoss(op string, loss *Array) {
	if loss == nil {
		panic(Errorf(op, "the function returned a nil loss"))
	}
	checkLive(op, loss)
	if loss.Rank() != 0 || !adFloat(loss.DType()) {
		panic(Errorf(op, "the function must return a float scalar (the loss), got %v; reduce it first (for example with Sum), or use VJP for non-scalar outputs", loss.Type()))
	}
}

var adArrayType = reflect.TypeFor[*Array]()

// GradN differentiates fn, any function whose parameters are trees of arrays and
// whose single result is a float scalar *Array, with respect to the parameters
// numbered argnums (default: 0), like jax.grad(fn, argnums=...). It returns a
// function with fn's parameters whose results are the gradients, one per
// argnum, each of its parameter's type:
//
//	loss := func(w1, w2 *trace.Array, x *trace.Array) *trace.Array { ... }
//	g := trace.GradN(loss, 0, 1).(func(w1, w2, x *trace.Array) (*trace.Array, *trace.Array))
//	g1, g2 := g(w1, w2, x)
//
// The result must be asserted to its function type: GradFirst, Grad2 and
// Grad3 (and their ValueAndGrad forms) are the typed forms of the common
// argnums, checked by the compiler.
func GradN(fn any, argnums ...int) any { return adGradN("GradN", fn, argnums, false) }

// ValueAndGradN is GradN whose function also returns fn's value, first:
// func(params...) (*Array, grads...).
func ValueAndGradN(fn any, argnums ...int) any {
	return adGradN("ValueAndGradN", fn, argnums, true)
}

func adGradN(name string, fn any, argnums []int, withValue bool) any {
	v := reflect.ValueOf(fn)
	if !v.IsValid() || v.Kind() != reflect.Func || v.IsNil() {
		panic(Errorf(name, "want a non-nil function, got %T", fn))
	}
	ft := v.Type()
	if ft.IsVariadic() || ft.NumOut() != 1 || ft.Out(0) != adArrayType {
		panic(Errorf(name, "want a non-variadic function returning one *Array, got %v", ft))
	}
	if len(argnums) == 0 {
		argnums = []int{0}
	}
	seen := map[int]bool{}
	for _, a := range argnums {
		if a < 0 || a >= ft.NumIn() || seen[a] {
			panic(Errorf(name, "bad argnums %v for a function of %d parameters", argnums, ft.NumIn()))
		}
		seen[a] = true
	}
	ins := make([]reflect.Type, ft.NumIn())
	for i := range ins {
		ins[i] = ft.In(i)
	}
	var outTypes []reflect.Type
	if withValue {
		outTypes = append(outTypes, adArrayType)
	}
	for _, a := range argnums {
		outTypes = append(outTypes, ft.In(a))
	}
	gt := reflect.FuncOf(ins, outTypes, false)
	return reflect.MakeFunc(gt, func(in []reflect.Value) []reflect.Value {
		defs := make([]*TreeDef, len(argnums))
		var leaves []*Array
		for q, a := range argnums {
			ls, d, err := Flatten(in[a].Interface())
			if err != nil {
				panic(Errorf(name, "flattening argument %d: %v", a, err))
			}
			adCheckParams(name, fmt.Sprintf("argument %d", a), d, ls)
			defs[q] = d
			leaves = append(leaves, ls...)
		}
		rebuild := func(ls []*Array, args []reflect.Value) {
			k := 0
			for q, a := range argnums {
				n := defs[q].NumLeaves()
				val, err := defs[q].Unflatten(ls[k : k+n])
				if err != nil {
					panic(Errorf(name, "argument %d: %v", a, err))
				}
				k += n
				if val == nil {
					args[q] = reflect.Zero(ft.In(a))
				} else {
					args[q] = reflect.ValueOf(val)
				}
			}
		}
		outs, pb := VJP(func(ls []*Array) []*Array {
			args := append([]reflect.Value(nil), in...)
			vals := make([]reflect.Value, len(argnums))
			rebuild(ls, vals)
			for q, a := range argnums {
				args[a] = vals[q]
			}
			loss, _ := v.Call(args)[0].Interface().(*Array)
			adCheckLoss(name, loss)
			return []*Array{loss}
		}, leaves)
		grads := pb([]*Array{adScalar(1, outs[0].DType())})
		res := make([]reflect.Value, 0, len(outTypes))
		if withValue {
			res = append(res, reflect.ValueOf(outs[0]))
		}
		gv := make([]reflect.Value, len(argnums))
		rebuild(grads, gv)
		return append(res, gv...)
	}).Interface()
}
