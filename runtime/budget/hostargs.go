package budget

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// The arguments the planner may place in pinned_host when no plan of the
// residuals fits with the arguments where the caller put them: stacked
// layer weights (streamedArgs) and optimizer state (stateArgs); hostArgs
// chooses among them.

// streamedArgs returns the leaves among the first n parameters of f that
// the program reads only as the xs of top-level scans (stacked layer
// weights, in the scans of the forward and the backward pass): on device,
// not weakly typed, and not results. A planned scan body streams such an
// argument in one slice at a time when it is in pinned_host.
func streamedArgs(f *ir.Func, n int, weakArgs []bool) []int {
	params := f.Body.Params
	ok := make(map[*ir.Value]bool, n)
	uses := map[*ir.Value]int{}
	for i := 0; i < n && i < len(params); i++ {
		p := params[i]
		if p.Type.Space == ir.Device && p.Type.Sharding == nil && (i >= len(weakArgs) || !weakArgs[i]) && len(p.Type.Shape) > 0 {
			ok[p] = true
		}
	}
	for _, op := range f.Body.Ops {
		xs := len(op.Args)
		if op.Code == ir.Scan {
			xs = op.Attrs.Int("num_consts") + op.Attrs.Int("num_carry")
		}
		for k, a := range op.Args {
			if !ok[a] {
				continue
			}
			if k < xs {
				delete(ok, a) // read whole, not streamed
			} else {
				uses[a]++
			}
		}
	}
	for _, r := range f.Body.Results {
		delete(ok, r)
	}
	var out []int
	for i := 0; i < n && i < len(params); i++ {
		if ok[params[i]] && uses[params[i]] > 0 {
			out = append(out, i)
		}
	}
	return out
}

// stateArgs returns the leaves of the arguments of f (traced with every
// argument on device) that are optimizer state passed in: argument i is
// donated and result i has its structure and leaf types (the new state),
// and the program reads the leaf only elementwise (as Adam's moments). The
// memory budget may place them in pinned_host: the program copies each to
// device where used, and writes the new state back to pinned_host.
func stateArgs(f *ir.Func, argDefs, outDefs []*trace.TreeDef, donated, weakArgs []bool) []int {
	params := f.Body.Params
	elementwise := func(op *ir.Op) bool {
		switch op.Code.Info().Class {
		case ir.ClassUnary, ir.ClassBinary, ir.ClassCompare:
			return true
		}
		return op.Code == ir.Select || op.Code == ir.Convert
	}
	bad := map[*ir.Value]bool{}
	used := map[*ir.Value]bool{}
	for _, op := range f.Body.Ops {
		for _, a := range op.Args {
			used[a] = true
			if !elementwise(op) {
				bad[a] = true
			}
		}
	}
	for _, r := range f.Body.Results {
		bad[r] = true
	}
	var out []int
	k, rk := 0, 0
	roff := make([]int, len(outDefs))
	for i, d := range outDefs {
		roff[i] = rk
		rk += d.NumLeaves()
	}
	for i, d := range argDefs {
		n := d.NumLeaves()
		if i < len(outDefs) && outDefs[i].String() == d.String() {
			for q := range n {
				a, r := k+q, roff[i]+q
				if a >= len(params) || r >= len(f.Body.Results) || a >= len(donated) || !donated[a] || a < len(weakArgs) && weakArgs[a] {
					continue
				}
				p := params[a]
				if p.Type.Space != ir.Device || p.Type.Sharding != nil || len(p.Type.Shape) == 0 || !used[p] || bad[p] || !f.Body.Results[r].Type.Equal(p.Type) {
					continue
				}
				out = append(out, a)
			}
		}
		k += n
	}
	return out
}
