package passes_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// traceFunc traces fn on parameters of the given types into a function.
func traceFunc(name string, fn func(args ...*trace.Array) []*trace.Array, types ...ir.Type) *ir.Func {
	tr := trace.NewFuncTracer(name)
	params := make([]*trace.Array, len(types))
	for i, t := range types {
		params[i] = tr.Param(t)
	}
	var outs []*trace.Array
	func() {
		tr.Push()
		defer tr.Pop()
		outs = fn(params...)
	}()
	f := tr.Func()
	for _, o := range outs {
		f.Body.Results = append(f.Body.Results, tr.Output(o))
	}
	tr.Close()
	return f
}

// compile compiles f with verification and checks the plan.
func compile(t testing.TB, f *ir.Func, opts passes.Options) *passes.Program {
	t.Helper()
	opts.Verify = true
	p, err := passes.Compile(f, opts)
	require.NoError(t, err, "compiling\n%s", f)
	require.NoError(t, passes.CheckPlan(p))
	return p
}

// sameLiteral reports whether two literals hold the same bits (any NaN equals
// any NaN of the same dtype).
func sameLiteral(a, b *ir.Literal) error {
	if !a.Type.Equal(b.Type) {
		return fmt.Errorf("types differ: %v vs %v", a.Type, b.Type)
	}
	if len(a.Data) != len(b.Data) {
		return fmt.Errorf("sizes differ")
	}
	sz := a.Type.DType.Size()
	for i := range a.Type.Size() {
		x, y := a.Data[i*sz:(i+1)*sz], b.Data[i*sz:(i+1)*sz]
		if string(x) == string(y) {
			continue
		}
		if a.Type.DType.IsFloat() {
			fx, fy := a.Float64At(i), b.Float64At(i)
			if math.IsNaN(fx) && math.IsNaN(fy) {
				continue
			}
			return fmt.Errorf("element %d: %v vs %v", i, fx, fy)
		}
		return fmt.Errorf("element %d: %v vs %v", i, a.Float64At(i), b.Float64At(i))
	}
	return nil
}

func sameResults(want, got []*ir.Literal) error {
	if len(want) != len(got) {
		return fmt.Errorf("%d results, want %d", len(got), len(want))
	}
	for i := range want {
		if err := sameLiteral(want[i], got[i]); err != nil {
			return fmt.Errorf("result %d: %w", i, err)
		}
	}
	return nil
}

// ---- a plan-following executor ----

// runPlan executes a compiled program the way the plan says: every temp in
// its arena slot (arenas filled with garbage first), outputs in their own
// buffers, aliased results in the donated argument's memory, nested regions in
// their blocks with parameters as views. Ops are computed by eval (which reads
// all operands before its results are copied in place). A plan that lets two
// live values share bytes makes the results wrong.
func runPlan(p *passes.Program, args []*ir.Literal) ([]*ir.Literal, error) {
	var arenas [2][]byte
	for s := range arenas {
		arenas[s] = make([]byte, p.Plan.Arena[s])
		for i := range arenas[s] {
			arenas[s][i] = byte(0xA5 ^ i)
		}
	}
	// The caller's arguments may be donated: work on copies.
	in := make([]*ir.Literal, len(args))
	for i, a := range args {
		in[i] = a.Clone()
	}
	body := p.Func.Body
	outs := make([]*ir.Literal, len(body.Results))
	loc := func(v *ir.Value, b passes.Buffer) *ir.Literal {
		switch b.Kind {
		case passes.BufOutput:
			if outs[b.Index] == nil {
				outs[b.Index] = ir.NewLiteral(v.Type)
			}
			return outs[b.Index]
		case passes.BufAlias:
			l := &ir.Literal{Type: v.Type, Data: in[b.Param].Data}
			outs[b.Index] = l
			return l
		}
		return nil
	}
	env, err := runRegionPlan(p.Plan, arenas, in, loc)
	if err != nil {
		return nil, err
	}
	res := make([]*ir.Literal, len(body.Results))
	for i, v := range body.Results {
		b := p.Plan.Values[v]
		if (b.Kind == passes.BufOutput || b.Kind == passes.BufAlias) && b.Index == i {
			res[i] = outs[i].Clone()
			continue
		}
		res[i] = env[v].Clone() // the executor copies
	}
	return res, nil
}

func view(t ir.Type, mem []byte) *ir.Literal {
	return &ir.Literal{Type: t, Data: mem[:t.Bytes():t.Bytes()]}
}

