package bfc

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"testing"
)

// layout lists the chunks of every region as (offset, size, free) triples.
func layout[R any](a *Allocator[R]) [][3]int64 {
	var out [][3]int64
	for _, r := range a.Regions() {
		for c := r.First(); c != nil; c = c.Next() {
			f := int64(0)
			if c.IsFree() {
				f = 1
			}
			out = append(out, [3]int64{c.Off, c.Size, f})
		}
	}
	return out
}

func equalLayout(t *testing.T, got, want [][3]int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("layout %v, want %v", got, want)
		}
	}
}

// checkInvariants verifies that chunks tile their regions, that no two free
// chunks are neighbours, and that the free set holds exactly the free chunks
// in order.
func checkInvariants[R any](t *testing.T, a *Allocator[R]) {
	t.Helper()
	nfree, freeBytes, reserved := 0, int64(0), int64(0)
	for _, r := range a.regions {
		reserved += r.Size
		off := int64(0)
		var prev *Chunk[R]
		for c := r.first; c != nil; c = c.next {
			if c.Off != off || c.prev != prev || c.Region != r {
				t.Fatalf("region %d: chunk %d+%d does not follow %d", r.ID, c.Off, c.Size, off)
			}
			if c.Off%a.align != 0 || c.Size%a.align != 0 || c.Size <= 0 {
				t.Fatalf("chunk %d+%d not aligned to %d", c.Off, c.Size, a.align)
			}
			if c.free {
				nfree++
				freeBytes += c.Size
				if prev != nil && prev.free {
					t.Fatalf("free neighbours at %d not coalesced", c.Off)
				}
			}
			off += c.Size
			prev = c
		}
		if off != r.Size {
			t.Fatalf("region %d: chunks cover %d of %d bytes", r.ID, off, r.Size)
		}
	}
	if nfree != len(a.freeSet) || freeBytes != a.freeBytes || reserved != a.reserved {
		t.Fatalf("free set %d chunks %d bytes, reserved %d; walked %d, %d, %d", len(a.freeSet), a.freeBytes, a.reserved, nfree, freeBytes, reserved)
	}
	for i := 1; i < len(a.freeSet); i++ {
		if !chunkLess(a.freeSet[i-1], a.freeSet[i]) {
			t.Fatalf("free set out of order at %d", i)
		}
	}
}

func mustAlloc[R any](t *testing.T, a *Allocator[R], n int64) *Chunk[R] {
	t.Helper()
	c := a.Alloc(n)
	if c == nil {
		t.Fatalf("alloc %d failed", n)
	}
	return c
}

func fragmentation[R any](a *Allocator[R]) (int64, int64, float64) {
	largest, total, _ := a.FreeStats()
	if total == 0 {
		return largest, total, 0
	}
	return largest, total, 1 - float64(largest)/float64(total)
}

func TestSplitRoundAndCoalesce(t *testing.T) {
	a := New[struct{}](64)
	a.AddRegion(1024, struct{}{})
	c1 := mustAlloc(t, a, 100) // rounded to 128
	c2 := mustAlloc(t, a, 64)
	c3 := mustAlloc(t, a, 200) // rounded to 256
	equalLayout(t, layout(a), [][3]int64{{0, 128, 0}, {128, 64, 0}, {192, 256, 0}, {448, 576, 1}})
	a.Free(c2) // a 64-byte hole between c1 and c3
	if l, tot, f := fragmentation(a); l != 576 || tot != 640 || f < 0.1-1e-12 || f > 0.1+1e-12 {
		t.Fatalf("fragmentation %d %d %g, want 576 640 0.1", l, tot, f)
	}
	c4 := mustAlloc(t, a, 10) // best fit: the hole, not the large block
	if c4.Off != 128 {
		t.Fatalf("best fit at %d, want 128", c4.Off)
	}
	a.Free(c1)
	a.Free(c4)
	equalLayout(t, layout(a), [][3]int64{{0, 192, 1}, {192, 256, 0}, {448, 576, 1}})
	a.Free(c3)
	equalLayout(t, layout(a), [][3]int64{{0, 1024, 1}})
	a.Free(nil)
	checkInvariants(t, a)
	if c := mustAlloc(t, a, 0); c.Size != 64 {
		t.Fatalf("alloc of 0 bytes took %d, want one 64-byte unit", c.Size)
	}
}

func TestBestFitAmongHolesAndRegions(t *testing.T) {
	a := New[int](64)
	a.AddRegion(4096, 0)
	sizes := []int64{256, 64, 128, 64, 192, 64, 128}
	cs := make([]*Chunk[int], len(sizes))
	for i, s := range sizes {
		cs[i] = mustAlloc(t, a, s)
	}
	a.Free(cs[0]) // hole 256 at 0
	a.Free(cs[2]) // hole 128 at 320
	a.Free(cs[4]) // hole 192 at 512
	a.Free(cs[6]) // hole 128 at 768, merged with the rest
	checkInvariants(t, a)
	for _, w := range []struct{ n, off int64 }{{150, 512}, {100, 320}, {65, 0}, {128, 128}} {
		if c := mustAlloc(t, a, w.n); c.Off != w.off {
			t.Fatalf("alloc %d at %d, want %d", w.n, c.Off, w.off)
		}
	}
	// Equal sizes: the lowest region, then the lowest address wins.
	b := New[int](256)
	r0 := b.AddRegion(512, 7)
	r1 := b.AddRegion(512, 8)
	x := []*Chunk[int]{mustAlloc(t, b, 256), mustAlloc(t, b, 256), mustAlloc(t, b, 256), mustAlloc(t, b, 256)}
	if x[2].Region != r1 || x[2].Region.Data != 8 {
		t.Fatalf("third chunk in region %d, want 1", x[2].Region.ID)
	}
	b.Free(x[3])
	b.Free(x[1])
	if c := mustAlloc(t, b, 1); c.Region != r0 || c.Off != 256 {
		t.Fatalf("tie broken to region %d offset %d, want region 0 offset 256", c.Region.ID, c.Off)
	}
	// Entirely free regions can be removed; the others stay.
	b.Free(x[2])
	removed := b.RemoveEmptyRegions()
	if len(removed) != 1 || removed[0] != r1 || b.Reserved() != 512 || len(b.Regions()) != 1 {
		t.Fatalf("removed %d regions, reserved %d", len(removed), b.Reserved())
	}
	checkInvariants(t, b)
}

