//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"slices"
)

// The fake driver's stream check. With streams on, the fake records every
// operation issued on a stream (launches, asynchronous copies, event
// records and waits, stream synchronisations) and races reports every
// pair of operations on different streams that touch a common byte, one of
// them writing, and that the recorded events and synchronisations leave
// unordered: on a GPU the later one could run before, or while, the
// earlier one. Operations are ordered by vector clocks: a stream's
// operations run in issue order; an event carries the clock of its stream
// when recorded, a wait merges it into the waiting stream's; a stream
// synchronisation merges the stream's clock into the host's, and every
// operation the host issues afterwards, on any stream, is ordered after it.

// fakeOp is one recorded stream operation with its accesses.
type fakeOp struct {
	what     string
	stream   int
	clock    []int // vector clock over streams after the op (clock[stream] numbers it)
	accesses []fakeAccess
}

type fakeAccess struct {
	p, n  uintptr
	write bool
}

// fakeStreams is the fake's record of stream operations.
type fakeStreams struct {
	index  map[uintptr]int // stream handle → lane
	clocks [][]int         // per lane
	host   []int
	events map[uintptr][]int
	ops    []fakeOp
	// sizes gives, per kernel entry, the bytes of its operands and results
	// (set by the test before checking: launches record pointers only).
	pending []fakeLaunchOp
}

type fakeLaunchOp struct {
	op   int
	name string
	args []uintptr
}

// recordStreams turns the stream record on.
func (f *fakeCUDA) recordStreams() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.streams = &fakeStreams{index: map[uintptr]int{}, events: map[uintptr][]int{}}
}

func (s *fakeStreams) lane(h uintptr) int {
	i, ok := s.index[h]
	if !ok {
		i = len(s.clocks)
		s.index[h] = i
		s.clocks = append(s.clocks, nil)
	}
	return i
}

func grow(c []int, n int) []int {
	for len(c) < n {
		c = append(c, 0)
	}
	return c
}

func merge(dst, src []int) []int {
	dst = grow(dst, len(src))
	for i, v := range src {
		dst[i] = max(dst[i], v)
	}
	return dst
}

// issue records an operation on stream h.
func (s *fakeStreams) issue(h uintptr, what string, acc ...fakeAccess) int {
	l := s.lane(h)
	c := merge(grow(s.clocks[l], len(s.clocks)), s.host)
	c[l]++
	s.clocks[l] = c
	s.ops = append(s.ops, fakeOp{what: what, stream: l, clock: slices.Clone(c), accesses: acc})
	return len(s.ops) - 1
}

// call records driver call name with arguments a (called with f.mu held).
func (s *fakeStreams) call(name string, a []uintptr) {
	switch name {
	case "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync":
		s.issue(a[3], name, fakeAccess{a[1], a[2], false}, fakeAccess{a[0], a[2], true})
	case "cuMemsetD8Async":
		s.issue(a[3], name, fakeAccess{a[0], a[2], true})
	case "cuEventRecord":
		l := s.lane(a[1])
		s.clocks[l] = merge(s.clocks[l], s.host)
		s.events[a[0]] = slices.Clone(s.clocks[l])
	case "cuStreamWaitEvent":
		l := s.lane(a[0])
		s.clocks[l] = merge(s.clocks[l], s.events[a[1]])
	case "cuStreamSynchronize":
		l := s.lane(a[0])
		s.host = merge(s.host, s.clocks[l])
	}
}

// launch records a kernel launch on stream h, its accesses resolved later.
func (s *fakeStreams) launch(h uintptr, name string, args []uintptr) {
	op := s.issue(h, name)
	s.pending = append(s.pending, fakeLaunchOp{op, name, args})
}

// races resolves the launches' accesses with kernels (entry name → its
// kernel: operand and result sizes) and returns every unordered
// conflicting pair.
func (s *fakeStreams) races(kernels map[string]*Kernel) []string {
	for _, l := range s.pending {
		k := kernels[l.name]
		if k == nil {
			return []string{fmt.Sprintf("launch of %s: unknown kernel", l.name)}
		}
		op := &s.ops[l.op]
		for i, a := range l.args {
			switch {
			case i < len(k.Params):
				op.accesses = append(op.accesses, fakeAccess{a, uintptr(k.Params[i].Bytes()), false})
			case i < len(k.Params)+len(k.Results):
				op.accesses = append(op.accesses, fakeAccess{a, uintptr(k.Results[i-len(k.Params)].Bytes()), true})
			}
		}
	}
	s.pending = nil
	var out []string
	for j := range s.ops {
		b := &s.ops[j]
		for i := range j {
			a := &s.ops[i]
			if a.stream == b.stream || (a.stream < len(b.clock) && b.clock[a.stream] >= a.clock[a.stream]) {
				continue
			}
			if conflict(a.accesses, b.accesses) {
				out = append(out, fmt.Sprintf("op %d (%s on lane %d) and op %d (%s on lane %d) are unordered", i, a.what, a.stream, j, b.what, b.stream))
			}
		}
	}
	return out
}

func conflict(x, y []fakeAccess) bool {
	for _, a := range x {
		for _, b := range y {
			if (a.write || b.write) && a.n > 0 && b.n > 0 && a.p < b.p+b.n && b.p < a.p+a.n {
				return true
			}
		}
	}
	return false
}

// kernelsOf maps every kernel entry of e (nested regions too) to its kernel.
func kernelsOf(e *executable) map[string]*Kernel {
	out := map[string]*Kernel{}
	var walk func(g *region)
	walk = func(g *region) {
		for _, s := range g.steps {
			ks := []*Kernel{s.kernel}
			if c := s.coll; c != nil {
				for _, t := range []*xpose{c.pre, c.post} {
					if t != nil {
						ks = append(ks, t.kernel)
					}
				}
			}
			for _, k := range ks {
				if k != nil {
					for _, en := range k.Entries {
						out[en.Name] = k
					}
				}
			}
			for _, sub := range s.subs {
				walk(sub)
			}
		}
	}
	walk(e.top)
	return out
}
