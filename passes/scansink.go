package passes

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// scanSink moves a unary elementwise op (a cast, a negation, ...) or a
// device_put applied to a scan's stacked ys output into the scan body, when
// that op is the output's only user: f(stack(y_i)) = stack(f(y_i)), so the
// scan stacks the final values and the intermediate stack never exists (a
// stack bound for pinned_host is written there one slice per iteration). A stack of layers
// initialised in f32 and then cast to bf16 (nn.NewStack in f32, then Convert)
// thus writes bf16 straight into the output, one layer per iteration, and the
// fusion pass fuses the cast into each layer's generator. Chains move one op
// at a time, until nothing moves; nested regions are visited first.
func scanSink(st *State) error {
	return walkRegions(st.Func.Body, false, func(r *ir.Region) error {
		for sinkOne(st.Func, r) {
		}
		return nil
	})
}

// sinkOne moves the first op of r that can move into its scan and reports
// whether it moved one.
func sinkOne(f *ir.Func, r *ir.Region) bool {
	us, ret := users(r), returned(r)
	for k, op := range r.Ops {
		if !op.Info().Elementwise && op.Code != ir.DevicePut || len(op.Args) != 1 || len(op.Results) != 1 {
			continue
		}
		a := op.Args[0]
		s := a.Op
		if s == nil || s.Code != ir.Scan || ret[a] || len(us[a]) != 1 {
			continue
		}
		j := slices.Index(s.Results, a)
		if j < s.Attrs.Int("num_carry") {
			continue // a carry, not a stack
		}
		body := s.Regions[0]
		in, err := f.NewOp(op.Code, []*ir.Value{body.Results[j]}, ir.CloneAttrs(op.Attrs))
		if err != nil {
			continue // the op does not apply to one slice: leave it
		}
		in.Loc = op.Loc
		body.Ops = append(body.Ops, in)
		body.Results[j] = in.Result()
		// The scan's output becomes the op's result: its type, the same value.
		// A device_put moves the stack to its space: each iteration
		// writes its slice there.
		space := a.Type.Space
		if op.Code == ir.DevicePut {
			space = in.Result().Type.Space
		}
		a.Type = ir.Type{DType: in.Result().Type.DType, Space: space, Shape: a.Type.Shape}
		sub := subst{op.Result(): a}
		r.Ops = slices.Delete(r.Ops, k, k+1)
		for _, u := range r.Ops {
			sub.apply(u)
		}
		sub.applyResults(r)
		return true
	}
	return false
}