// runRegionPlan runs one region; params are views; loc places top-level
// outputs and aliases. It returns the environment (value → memory).
func runRegionPlan(rp *passes.RegionPlan, arenas [2][]byte, params []*ir.Literal, loc func(*ir.Value, passes.Buffer) *ir.Literal) (map[*ir.Value]*ir.Literal, error) {
	r := rp.Region
	env := map[*ir.Value]*ir.Literal{}
	for i, v := range r.Params {
		env[v] = params[i]
	}
	place := func(v *ir.Value) (*ir.Literal, error) {
		b, ok := rp.Values[v]
		if !ok {
			return nil, fmt.Errorf("%v has no buffer", v)
		}
		if b.Kind == passes.BufTemp {
			return view(v.Type, arenas[b.Space][b.Offset:]), nil
		}
		if l := loc(v, b); l != nil {
			return l, nil
		}
		return nil, fmt.Errorf("%v: unexpected buffer %v", v, b.Kind)
	}
	for _, op := range r.Ops {
		ins := make([]*ir.Literal, len(op.Args))
		for i, a := range op.Args {
			ins[i] = env[a]
		}
		dst := make([]*ir.Literal, len(op.Results))
		for i, v := range op.Results {
			l, err := place(v)
			if err != nil {
				return nil, err
			}
			dst[i] = l
		}
		if subs, ok := rp.Sub[op]; ok {
			var sub [2][]byte
			off := rp.SubOffset[op]
			for s := range sub {
				sub[s] = arenas[s][off[s]:]
			}
			if err := runNested(op, subs, sub, ins, dst); err != nil {
				return nil, err
			}
		} else {
			// eval reads every operand before the results are copied, as an
			// in-place kernel reads element k before writing it.
			res, err := eval.EvalOp(op, ins)
			if err != nil {
				return nil, err
			}
			for i := range res {
				copy(dst[i].Data, res[i].Data)
			}
		}
		for i, v := range op.Results {
			env[v] = dst[i]
		}
	}
	return env, nil
}

// runNested runs scan, while or cond with nested plans, writing into dst.
func runNested(op *ir.Op, subs []*passes.RegionPlan, arenas [2][]byte, x, dst []*ir.Literal) error {
	noLoc := func(*ir.Value, passes.Buffer) *ir.Literal { return nil }
	results := func(rp *passes.RegionPlan, env map[*ir.Value]*ir.Literal) []*ir.Literal {
		out := make([]*ir.Literal, len(rp.Region.Results))
		for i, v := range rp.Region.Results {
			out[i] = env[v].Clone() // through a temporary copy
		}
		return out
	}
	switch op.Code {
	case ir.Scan:
		nc, nk, n := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry"), op.Attrs.Int("length")
		body := subs[0].Region
		for i := range nk {
			copy(dst[i].Data, x[nc+i].Data)
		}
		for it := range n {
			i := it
			if op.Attrs.Bool("reverse") {
				i = n - 1 - it
			}
			ps := append([]*ir.Literal{}, x[:nc]...)
			ps = append(ps, dst[:nk]...)
			for j, xs := range x[nc+nk:] {
				t := body.Params[nc+nk+j].Type
				sz := t.Bytes()
				ps = append(ps, view(t, xs.Data[int64(i)*sz:]))
			}
			// ys slices: the body writes those results in place.
			slice := func(v *ir.Value, b passes.Buffer) *ir.Literal {
				if b.Kind != passes.BufSlice {
					return nil
				}
				return view(v.Type, dst[b.Index].Data[int64(i)*v.Type.Bytes():])
			}
			env, err := runRegionPlan(subs[0], arenas, ps, slice)
			if err != nil {
				return err
			}
			res := results(subs[0], env)
			for j := range nk {
				copy(dst[j].Data, res[j].Data)
			}
			for j, y := range res[nk:] {
				sz := int64(len(y.Data))
				copy(dst[nk+j].Data[int64(i)*sz:], y.Data)
			}
		}
	case ir.While:
		nc := op.Attrs.Int("num_consts")
		for i := range dst {
			copy(dst[i].Data, x[nc+i].Data)
		}
		for {
			ps := append(append([]*ir.Literal{}, x[:nc]...), dst...)
			env, err := runRegionPlan(subs[0], arenas, ps, noLoc)
			if err != nil {
				return err
			}
			if results(subs[0], env)[0].Data[0] == 0 {
				return nil
			}
			env, err = runRegionPlan(subs[1], arenas, ps, noLoc)
			if err != nil {
				return err
			}
			for i, l := range results(subs[1], env) {
				copy(dst[i].Data, l.Data)
			}
		}
	case ir.Cond:
		b := 1
		if x[0].Data[0] != 0 {
			b = 0
		}
		env, err := runRegionPlan(subs[b], arenas, x[1:], noLoc)
		if err != nil {
			return err
		}
		for i, l := range results(subs[b], env) {
			copy(dst[i].Data, l.Data)
		}
	default:
		return fmt.Errorf("no nested runner for %v", op.Code)
	}
	return nil
}
