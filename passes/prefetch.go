package passes

import (
	"github.com/ferryml/ferry/ir"
)

// prefetch reserves, in scan bodies, the buffer of a copy of an xs slice
// into another memory space — trace.DevicePut(w[i], device) of parameters
// kept in pinned_host and scanned over axis 0 — for the whole iteration, so
// that the executor can double buffer it: once iteration i's last reader of
// the copy has run, the copy of slice i+1 (i-1 in a reverse scan) is started
// into the same bytes and overlaps the rest of iteration i, and iteration
// i+1's device_put only waits for it (see cpu/cpuexec's copy.go). No
// second buffer is needed, but the reserved bytes are not reused by other
// values of the body.
//
// For every such device_put (an op of a scan body whose operand is an xs
// parameter of the body and whose result the body does not return), in body
// order, the pass moves the op to the front of the body and extends its
// result's live interval to the end of the body (as for a returned value),
// and keeps the change only when the function's planned arenas do not grow:
// device bytes not at all, pinned_host bytes not when device bytes stay the
// same. It runs after liveness and changes State.Liveness with the order.
//
// With Options.PrefetchGathers, an all_gather of an xs parameter of a scan
// body (a layer's parameters under FSDP, gathered inside the scan over the
// stacked layers; see prefetchableGather) is moved and reserved likewise,
// and kept even when the arenas grow: the executor runs the next
// iteration's gather into the reserved bytes beside the rest of the
// iteration (cpu/cpuexec's collective.go), and the memory analysis counts
// the in-flight buffer, so that it still bounds the measured peak (and a
// memory budget's plan pays for the overlap).
func prefetch(st *State) error {
	if st.Liveness == nil {
		if err := liveness(st); err != nil {
			return err
		}
	}
	body := st.Func.Body
	lv := func(r *ir.Region) *Liveness {
		if l, ok := st.Liveness[r]; ok {
			return l
		}
		return ComputeLiveness(r)
	}
	arena := func() [2]int64 {
		return planRegion(body, true, st.Options.Donated, st.Options.FusionInPlace, lv).Arena
	}
	base := arena()
	var scans []*ir.Op
	_ = walkRegions(body, false, func(r *ir.Region) error {
		for _, op := range r.Ops {
			if op.Code == ir.Scan {
				scans = append(scans, op)
			}
		}
		return nil
	})
	for _, s := range scans {
		b := s.Regions[0]
		xs := s.Attrs.Int("num_consts") + s.Attrs.Int("num_carry")
		ret := returned(b)
		var reserved []*ir.Value
		for _, op := range append([]*ir.Op(nil), b.Ops...) {
			gather := st.Options.PrefetchGathers && prefetchableGather(op, b, xs, ret)
			if !gather && !prefetchable(op, b, xs, ret) {
				continue
			}
			ops, l := b.Ops, st.Liveness[b]
			moved := make([]*ir.Op, 0, len(ops))
			moved = append(moved, op)
			for _, o := range ops {
				if o != op {
					moved = append(moved, o)
				}
			}
			b.Ops = moved
			nl := ComputeLiveness(b)
			for _, v := range append(reserved, op.Result()) {
				nl.Last[v] = len(b.Ops)
			}
			st.Liveness[b] = nl
			after := arena()
			if !gather && (after[ir.Device] > base[ir.Device] || after[ir.Device] == base[ir.Device] && after[ir.PinnedHost] > base[ir.PinnedHost]) {
				b.Ops = ops
				if l != nil {
					st.Liveness[b] = l
				} else {
					delete(st.Liveness, b)
				}
				continue
			}
			base = after
			reserved = append(reserved, op.Result())
		}
	}
	return nil
}

// prefetchableGather reports whether op is an all_gather of an xs parameter
// (index ≥ xs) of scan body b, whose result b reads and does not return.
func prefetchableGather(op *ir.Op, b *ir.Region, xs int, ret map[*ir.Value]bool) bool {
	if op.Code != ir.AllGather || len(op.Args) != 1 || len(op.Results) != 1 {
		return false
	}
	return movesXsSlice(op, b, xs, ret)
}

// prefetchable reports whether op is a device_put between memory spaces of
// an xs parameter (index ≥ xs) of scan body b, whose result b reads and does
// not return.
func prefetchable(op *ir.Op, b *ir.Region, xs int, ret map[*ir.Value]bool) bool {
	if op.Code != ir.DevicePut || len(op.Args) != 1 || op.Args[0].Type.Space == op.Result().Type.Space {
		return false
	}
	return movesXsSlice(op, b, xs, ret)
}

// movesXsSlice reports whether op's one operand is an xs parameter (index ≥
// xs) of scan body b and its result is read by an op of b and not returned:
// what a copy or gather started an iteration ahead must be.
func movesXsSlice(op *ir.Op, b *ir.Region, xs int, ret map[*ir.Value]bool) bool {
	a := op.Args[0]
	if a.Op != nil || a.Index < xs || a.Index >= len(b.Params) || b.Params[a.Index] != a || ret[op.Result()] {
		return false
	}
	for _, o := range b.Ops {
		if hasArg(o, op.Result()) {
			return true
		}
	}
	return false
}