func TestFragmentedOutOfMemory(t *testing.T) {
	a := New[struct{}](64)
	a.AddRegion(512, struct{}{})
	var cs []*Chunk[struct{}]
	for range 8 {
		cs = append(cs, mustAlloc(t, a, 64))
	}
	for i := 0; i < 8; i += 2 {
		a.Free(cs[i])
	}
	largest, total, count := a.FreeStats()
	if largest != 64 || total != 256 || count != 4 {
		t.Fatalf("free stats %d %d %d, want 64 256 4", largest, total, count)
	}
	if a.Fits(128) || a.Alloc(128) != nil {
		t.Fatal("128 bytes allocated from 64-byte holes")
	}
	a.Free(cs[1]) // joins holes 0, 1, 2
	if !a.Fits(192) || mustAlloc(t, a, 192).Off != 0 {
		t.Fatal("192 bytes not at 0 after coalescing")
	}
	checkInvariants(t, a)
}

// TestRandomAgainstReference runs random allocation and free sequences over
// several regions and compares every decision with a reference model: a
// per-unit occupancy map in which the best fit is found by scanning every
// maximal free run (smallest, then lowest region and offset).
func TestRandomAgainstReference(t *testing.T) {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 3))
	for _, align := range []int64{64, 256} {
		a := New[int](align)
		var units [][]int // per region, per align unit: 0 free, else the owner id
		addRegion := func() {
			n := int64(1+r.IntN(64)) * align
			a.AddRegion(n, len(units))
			units = append(units, make([]int, n/align))
		}
		for range 3 {
			addRegion()
		}
		type live struct {
			c  *Chunk[int]
			id int
		}
		var lives []live
		nextID := 1
		for step := range 4000 {
			switch {
			case step%700 == 0:
				addRegion()
			case len(lives) > 0 && r.IntN(2) == 0:
				i := r.IntN(len(lives))
				l := lives[i]
				u := units[l.c.Region.Data]
				for k := l.c.Off / align; k < (l.c.Off+l.c.Size)/align; k++ {
					if u[k] != l.id {
						t.Fatalf("step %d: chunk %d of region %d overlaps allocation %d", step, l.c.Off, l.c.Region.ID, u[k])
					}
					u[k] = 0
				}
				a.Free(l.c)
				lives = append(lives[:i], lives[i+1:]...)
			default:
				n := int64(1 + r.IntN(int(16*align)))
				want := n/align + min(n%align, 1) // units
				// Reference best fit over the maximal free runs.
				bestReg, bestOff, bestLen := -1, int64(0), int64(0)
				for ri, u := range units {
					for k := 0; k < len(u); {
						if u[k] != 0 {
							k++
							continue
						}
						e := k
						for e < len(u) && u[e] == 0 {
							e++
						}
						if l := int64(e - k); l >= want && (bestReg < 0 || l < bestLen) {
							bestReg, bestOff, bestLen = ri, int64(k), l
						}
						k = e
					}
				}
				c := a.Alloc(n)
				if bestReg < 0 {
					if c != nil {
						t.Fatalf("step %d: allocated %d bytes where the reference finds no room", step, n)
					}
					continue
				}
				if c == nil || c.Region.Data != bestReg || c.Off != bestOff*align || c.Size != want*align {
					t.Fatalf("step %d: alloc %d gave %+v, reference region %d offset %d", step, n, c, bestReg, bestOff*align)
				}
				for k := bestOff; k < bestOff+want; k++ {
					units[bestReg][k] = nextID
				}
				lives = append(lives, live{c, nextID})
				nextID++
			}
			if step%50 == 0 {
				checkInvariants(t, a)
				// Fragmentation figures match the reference's free runs.
				var largest, total int64
				for _, u := range units {
					run := int64(0)
					for _, o := range u {
						if o == 0 {
							run++
							total++
							largest = max(largest, run)
						} else {
							run = 0
						}
					}
				}
				gl, gt, _ := a.FreeStats()
				if gl != largest*align || gt != total*align {
					t.Fatalf("step %d: free stats %d/%d, reference %d/%d", step, gl, gt, largest*align, total*align)
				}
			}
		}
		for _, l := range lives {
			a.Free(l.c)
		}
		checkInvariants(t, a)
		if len(a.RemoveEmptyRegions()) != len(units) || a.Reserved() != 0 {
			t.Fatalf("not every region came back empty")
		}
	}
}
