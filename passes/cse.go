package passes

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ferryml/ferry/ir"
)

// cse merges ops of one region that have the same code, the same operands and
// equal attributes (literals compared by type and bytes, floats by bits); the
// later op's results are replaced by the earlier op's. Region ops are never
// merged. Each region is its own scope (regions are isolated from above).
//
// optimization_barrier ops are opaque: never merged, so values computed from
// their results (a checkpointed function's recomputation in the backward pass)
// are never merged with the same computation from the barrier's operands (the
// forward pass). Once CSE is done the barriers have served their purpose and
// are removed: their results are replaced by their operands.
func cse(st *State) error {
	err := walkRegions(st.Func.Body, true, func(r *ir.Region) error {
		cseRegion(r)
		return nil
	})
	if err != nil {
		return err
	}
	return walkRegions(st.Func.Body, true, func(r *ir.Region) error {
		stripBarriers(r)
		return nil
	})
}

// stripBarriers replaces the results of r's optimization_barrier ops by their
// operands and removes the ops.
func stripBarriers(r *ir.Region) {
	s := subst{}
	out := r.Ops[:0]
	for _, op := range r.Ops {
		s.apply(op)
		if op.Code == ir.OptimizationBarrier {
			for i, v := range op.Results {
				s[v] = op.Args[i]
			}
			continue
		}
		out = append(out, op)
	}
	r.Ops = out
	s.applyResults(r)
}

func cseRegion(r *ir.Region) {
	s := subst{}
	seen := map[string]*ir.Op{}
	out := make([]*ir.Op, 0, len(r.Ops))
	for _, op := range r.Ops {
		s.apply(op)
		if isRegionOp(op) || op.Code == ir.OptimizationBarrier {
			out = append(out, op)
			continue
		}
		k, ok := opKey(op)
		if !ok {
			out = append(out, op)
			continue
		}
		if prev, dup := seen[k]; dup && len(prev.Results) == len(op.Results) {
			for i, v := range op.Results {
				s[v] = prev.Results[i]
			}
			continue
		}
		seen[k] = op
		out = append(out, op)
	}
	r.Ops = out
	s.applyResults(r)
}

// opKey encodes an op's code, operands and attributes; ok is false when an
// attribute has a kind the encoding does not know.
func opKey(op *ir.Op) (string, bool) {
	var b strings.Builder
	b.WriteString(strconv.Itoa(int(op.Code)))
	b.WriteByte('(')
	for _, a := range op.Args {
		b.WriteString(strconv.Itoa(a.ID))
		b.WriteByte(',')
	}
	b.WriteByte(')')
	for _, k := range op.Attrs.Keys() {
		b.WriteString(strconv.Quote(k))
		b.WriteByte('=')
		switch x := op.Attrs[k].(type) {
		case int:
			fmt.Fprintf(&b, "i%d", x)
		case []int:
			fmt.Fprintf(&b, "I%v", x)
		case float64:
			fmt.Fprintf(&b, "f%x", math.Float64bits(x))
		case bool:
			fmt.Fprintf(&b, "b%t", x)
		case string:
			b.WriteString("s" + strconv.Quote(x))
		case ir.DType:
			fmt.Fprintf(&b, "d%d", x)
		case ir.MemorySpace:
			fmt.Fprintf(&b, "m%d", x)
		case *ir.Literal:
			if x == nil {
				return "", false
			}
			fmt.Fprintf(&b, "L%v:%d:", x.Type, len(x.Data))
			b.Write(x.Data)
		default:
			return "", false
		}
		b.WriteByte(';')
	}
	// Result types pin down ops whose attributes alone do not (none today).
	for _, v := range op.Results {
		b.WriteString(v.Type.String())
	}
	return b.String(), true
}
