package runtime

import (
	"sync"
	"weak"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Arguments the memory budget's planner places in pinned_host (see
// MemoryBudget): the program is traced with those parameters in
// pinned_host, and a call that passes one of them on device copies it there
// first. The copy of an argument the call does not donate is kept, with a
// weak pointer to the device array it copies, until a call passes another
// array at that place: a loop that passes the same weights each step copies
// them once. A donated one is consumed (its device buffer is freed once
// copied).

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

// replacedLeaves returns, for result i of tree structure out, which of its
// leaves replace an argument leaf hostArgs places in pinned_host (nil for
// none): result i replaces argument i when both have the same structure
// and the argument is donated (a training step's new state).
func replacedLeaves(argDefs []*trace.TreeDef, out *trace.TreeDef, i int, hostArgs, donated []bool) []bool {
	if len(hostArgs) == 0 || i >= len(argDefs) || argDefs[i].String() != out.String() {
		return nil
	}
	k := 0
	for _, d := range argDefs[:i] {
		k += d.NumLeaves()
	}
	var q []bool
	for n := range out.NumLeaves() {
		if k+n < len(hostArgs) && hostArgs[k+n] && k+n < len(donated) && donated[k+n] {
			if q == nil {
				q = make([]bool, out.NumLeaves())
			}
			q[n] = true
		}
	}
	return q
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

// hostCopies keeps the pinned_host copies of device arguments a Lowered
// made, per argument leaf: the device array they copy (weakly: the cache
// does not keep it alive) and the copy.
type hostCopies struct {
	mu   sync.Mutex
	last map[int]hostCopy
}

type hostCopy struct {
	src  weak.Pointer[trace.Array]
	host *trace.Array
}

// toHost returns argument leaf i, a device array a, copied to pinned_host
// for a program compiled with that parameter there; donated says whether
// the call donates it (then a is consumed).
func (l *Lowered) toHost(i int, a *trace.Array, donated bool) (h *trace.Array, err error) {
	defer trace.Recover(&err)
	if !donated {
		l.hostCopies.mu.Lock()
		c, ok := l.hostCopies.last[i]
		l.hostCopies.mu.Unlock()
		if ok && c.src.Value() == a {
			return c.host, nil
		}
	}
	h = trace.DevicePut(a, ir.PinnedHost)
	if donated {
		_ = a.Delete()
		return h, nil
	}
	l.hostCopies.mu.Lock()
	if l.hostCopies.last == nil {
		l.hostCopies.last = map[int]hostCopy{}
	}
	l.hostCopies.last[i] = hostCopy{src: weak.Make(a), host: h}
	l.hostCopies.mu.Unlock()
	return h, nil
}

// hostSignature returns the cache key of args with the leaves l placed in
// pinned_host there (the signature of a call that passes them as the
// program takes them: the previous step's results, say), or nil when l
// places none.
func (l *Lowered) hostSignature(args []any) []byte {
	if len(l.hostArgs) == 0 {
		return nil
	}
	leaves, defs, err := flattenArgs(args)
	if err != nil || len(leaves) != len(l.hostArgs) {
		return nil
	}
	alt := make([]*trace.Array, len(leaves))
	for i, a := range leaves {
		alt[i] = a
		if l.hostArgs[i] && a != nil {
			t := a.Type()
			t.Space = ir.PinnedHost
			alt[i] = trace.Abstract(t)
		}
	}
	return appendSignature(nil, defs, alt)
}
