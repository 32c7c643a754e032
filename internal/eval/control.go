package eval

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

func cloneAll(ls []*ir.Literal) []*ir.Literal {
	out := make([]*ir.Literal, len(ls))
	for i, l := range ls {
		out[i] = l.Clone()
	}
	return out
}

// scan runs the body length times. With outs nil it allocates the results;
// otherwise it writes the final carry and the ys into outs. x slices are
// passed to the body as views (RunRegion never modifies its arguments).
func scan(op *ir.Op, x []*ir.Literal, outTypes []ir.Type, outs []*ir.Literal) ([]*ir.Literal, error) {
	a := op.Attrs
	nc, nk, n := a.Int("num_consts"), a.Int("num_carry"), a.Int("length")
	body := op.Regions[0]
	consts, carry, xs := x[:nc], x[nc:nc+nk], x[nc+nk:]
	alloc := outs == nil
	if alloc {
		outs = make([]*ir.Literal, len(outTypes))
		for j := nk; j < len(outTypes); j++ {
			outs[j] = newLit(outTypes[j])
		}
	}
	ys := outs[nk:]
	if n == 0 {
		for j, c := range carry {
			if alloc {
				outs[j] = c.Clone()
			} else {
				copy(outs[j].Data, c.Data)
			}
		}
		return outs, nil
	}
	in := make([]*ir.Literal, len(x))
	copy(in, consts)
	for it := 0; it < n; it++ {
		i := it
		if a.Bool("reverse") {
			i = n - 1 - it
		}
		copy(in[nc:], carry)
		for j, xl := range xs {
			t := body.Params[nc+nk+j].Type
			sz := int(t.Bytes())
			in[nc+nk+j] = &ir.Literal{Type: t, Data: xl.Data[i*sz : (i+1)*sz]}
		}
		res, err := RunRegion(body, in)
		if err != nil {
			return nil, fmt.Errorf("body, iteration %d: %w", i, err)
		}
		carry = res[:nk]
		for j, y := range res[nk:] {
			sz := len(y.Data)
			copy(ys[j].Data[i*sz:(i+1)*sz], y.Data)
		}
	}
	for j, c := range carry {
		if alloc {
			outs[j] = c
		} else {
			copy(outs[j].Data, c.Data)
		}
	}
	return outs, nil
}

func while(op *ir.Op, x []*ir.Literal) ([]*ir.Literal, error) {
	nc := op.Attrs.Int("num_consts")
	condR, body := op.Regions[0], op.Regions[1]
	in := append([]*ir.Literal(nil), x...)
	ran := false
	for it := 0; ; it++ {
		c, err := RunRegion(condR, in)
		if err != nil {
			return nil, fmt.Errorf("cond, iteration %d: %w", it, err)
		}
		if c[0].Data[0] == 0 {
			break
		}
		st, err := RunRegion(body, in)
		if err != nil {
			return nil, fmt.Errorf("body, iteration %d: %w", it, err)
		}
		copy(in[nc:], st)
		ran = true
	}
	if !ran {
		return cloneAll(in[nc:]), nil
	}
	return in[nc:], nil
}

func cond(op *ir.Op, x []*ir.Literal) ([]*ir.Literal, error) {
	branch, name := 1, "false branch"
	if x[0].Data[0] != 0 {
		branch, name = 0, "true branch"
	}
	res, err := RunRegion(op.Regions[branch], x[1:])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return res, nil
}
