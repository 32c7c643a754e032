package ledger_test

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/backend/ledger"
	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

// rec is a backend's record as a backend would write it: the entry and
// what its allocator needs.
type rec struct {
	ledger.Entry[rec]
	pool int // what the backend's allocator needs
}

type testLedger = ledger.Ledger[rec, *rec]

// late embeds the entry after a field of its own, which the ledger refuses.
type late struct {
	n int
	ledger.Entry[late]
}

// A record type whose entry is not its first field makes New panic rather
// than misread the records.
func TestLedgerWantsEntryFirst(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New of a record with its entry second did not panic")
		}
	}()
	var l ledger.Ledger[late, *late]
	l.New()
}

// modelAlloc is the model's view of one live allocation.
type modelAlloc struct {
	r           *rec
	bytes, held int64
	addr        uintptr
	born        int64
	space       ir.MemorySpace
	what        string
	isArray     bool
}

// model is the plain accounting the ledger must agree with: a list of
// live allocations and running counts per space.
type model struct {
	live                   []modelAlloc
	inUse, peak, numAllocs [2]int64
}

func (m *model) sorted(keep func(modelAlloc) bool) []modelAlloc {
	var out []modelAlloc
	for _, a := range m.live {
		if keep(a) {
			out = append(out, a)
		}
	}
	slices.SortStableFunc(out, func(a, b modelAlloc) int {
		switch {
		case a.bytes != b.bytes:
			return -cmp.Compare(a.bytes, b.bytes)
		case a.born != b.born:
			return cmp.Compare(a.born, b.born)
		}
		return cmp.Compare(a.addr, b.addr)
	})
	return out
}

// check compares every figure and list of l with m.
func check(t *testing.T, step int, l *testLedger, m *model) {
	t.Helper()
	for _, sp := range ir.AllSpaces {
		n := int64(0)
		for _, a := range m.live {
			if a.space == sp {
				n++
			}
		}
		want := backend.MemStats{Platform: "test", Device: 3, Space: sp, BytesInUse: m.inUse[sp], PeakBytesInUse: m.peak[sp],
			NumAllocs: m.numAllocs[sp], LiveAllocs: n}
		if got := l.Stats(sp); got != want {
			t.Fatalf("step %d: Stats(%v) = %+v, want %+v", step, sp, got, want)
		}
		if l.InUse(sp) != m.inUse[sp] || l.Peak(sp) != m.peak[sp] {
			t.Fatalf("step %d: InUse, Peak(%v) = %d, %d; want %d, %d", step, sp, l.InUse(sp), l.Peak(sp), m.inUse[sp], m.peak[sp])
		}
	}
	if l.Len() != len(m.live) {
		t.Fatalf("step %d: Len = %d, want %d", step, l.Len(), len(m.live))
	}
	if l.Spare() > ledger.MaxSpare {
		t.Fatalf("step %d: %d spare records, at most %d", step, l.Spare(), ledger.MaxSpare)
	}
	for _, a := range m.live {
		if got := l.Find(a.addr); got != a.r {
			t.Fatalf("step %d: Find(%#x) = %p, want %p", step, a.addr, got, a.r)
		}
	}
	all := m.sorted(func(modelAlloc) bool { return true })
	allocs := l.Allocations(nil)
	if len(allocs) != len(all) {
		t.Fatalf("step %d: %d allocations, want %d", step, len(allocs), len(all))
	}
	for i, a := range allocs {
		w := all[i]
		if a.Platform != "test" || a.Device != 3 || a.Space != w.space || a.Bytes != w.bytes || a.What != w.what ||
			a.IsArray != w.isArray || !a.Born.Equal(w.r.BornTime()) {
			t.Fatalf("step %d: allocation %d = %+v, want %+v", step, i, a, w)
		}
	}
	arrays := m.sorted(func(a modelAlloc) bool { return a.isArray })
	largest := l.Largest(-1, true)
	if len(largest) != len(arrays) {
		t.Fatalf("step %d: %d live arrays, want %d", step, len(largest), len(arrays))
	}
	for i, a := range largest {
		if a.Bytes != arrays[i].bytes || a.Space != arrays[i].space || !a.IsArray {
			t.Fatalf("step %d: live array %d = %+v, want %+v", step, i, a, arrays[i])
		}
	}
	if n := min(len(all), 3); len(l.Largest(3, false)) != n {
		t.Fatalf("step %d: Largest(3) lists %d, want %d", step, len(l.Largest(3, false)), n)
	}
}

