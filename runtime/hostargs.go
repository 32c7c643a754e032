package runtime

import (
	"sync"
	"weak"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Arguments the memory budget's planner places in pinned_host (see
// MemoryBudget; package runtime/budget chooses them): the program is traced with those parameters in
// pinned_host, and a call that passes one of them on device copies it there
// first. The copy of an argument the call does not donate is kept, with a
// weak pointer to the device array it copies, until a call passes another
// array at that place: a loop that passes the same weights each step copies
// them once. A donated one is consumed (its device buffer is freed once
// copied).

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
