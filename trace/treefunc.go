package trace

import "reflect"

// treeWrap returns a function of fn's type (any function whose parameters
// and results are trees of arrays) that flattens its arguments into leaves,
// hands them and fn as a function of flat leaves to transform, and rebuilds
// the results from the leaves transform returns. It is how the
// transformations over trees (Vmap, Remat) reach their flat cores; name is
// the transformation's, for errors.
func treeWrap[F any](name string, fn F, transform func(flat func([]*Array) []*Array, leaves []*Array) []*Array) F {
	return treeWrapDefs(name, fn, func(flat func([]*Array) []*Array, leaves []*Array, _ *treeCall) []*Array {
		return transform(flat, leaves)
	})
}

// treeCall is what treeWrapDefs tells its transform about one call: the
// structures of the arguments, and of the results once flat has run.
type treeCall struct {
	in, out []*TreeDef
}

// treeWrapDefs is treeWrap whose transform also gets the call's tree
// structures (for options given as tree prefixes of the arguments or
// results).
func treeWrapDefs[F any](name string, fn F, transform func(flat func([]*Array) []*Array, leaves []*Array, call *treeCall) []*Array) F {
	v := reflect.ValueOf(fn)
	if !v.IsValid() || v.Kind() != reflect.Func || v.IsNil() {
		panic(Errorf(name, "want a non-nil function, got %T", fn))
	}
	ft := v.Type()
	if ft.IsVariadic() {
		panic(Errorf(name, "variadic functions are not supported: %v", ft))
	}
	return reflect.MakeFunc(ft, func(in []reflect.Value) []reflect.Value {
		defs := make([]*TreeDef, len(in))
		var leaves []*Array
		for i, a := range in {
			ls, d, err := Flatten(a.Interface())
			if err != nil {
				panic(Errorf(name, "flattening argument %d: %v", i, err))
			}
			defs[i], leaves = d, append(leaves, ls...)
		}
		outDefs := make([]*TreeDef, ft.NumOut())
		call := &treeCall{in: defs, out: outDefs}
		flat := func(ls []*Array) []*Array {
			var outs []*Array
			for i, r := range v.Call(treeRebuild(name, "argument", defs, ft.In, ls)) {
				os, d, err := Flatten(r.Interface())
				if err != nil {
					panic(Errorf(name, "flattening result %d: %v", i, err))
				}
				outDefs[i], outs = d, append(outs, os...)
			}
			return outs
		}
		return treeRebuild(name, "result", outDefs, ft.Out, transform(flat, leaves, call))
	}).Interface().(F)
}

// treeRebuild unflattens consecutive runs of leaves into one value per
// TreeDef, of the Go type typ(i) (its zero value for a nil tree).
func treeRebuild(name, what string, defs []*TreeDef, typ func(int) reflect.Type, leaves []*Array) []reflect.Value {
	vals := make([]reflect.Value, len(defs))
	k := 0
	for i, d := range defs {
		n := d.NumLeaves()
		x, err := d.Unflatten(leaves[k : k+n])
		if err != nil {
			panic(Errorf(name, "%s %d: %v", what, i, err))
		}
		k += n
		if x == nil {
			vals[i] = reflect.Zero(typ(i))
		} else {
			vals[i] = reflect.ValueOf(x)
		}
	}
	return vals
}