// Random allocations and frees in both spaces, reused and not, indexed by
// address or not, against the model: every figure, list and lookup agrees
// after each step, peaks reset when asked, and the spare records stay
// bounded.
func TestLedgerAgainstModel(t *testing.T) {
	for _, indexed := range []bool{false, true} {
		t.Run(fmt.Sprintf("indexed=%v", indexed), func(t *testing.T) {
			rng := testseed.Rand(t, 1)
			l := &testLedger{Platform: "test", Device: 3, Indexed: indexed}
			m := &model{}
			addr, born := uintptr(0x1000), int64(0)
			for step := range 1200 {
				switch op := rng.IntN(10); {
				case op < 5 || len(m.live) == 0:
					r := l.New()
					if r.Bytes != 0 || r.What != "" || r.IsArray || r.Held != 0 {
						t.Fatalf("step %d: New returned a record not zeroed: %+v", step, r)
					}
					// Sizes repeat and births tie so that the order's every key matters.
					a := modelAlloc{r: r, bytes: int64(1 + rng.IntN(8)*64), addr: addr, born: born / 3,
						space: ir.AllSpaces[rng.IntN(2)], what: fmt.Sprintf("buffer %d", step)}
					a.held = (a.bytes + 255) &^ 255
					addr += uintptr(1 + rng.IntN(4096))
					born++
					r.Bytes, r.Addr, r.What, r.Born, r.Reuse, r.Held = a.bytes, a.addr, a.what, a.born, rng.IntN(2) == 0, a.held
					l.Add(r, a.space)
					m.live = append(m.live, a)
					m.inUse[a.space] += a.held
					m.peak[a.space] = max(m.peak[a.space], m.inUse[a.space])
					m.numAllocs[a.space]++
				case op < 6:
					i := rng.IntN(len(m.live))
					m.live[i].r.MarkArray(ir.TypeOf(ir.Float32, int(m.live[i].bytes)), "")
					m.live[i].isArray = true
				case op < 7:
					l.ResetPeak()
					m.peak = m.inUse
				default:
					i := rng.IntN(len(m.live))
					a := m.live[i]
					if !l.Forget(a.r) {
						t.Fatalf("step %d: Forget of a live record reports it was not live", step)
					}
					if l.Forget(a.r) {
						t.Fatalf("step %d: a second Forget reports a live record", step)
					}
					m.live = slices.Delete(m.live, i, i+1)
					m.inUse[a.space] -= a.held
				}
				check(t, step, l, m)
			}
			for _, a := range m.live {
				l.Forget(a.r)
			}
			if l.Len() != 0 || l.InUse(ir.Device) != 0 || l.InUse(ir.PinnedHost) != 0 {
				t.Fatalf("after forgetting everything: %d live, %d + %d bytes in use", l.Len(), l.InUse(ir.Device), l.InUse(ir.PinnedHost))
			}
		})
	}
}

// Largest first, then oldest first, then lowest address first; the live
// records iterate newest first.
func TestLedgerOrder(t *testing.T) {
	l := &testLedger{Platform: "test"}
	add := func(bytes int64, born int64, addr uintptr) *rec {
		r := l.New()
		r.Bytes, r.Born, r.Addr, r.Held, r.What = bytes, born, addr, bytes, fmt.Sprint(addr)
		l.Add(r, ir.Device)
		return r
	}
	add(100, 5, 0x30)
	add(200, 9, 0x40)
	add(100, 2, 0x50)
	add(100, 5, 0x10)
	var whats []string
	for _, a := range l.Allocations(nil) {
		whats = append(whats, a.What)
	}
	if want := []string{"64", "80", "16", "48"}; !slices.Equal(whats, want) {
		t.Fatalf("allocations in order %v, want %v", whats, want)
	}
	var addrs []uintptr
	for r := range l.All() {
		addrs = append(addrs, r.Addr)
	}
	if want := []uintptr{0x10, 0x50, 0x40, 0x30}; !slices.Equal(addrs, want) {
		t.Fatalf("All yields %#x, want newest first %#x", addrs, want)
	}
}

// Forgotten records with Reuse are recycled (up to MaxSpare) and a cycle
// of New, Add and Forget then allocates nothing; records without Reuse
// are not recycled and stay as they were, not live.
func TestLedgerRecycles(t *testing.T) {
	l := &testLedger{Platform: "test"}
	var rs []*rec
	for i := range ledger.MaxSpare + 10 {
		r := l.New()
		r.Bytes, r.Held, r.Addr, r.Reuse = 64, 64, uintptr(i+1), true
		l.Add(r, ir.PinnedHost)
		rs = append(rs, r)
	}
	for _, r := range rs {
		l.Forget(r)
	}
	if l.Spare() != ledger.MaxSpare {
		t.Fatalf("%d spare records, want %d", l.Spare(), ledger.MaxSpare)
	}
	if n := testing.AllocsPerRun(100, func() {
		r := l.New()
		r.Bytes, r.Held, r.Addr, r.Reuse = 64, 64, 1, true
		l.Add(r, ir.Device)
		l.Forget(r)
	}); n != 0 {
		t.Fatalf("a recycled allocation allocates %v times", n)
	}
	kept := l.New()
	kept.Bytes, kept.Held, kept.What = 10, 16, "kept"
	l.Add(kept, ir.Device)
	l.Forget(kept)
	if kept.What != "kept" || kept.Bytes != 10 || l.Forget(kept) || l.Forget(nil) {
		t.Fatalf("a record without Reuse was recycled or forgotten twice: %+v", kept)
	}
	if s := l.Stats(ir.Device); s.NumAllocs != 102 || s.BytesInUse != 0 || s.PeakBytesInUse != 64 {
		t.Fatalf("device stats %+v", s)
	}
}

