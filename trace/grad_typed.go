package trace

import "fmt"

// Typed gradients of functions of several arguments: jax.grad's argnums
// without a type assertion. Go has no variadic type parameters, so there is
// one function per shape of the call:
//
//	jax.grad(f)(params, batch)                     trace.GradFirst(f)(params, batch)
//	jax.grad(f, argnums=(0, 1))(a, b)              trace.Grad2(f)(a, b)
//	jax.grad(f, argnums=(0, 1, 2))(a, b, c)        trace.Grad3(f)(a, b, c)
//	jax.value_and_grad(f, argnums=(0, 1))(a, b)    trace.ValueAndGrad2(f)(a, b)
//
// Each argument is any tree of arrays (a params struct, a slice, a map, a
// single *Array); each gradient has its argument's type and structure. Other
// argnums, and functions of more arguments, are GradN's (untyped), or a
// closure over the arguments not differentiated.

// GradFirst returns a function computing the gradient of fn with respect to
// its first argument, the second passed through undifferentiated: jax.grad's
// default argnums=0 for loss(params, batch). The batch may hold anything
// (integer labels, static values); it gets no gradient, as an array the
// function closes over would not.
//
//	grad := trace.GradFirst(loss) // func(Params, Batch) Params
//	step := rt.Jit(func(p Params, b Batch) Params { g := grad(p, b); ... })
func GradFirst[P, X any](fn func(params P, x X) *Array) func(params P, x X) P {
	vg := ValueAndGradFirst(fn)
	return func(params P, x X) P {
		_, g := vg(params, x)
		return g
	}
}

// ValueAndGradFirst is GradFirst also returning the value of fn
// (jax.value_and_grad(fn)(params, x)).
func ValueAndGradFirst[P, X any](fn func(params P, x X) *Array) func(params P, x X) (*Array, P) {
	const name = "GradFirst"
	if fn == nil {
		panic(Errorf(name, "nil function"))
	}
	return func(params P, x X) (*Array, P) {
		v, g := adValueAndGradTrees(name, []any{params}, func(t []any) *Array {
			return fn(adAs[P](name, 0, t[0]), x)
		})
		return v, adAs[P](name, 0, g[0])
	}
}

// Grad2 returns a function computing the gradients of fn with respect to both
// of its arguments, like jax.grad(fn, argnums=(0, 1)): each gradient has its
// argument's type and structure.
//
//	gw, gb := trace.Grad2(loss)(w, b)
func Grad2[A, B any](fn func(a A, b B) *Array) func(a A, b B) (A, B) {
	vg := ValueAndGrad2(fn)
	return func(a A, b B) (A, B) {
		_, ga, gb := vg(a, b)
		return ga, gb
	}
}

// ValueAndGrad2 is Grad2 also returning the value of fn, first
// (jax.value_and_grad(fn, argnums=(0, 1))).
func ValueAndGrad2[A, B any](fn func(a A, b B) *Array) func(a A, b B) (*Array, A, B) {
	const name = "Grad2"
	if fn == nil {
		panic(Errorf(name, "nil function"))
	}
	return func(a A, b B) (*Array, A, B) {
		v, g := adValueAndGradTrees(name, []any{a, b}, func(t []any) *Array {
			return fn(adAs[A](name, 0, t[0]), adAs[B](name, 1, t[1]))
		})
		return v, adAs[A](name, 0, g[0]), adAs[B](name, 1, g[1])
	}
}

// Grad3 returns a function computing the gradients of fn with respect to its
// three arguments, like jax.grad(fn, argnums=(0, 1, 2)).
func Grad3[A, B, C any](fn func(a A, b B, c C) *Array) func(a A, b B, c C) (A, B, C) {
	vg := ValueAndGrad3(fn)
	return func(a A, b B, c C) (A, B, C) {
		_, ga, gb, gc := vg(a, b, c)
		return ga, gb, gc
	}
}

// ValueAndGrad3 is Grad3 also returning the value of fn, first.
func ValueAndGrad3[A, B, C any](fn func(a A, b B, c C) *Array) func(a A, b B, c C) (*Array, A, B, C) {
	const name = "Grad3"
	if fn == nil {
		panic(Errorf(name, "nil function"))
	}
	return func(a A, b B, c C) (*Array, A, B, C) {
		v, g := adValueAndGradTrees(name, []any{a, b, c}, func(t []any) *Array {
			return fn(adAs[A](name, 0, t[0]), adAs[B](name, 1, t[1]), adAs[C](name, 2, t[2]))
		})
		return v, adAs[A](name, 0, g[0]), adAs[B](name, 1, g[1]), adAs[C](name, 2, g[2])
	}
}

// adValueAndGradTrees differentiates call, a float scalar function of the
// trees, with respect to all their leaves: it returns the value and one
// gradient tree per tree, of its structure. call receives the trees rebuilt
// from the differentiation's tracers.
func adValueAndGradTrees(name string, trees []any, call func(trees []any) *Array) (*Array, []any) {
	defs := make([]*TreeDef, len(trees))
	var leaves []*Array
	for i, t := range trees {
		ls, d, err := Flatten(t)
		if err != nil {
			panic(Errorf(name, "flattening argument %d: %v", i, err))
		}
		adCheckParams(name, fmt.Sprintf("argument %d", i), d, ls)
		defs[i], leaves = d, append(leaves, ls...)
	}
	split := func(ls []*Array) []any {
		out := make([]any, len(defs))
		k := 0
		for i, d := range defs {
			n := d.NumLeaves()
			v, err := d.Unflatten(ls[k : k+n])
			if err != nil {
				panic(Errorf(name, "argument %d: %v", i, err))
			}
			out[i], k = v, k+n
		}
		return out
	}
	outs, pb := VJP(func(ls []*Array) []*Array {
		loss := call(split(ls))
		adCheckLoss(name, loss)
		return []*Array{loss}
	}, leaves)
	return outs[0], split(pb([]*Array{adScalar(1, outs[0].DType())}))
}

// adAs returns the rebuilt tree v of argument i as a T (the zero T for a nil
// tree).
func adAs[T any](name string, i int, v any) T {
	var zero T
	if v == nil {
		return zero
	}
	t, ok := v.(T)
	if !ok {
		panic(Errorf(name, "argument %d was rebuilt as a %T, not a %T", i, v, zero))
	}
	return t
}