// The out-of-memory report copies the statistics, lists at most ten of
// the largest buffers of the failed space only (types copied), and says
// fragmentation as backend.NewOutOfMemoryError does.
func TestLedgerOutOfMemory(t *testing.T) {
	l := &testLedger{Platform: "test", Device: 1}
	shape := ir.Shape{4}
	for i := range 14 {
		r := l.New()
		r.Bytes, r.Held, r.Addr, r.Born, r.What = int64(100*(i+1)), int64(128*(i+1)), uintptr(i), int64(i), "scratch"
		l.Add(r, ir.AllSpaces[i%2])
		if i == 12 {
			r.MarkArray(ir.Type{DType: ir.Float32, Shape: shape}, "x.go:7")
		}
	}
	s := l.Stats(ir.Device)
	s.Allocator, s.Limit, s.Reserved, s.LargestFreeBlock, s.FreeBytes, s.FreeBlocks = "bfc", 1<<20, 1<<20, 500, 900, 3
	e := l.OutOfMemory(s, 600, "temp arena", "")
	if e.Platform != "test" || e.Device != 1 || e.Space != ir.Device || e.Requested != 600 || e.What != "temp arena" ||
		e.InUse != s.BytesInUse || e.LiveAllocs != 7 || e.Limit != 1<<20 || e.FreeBytes != 900 || e.FreeBlocks != 3 || !e.Fragmented {
		t.Fatalf("report %+v", e)
	}
	if len(e.Largest) != 7 || e.Largest[0].Bytes != 1300 || !e.Largest[0].IsArray || e.Largest[0].Site != "x.go:7" {
		t.Fatalf("largest %+v", e.Largest)
	}
	for _, a := range e.Largest {
		if a.Space != ir.Device {
			t.Fatalf("a %v buffer listed for device memory", a.Space)
		}
	}
	e.Largest[0].Type.Shape[0] = 99
	if shape[0] != 4 {
		t.Fatal("the report shares the record's shape")
	}
	for range 10 {
		r := l.New()
		r.Bytes, r.Held, r.Addr = 1, 1, 1000
		l.Add(r, ir.Device)
	}
	e = l.OutOfMemory(l.Stats(ir.Device), 10, "x", "the machine is short")
	if len(e.Largest) != backend.MaxOOMBuffers || e.Fragmented || !strings.Contains(e.Error(), "the machine is short") {
		t.Fatalf("report %+v", e)
	}
}

// Reports use at most Depth program counters of a stack, find the site in
// them, and keep a site MarkArray gave.
func TestLedgerStacks(t *testing.T) {
	deep := func() *callers.Stack {
		var f func(int) *callers.Stack
		f = func(n int) *callers.Stack {
			if n == 0 {
				return callers.Record(1)
			}
			return f(n - 1)
		}
		return f(40)
	}
	st := deep()
	for _, depth := range []int{0, 32} {
		l := &testLedger{Platform: "test", Depth: depth}
		r := l.New()
		r.Bytes, r.Held, r.Stack, r.Born = 8, 8, st, ledger.Now()
		l.Add(r, ir.Device)
		pcs := st.PCs
		if depth > 0 {
			pcs = pcs[:depth]
		}
		a := l.Allocations(nil)[0]
		if !slices.Equal(a.PCs, pcs) || a.Site != backend.UserSite(pcs) || !strings.Contains(a.Site, "ledger_test.go:") {
			t.Fatalf("depth %d: %d PCs, site %q; want %d, %q", depth, len(a.PCs), a.Site, len(pcs), backend.UserSite(pcs))
		}
		if age := l.Largest(1, false)[0].Age; age < 0 || age > time.Minute {
			t.Fatalf("age %v", age)
		}
		r.MarkArray(ir.TypeOf(ir.Uint8, 8), "y.go:3")
		if a := l.Allocations(nil)[0]; a.Site != "y.go:3" || !a.IsArray || a.Type.String() != ir.TypeOf(ir.Uint8, 8).String() {
			t.Fatalf("after MarkArray: %+v", a)
		}
	}
	l := &testLedger{}
	r := l.New()
	l.Add(r, ir.Device)
	if a := l.Allocations(nil)[0]; a.PCs != nil || a.Site != "?" {
		t.Fatalf("no stack: PCs %v, site %q", a.PCs, a.Site)
	}
}
