package collective

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryml/ferry/ir"
)

// layouts are the (processes, devices per process) of the hybrid worlds
// tested.
var layouts = [][2]int{{2, 1}, {2, 2}, {2, 4}, {4, 2}, {1, 4}}

// hybridWorld returns the P·k ranks of a Hybrid world, in world rank order,
// over P goroutine "processes" connected by NewLocal(P), and those processes'
// communicators.
func hybridWorld(t testing.TB, np, k int) ([]*Hybrid, []*Local) {
	t.Helper()
	procs, err := NewLocal(np)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	world := make([]*Hybrid, np*k)
	errs := make([]error, np)
	var wg sync.WaitGroup
	for p := range np {
		wg.Go(func() {
			hs, err := NewHybrid(ctx, procs[p], k)
			errs[p] = err
			copy(world[p*k:], hs)
		})
	}
	wg.Wait()
	for p, err := range errs {
		if err != nil {
			t.Fatalf("NewHybrid in process %d: %v", p, err)
		}
	}
	for r, c := range world {
		if c.Rank() != r || c.Size() != np*k {
			t.Fatalf("world[%d] is rank %d of %d, want rank %d of %d", r, c.Rank(), c.Size(), r, np*k)
		}
	}
	return world, procs
}

// runCase runs call on every rank of cs with a copy of in[rank] and returns
// the ranks' results.
func runCase(cs []Communicator, in [][]byte, call func(ctx context.Context, c Communicator, buf []byte) ([]byte, error)) ([][]byte, []error) {
	out := make([][]byte, len(cs))
	errs := runOn(cs, func(ctx context.Context, c Communicator) error {
		buf := alloc(len(in[c.Rank()]))
		copy(buf, in[c.Rank()])
		var err error
		out[c.Rank()], err = call(ctx, c, buf)
		return err
	})
	return out, errs
}

// TestHybridMatchesLocal runs every collective on random inputs on Hybrid
// worlds of several layouts and on Local worlds of the same size, and wants
// the same bits on every rank (and, for AllReduce, the documented rank-order
// fold computed by the test).
func TestHybridMatchesLocal(t *testing.T) {
	r := newRand(t)
	for _, lay := range layouts {
		np, k := lay[0], lay[1]
		n := np * k
		t.Run(fmt.Sprintf("%dx%d", np, k), func(t *testing.T) {
			hyb, _ := hybridWorld(t, np, k)
			loc, err := NewLocal(n)
			if err != nil {
				t.Fatal(err)
			}
			engines := [][]Communicator{asComms(loc), asComms(hyb)}
			compare := func(name string, in [][]byte, call func(ctx context.Context, c Communicator, buf []byte) ([]byte, error)) [][]byte {
				t.Helper()
				var want [][]byte
				for e, cs := range engines {
					got, errs := runCase(cs, in, call)
					noErrors(t, errs)
					if e == 0 {
						want = got
						continue
					}
					for rank := range n {
						if !bytes.Equal(got[rank], want[rank]) {
							t.Fatalf("%s: rank %d's result differs from Local's", name, rank)
						}
					}
				}
				return want
			}
			inputs := func(dt ir.DType, elems int) [][]byte {
				in := make([][]byte, n)
				for rank := range in {
					in[rank] = alloc(elems * dt.Size())
					fill(r, dt, in[rank])
				}
				return in
			}
			for _, dt := range ir.AllDTypes {
				for op := Sum; op <= Min; op++ {
					count := r.IntN(2*tile + 200) // more than one tile
					if r.IntN(5) == 0 {
						count = r.IntN(4)
					}
					inPlace := r.IntN(2) == 0
					in := inputs(dt, count)
					got := compare(fmt.Sprintf("AllReduce(%v, %v[%d], in place %v)", op, dt, count, inPlace), in,
						func(ctx context.Context, c Communicator, buf []byte) ([]byte, error) {
							recv := buf
							if !inPlace {
								recv = alloc(len(buf))
							}
							return recv, c.AllReduce(ctx, op, dt, buf, recv)
						})
					for i := range count {
						if g, w := bitsAt(dt, got[0], i), expectBits(dt, op, in, i); g != w {
							t.Fatalf("AllReduce(%v, %v) element %d: bits %#x, want %#x", op, dt, i, g, w)
						}
					}

					shape, axis := randShape(r, n)
					compare(fmt.Sprintf("ReduceScatter(%v, %v%v, axis %d)", op, dt, shape, axis), inputs(dt, numel(shape)),
						func(ctx context.Context, c Communicator, buf []byte) ([]byte, error) {
							recv := alloc(len(buf) / n)
							return recv, c.ReduceScatter(ctx, op, dt, shape, axis, buf, recv)
						})
				}

				shape, axis := randShape(r, 1)
				if r.IntN(4) == 0 {
					shape, axis = nil, 0
				}
				elems := numel(shape)
				if shape == nil {
					elems = r.IntN(50)
				}
				compare(fmt.Sprintf("AllGather(%v%v, axis %d)", dt, shape, axis), inputs(dt, elems),
					func(ctx context.Context, c Communicator, buf []byte) ([]byte, error) {
						recv := alloc(n * len(buf))
						return recv, c.AllGather(ctx, dt, shape, axis, buf, recv)
					})

				shape, split := randShape(r, n)
				concat := r.IntN(len(shape))
				compare(fmt.Sprintf("AllToAll(%v%v, %d, %d)", dt, shape, split, concat), inputs(dt, numel(shape)),
					func(ctx context.Context, c Communicator, buf []byte) ([]byte, error) {
						recv := alloc(len(buf))
						return recv, c.AllToAll(ctx, dt, shape, split, concat, buf, recv)
					})

				var pairs []Pair
				for s, tg := range r.Perm(n) {
					if r.IntN(3) > 0 {
						pairs = append(pairs, Pair{s, tg})
					}
				}
				count := r.IntN(100)
				compare(fmt.Sprintf("CollectivePermute(%v[%d], %v)", dt, count, pairs), inputs(dt, count),
					func(ctx context.Context, c Communicator, buf []byte) ([]byte, error) {
						recv := alloc(len(buf))
						for i := range recv {
							recv[i] = 0xAB // overwritten with zeros or data
						}
						return recv, c.CollectivePermute(ctx, dt, pairs, buf, recv)
					})

				root := r.IntN(n)
				compare(fmt.Sprintf("Broadcast(%v, root %d)", dt, root), inputs(dt, r.IntN(300)),
					func(ctx context.Context, c Communicator, buf []byte) ([]byte, error) {
						return buf, c.Broadcast(ctx, dt, root, buf)
					})
			}
			compare("Barrier", inputs(ir.Float32, 0), func(ctx context.Context, c Communicator, buf []byte) ([]byte, error) {
				return nil, c.Barrier(ctx)
			})
		})
	}
}

// TestHybridHalfAccumulatesInFloat32 repeats TestHalfAccumulatesInFloat32
// with the ranks in 4 processes of 2 devices.
func TestHybridHalfAccumulatesInFloat32(t *testing.T) {
	world, _ := hybridWorld(t, 4, 2)
	in := make([][]byte, 8)
	for k := range in {
		v := ir.BF16FromFloat64(1)
		if k == 0 {
			v = ir.BF16FromFloat64(256)
		}
		in[k] = alloc(2)
		in[k][0], in[k][1] = byte(v), byte(v>>8)
	}
	got, errs := runCase(asComms(world), in, func(ctx context.Context, c Communicator, buf []byte) ([]byte, error) {
		recv := alloc(2)
		return recv, c.AllReduce(ctx, Sum, ir.BFloat16, buf, recv)
	})
	noErrors(t, errs)
	for k := range got {
		if v := get(ir.BFloat16, got[k], 0); v != 264 {
			t.Fatalf("rank %d: bf16 sum = %v, want 264", k, v)
		}
	}
}

// TestHybridMeshAxes splits 8 devices in 2 processes of 4 or 4 of 2 along the
// axes of 2×4 and 4×2 meshes, groups that span processes or stay inside one,
// and wants Local's groups and a correct sum over each.
func TestHybridMeshAxes(t *testing.T) {
	axesCases := [][]int{{0}, {1}, {0, 1}, {1, 0}, {}}
	for _, lay := range [][2]int{{2, 4}, {4, 2}} {
		world, _ := hybridWorld(t, lay[0], lay[1])
		loc, err := NewLocal(8)
		if err != nil {
			t.Fatal(err)
		}
		for _, mesh := range [][]int{{2, 4}, {4, 2}} {
			for _, axes := range axesCases {
				name := fmt.Sprintf("%dx%d processes, mesh %v, axes %v", lay[0], lay[1], mesh, axes)
				group := func(ctx context.Context, c Communicator) ([]int32, Communicator, error) {
					sub, err := MeshAxes(ctx, c, mesh, axes...)
					if err != nil {
						return nil, nil, err
					}
					got, err := members(ctx, sub, int32(c.Rank()))
					return got, sub, err
				}
				want := make([][]int32, 8)
				noErrors(t, runOn(asComms(loc), func(ctx context.Context, c Communicator) (err error) {
					want[c.Rank()], _, err = group(ctx, c)
					return err
				}))
				noErrors(t, runOn(asComms(world), func(ctx context.Context, c Communicator) error {
					got, sub, err := group(ctx, c)
					if err != nil {
						return err
					}
					if !slices.Equal(got, want[c.Rank()]) {
						return fmt.Errorf("%s: rank %d's group %v, Local's %v", name, c.Rank(), got, want[c.Rank()])
					}
					// The group's processes communicator holds exactly the
					// processes of its members.
					var ps []int32
					for _, m := range got {
						ps = append(ps, m/int32(lay[1]))
					}
					slices.Sort(ps)
					if np := len(slices.Compact(ps)); sub.(*Hybrid).g.procs.Size() != np {
						return fmt.Errorf("%s: group %v has a processes communicator of %d, want %d", name, got, sub.(*Hybrid).g.procs.Size(), np)
					}
					sum := alloc(4)
					if err := sub.AllReduce(ctx, Sum, ir.Int32, int32s(int32(c.Rank())), sum); err != nil {
						return err
					}
					var w int32
					for _, m := range got {
						w += m
					}
					if s := readInt32s(sum)[0]; s != w {
						return fmt.Errorf("%s: sum %d, want %d", name, s, w)
					}
					return sub.Close()
				}))
			}
		}
	}
}

// TestHybridSplit runs the split scenarios of the Local tests on hybrid
// worlds: nested splits, Undefined colors, two streams on a duplicate, and a
// long interleaving of collectives over the world and sub-groups.
func TestHybridSplit(t *testing.T) {
	for _, lay := range [][2]int{{2, 4}, {4, 2}} {
		world, _ := hybridWorld(t, lay[0], lay[1])
		noErrors(t, runOn(asComms(world), splitNesting))
	}
	for _, lay := range [][2]int{{2, 2}, {4, 1}, {1, 4}} {
		world, _ := hybridWorld(t, lay[0], lay[1])
		noErrors(t, runOn(asComms(world), splitUndefined))
		noErrors(t, runOn(asComms(world), twoStreams))
		seed := testseed.Uint64(t)
		t.Logf("%v: interleaved seed %d", lay, seed)
		noErrors(t, runOn(asComms(world), func(ctx context.Context, c Communicator) error {
			return interleaved(ctx, c, seed, 100)
		}))
	}
}

// TestHybridErrors runs the mismatched and invalid calls of the Local tests
// on hybrid worlds of 4 ranks and wants Local's errors, word for word, and a
// usable group afterwards.
func TestHybridErrors(t *testing.T) {
	loc, err := NewLocal(4)
	if err != nil {
		t.Fatal(err)
	}
	for _, lay := range [][2]int{{2, 2}, {4, 1}, {1, 4}} {
		world, _ := hybridWorld(t, lay[0], lay[1])
		for _, target := range []error{ErrMismatch, ErrInvalid} {
			cases := mismatchCases()
			if target == ErrInvalid {
				cases = invalidCases()
			}
			for _, tc := range cases {
				t.Run(fmt.Sprintf("%dx%d/%s", lay[0], lay[1], tc.name), func(t *testing.T) {
					want := runOn(asComms(loc), tc.call)
					got := runOn(asComms(world), tc.call)
					expectAll(t, got, target, tc.words...)
					for r := range got {
						if got[r].Error() != want[r].Error() {
							t.Fatalf("rank %d: error %q, Local's %q", r, got[r], want[r])
						}
					}
					stillWorks(t, world)
				})
			}
		}
	}
}

// TestHybridAbort: a device of process 1 aborts while the others wait in a
// barrier; every rank's call fails with its cause, in both processes, and so
// do later calls on the world, on a sub-group and on the processes'
// communicators.
func TestHybridAbort(t *testing.T) {
	world, procs := hybridWorld(t, 2, 2)
	halves := make([]Communicator, 4)
	noErrors(t, runOn(asComms(world), func(ctx context.Context, c Communicator) (err error) {
		halves[c.Rank()], err = c.Split(ctx, c.Rank()%2, 0) // groups across the processes
		return err
	}))
	cause := errors.New("device 3 fell over")
	errs := runOn(asComms(world), func(ctx context.Context, c Communicator) error {
		if c.Rank() == 3 {
			c.Abort(cause)
			return c.Barrier(ctx)
		}
		return c.Barrier(ctx)
	})
	expectAll(t, errs, ErrAborted, "device 3 fell over")
	expectAll(t, errs, cause)
	expectAll(t, runOn(halves, func(ctx context.Context, c Communicator) error {
		return c.AllReduce(ctx, Sum, ir.Int32, int32s(1), alloc(4))
	}), ErrAborted, "device 3 fell over")
	expectAll(t, runOn(procs, func(ctx context.Context, c *Local) error { return c.Barrier(ctx) }), ErrAborted, "device 3 fell over")
}

// TestHybridAbortFromSubgroup: aborting a sub-group made by Split fails the
// world in every process.
func TestHybridAbortFromSubgroup(t *testing.T) {
	world, _ := hybridWorld(t, 2, 2)
	errs := runOn(asComms(world), func(ctx context.Context, c Communicator) error {
		sub, err := c.Split(ctx, c.Rank()/2, 0) // one group per process
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			sub.Abort(errors.New("stop"))
		}
		return c.Barrier(ctx)
	})
	expectAll(t, errs, ErrAborted, "stop")
}

// TestHybridTimeoutAborts: rank 3 never arrives; the others, in both
// processes, give up when their context ends.
func TestHybridTimeoutAborts(t *testing.T) {
	world, _ := hybridWorld(t, 2, 2)
	errs := runOn(world[:3], func(_ context.Context, c *Hybrid) error {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return c.AllReduce(ctx, Sum, ir.Float32, alloc(16), alloc(16))
	})
	expectAll(t, errs, ErrAborted, "gave up in AllReduce")
	expectAll(t, errs, context.DeadlineExceeded)
	expectAll(t, runOn(world, func(ctx context.Context, c *Hybrid) error { return c.Barrier(ctx) }), ErrAborted)
}

// TestNewHybridErrors: processes that disagree on the device count, or pass
// none, all get the same error.
func TestNewHybridErrors(t *testing.T) {
	for _, tc := range []struct {
		ks     []int
		target error
		words  string
	}{
		{[]int{2, 2, 3}, ErrMismatch, "process 2 has 3"},
		{[]int{2, 0, 2}, ErrInvalid, "process 1 has 0 local devices"},
	} {
		procs, err := NewLocal(len(tc.ks))
		if err != nil {
			t.Fatal(err)
		}
		expectAll(t, runOn(procs, func(ctx context.Context, c *Local) error {
			_, err := NewHybrid(ctx, c, tc.ks[c.Rank()])
			return err
		}), tc.target, tc.words)
	}
	if _, err := NewHybrid(context.Background(), nil, 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("NewHybrid(nil): %v", err)
	}
}

// TestHybridClose: a closed rank fails with ErrClosed; a split group's
// processes communicator is closed with the process's last member of the
// group.
func TestHybridClose(t *testing.T) {
	world, _ := hybridWorld(t, 2, 2)
	dups := make([]*Hybrid, 4)
	noErrors(t, runOn(world, func(ctx context.Context, c *Hybrid) error {
		dup, err := c.Split(ctx, 0, c.Rank())
		if err == nil {
			dups[c.Rank()] = dup.(*Hybrid)
		}
		return err
	}))
	procs := dups[0].g.procs.(*Local) // process 0's, used by ranks 0 and 1
	if err := dups[0].Close(); err != nil {
		t.Fatal(err)
	}
	if procs.closed {
		t.Fatal("process 0's communicator of the group was closed while rank 1 still uses it")
	}
	if err := dups[0].Barrier(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Barrier after Close: %v", err)
	}
	for _, d := range dups[1:] {
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if !procs.closed {
		t.Fatal("process 0's communicator of the group is still open after ranks 0 and 1 closed")
	}
}

func TestHybridConcurrentUseOfOneRank(t *testing.T) {
	world, _ := hybridWorld(t, 1, 2)
	done := make(chan error)
	go func() { done <- world[0].Barrier(context.Background()) }()
	for !world[0].busy.Load() {
		runtime.Gosched()
	}
	if err := world[0].Barrier(context.Background()); err == nil || !strings.Contains(err.Error(), "already in a call") {
		t.Fatalf("second call on a busy rank: %v", err)
	}
	if err := world[1].Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// cIntColors is a processes communicator that records Split colors that do
// not fit a C int (MPI_Comm_split's), and otherwise is Local's.
type cIntColors struct {
	Communicator
	bad *atomic.Int64
}

func (c cIntColors) Split(ctx context.Context, color, key int) (Communicator, error) {
	if color > math.MaxInt32 || key > math.MaxInt32 {
		c.bad.Store(int64(color))
	}
	sub, err := c.Communicator.Split(ctx, color, key)
	if sub == nil {
		return nil, err
	}
	return cIntColors{sub, c.bad}, err
}

// TestHybridLargeColors: Split colors are the user's ints; the processes
// communicator gets small ones.
func TestHybridLargeColors(t *testing.T) {
	procs, err := NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	var bad atomic.Int64
	world := make([]Communicator, 4)
	noErrors(t, runOn(procs, func(ctx context.Context, c *Local) error {
		hs, err := NewHybrid(ctx, cIntColors{c, &bad}, 2)
		for d, h := range hs {
			world[2*c.Rank()+d] = h
		}
		return err
	}))
	noErrors(t, runOn(world, func(ctx context.Context, c Communicator) error {
		sub, err := c.Split(ctx, (c.Rank()%2)<<40, -c.Rank())
		if err != nil {
			return err
		}
		got, err := members(ctx, sub, int32(c.Rank()))
		if want := []int32{int32(2 + c.Rank()%2), int32(c.Rank() % 2)}; err == nil && !slices.Equal(got, want) {
			return fmt.Errorf("group %v, want %v", got, want)
		}
		return err
	}))
	if b := bad.Load(); b != 0 {
		t.Fatalf("the processes communicator was split with color %d", b)
	}
}

// TestHybridKeepsNoBuffer: once every local member has its result, the
// process's gathered buffer is no longer referenced by the group.
func TestHybridKeepsNoBuffer(t *testing.T) {
	world, _ := hybridWorld(t, 2, 2)
	noErrors(t, runOn(world, func(ctx context.Context, c *Hybrid) error {
		return c.AllReduce(ctx, Sum, ir.Float32, alloc(1<<16), alloc(1<<16))
	}))
	for _, c := range world {
		if c.g.out != nil {
			t.Fatalf("rank %d's group still holds a gathered buffer of %d bytes", c.Rank(), len(c.g.out))
		}
	}
}

// TestHybridRandomSplits splits hybrid worlds with random colors (Undefined
// included) and keys, so that groups hold different numbers of devices in
// different processes in interleaved order, splits the groups again, and
// wants Local's members and all-reduce bits on every group.
func TestHybridRandomSplits(t *testing.T) {
	r := newRand(t)
	for _, lay := range [][2]int{{2, 4}, {4, 2}, {3, 3}} {
		n := lay[0] * lay[1]
		hyb, _ := hybridWorld(t, lay[0], lay[1])
		loc, err := NewLocal(n)
		if err != nil {
			t.Fatal(err)
		}
		for trial := range 4 {
			colors, keys, colors2 := make([]int, n), make([]int, n), make([]int, n)
			for i := range n {
				colors[i], keys[i], colors2[i] = r.IntN(4)-1, r.IntN(5)-2, r.IntN(2)
			}
			count := 1 + r.IntN(300)
			in := make([][]byte, n)
			for i := range in {
				in[i] = alloc(4 * count)
				fill(r, ir.Float32, in[i])
			}
			// Each rank's results: its group's members, its subgroup's
			// members, and the sum over its group.
			results := func(cs []Communicator) [][]byte {
				out := make([][]byte, n)
				noErrors(t, runOn(cs, func(ctx context.Context, c Communicator) error {
					me := c.Rank()
					sub, err := c.Split(ctx, colors[me], keys[me])
					if err != nil || sub == nil {
						return err
					}
					ms, err := members(ctx, sub, int32(me))
					if err != nil {
						return err
					}
					sub2, err := sub.Split(ctx, colors2[me], -sub.Rank())
					if err != nil {
						return err
					}
					ms2, err := members(ctx, sub2, int32(me))
					if err != nil {
						return err
					}
					sum := alloc(4 * count)
					if err := sub.AllReduce(ctx, Sum, ir.Float32, in[me], sum); err != nil {
						return err
					}
					out[me] = append(append(int32s(ms...), int32s(ms2...)...), sum...)
					return nil
				}))
				return out
			}
			want, got := results(asComms(loc)), results(asComms(hyb))
			for i := range n {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("%v trial %d (colors %v keys %v, then %v): rank %d's groups or sum differ from Local's", lay, trial, colors, keys, colors2, i)
				}
			}
		}
	}
}

// TestHybridAllReduceGroups runs AllReduce of every dtype and op on random
// groups of Hybrid worlds (Split with random colors and keys, so a group's
// rank order may jump between processes) and on the same groups of a Local
// world, with NaNs, infinities and signed zeros among the inputs and lengths
// from 0 to several tiles (some processes' chunks then empty), and wants
// Local's bits on every rank and the documented rank-order fold.
func TestHybridAllReduceGroups(t *testing.T) {
	r := newRand(t)
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0}
	for _, lay := range layouts {
		np, k := lay[0], lay[1]
		n := np * k
		hyb, _ := hybridWorld(t, np, k)
		loc, err := NewLocal(n)
		if err != nil {
			t.Fatal(err)
		}
		colors, keys := make([]int, n), make([]int, n)
		for i := range n {
			colors[i], keys[i] = r.IntN(3)-1, r.IntN(7)
		}
		if r.IntN(2) == 0 {
			clear(colors) // one group of every rank, reordered by the keys
		}
		split := func(cs []Communicator) []Communicator {
			subs := make([]Communicator, n)
			noErrors(t, runOn(cs, func(ctx context.Context, c Communicator) (err error) {
				subs[c.Rank()], err = c.Split(ctx, colors[c.Rank()], keys[c.Rank()])
				return err
			}))
			return subs
		}
		engines := [][]Communicator{split(asComms(loc)), split(asComms(hyb))}
		for _, dt := range ir.AllDTypes {
			for op := Sum; op <= Min; op++ {
				count := r.IntN(2*tile + 100)
				if r.IntN(3) == 0 {
					count = r.IntN(20)
				}
				in := make([][]byte, n) // by world rank
				for w := range in {
					in[w] = alloc(count * dt.Size())
					fill(r, dt, in[w])
					if dt.IsFloat() {
						for i := range count {
							if r.IntN(10) == 0 {
								putFloat(dt, in[w], i, specials[r.IntN(len(specials))])
							}
						}
					}
				}
				var want [][]byte
				for e, subs := range engines {
					got := make([][]byte, n)
					noErrors(t, runOn(asComms(hyb), func(ctx context.Context, c Communicator) error {
						w, sub := c.Rank(), subs[c.Rank()]
						if sub == nil {
							return nil
						}
						buf := alloc(len(in[w]))
						copy(buf, in[w])
						got[w] = buf
						return sub.AllReduce(ctx, op, dt, buf, buf)
					}))
					if e == 0 {
						want = got
						continue
					}
					for w := range n {
						if !bytes.Equal(got[w], want[w]) {
							t.Fatalf("%dx%d colors %v keys %v: AllReduce(%v, %v[%d]) on rank %d differs from Local's", np, k, colors, keys, op, dt, count, w)
						}
					}
				}
				// The reference fold, over each group's inputs in group rank order.
				for w, sub := range engines[1] {
					if sub == nil || sub.Rank() != 0 {
						continue
					}
					group := make([][]byte, sub.Size())
					for v, s := range engines[1] {
						if s != nil && colors[v] == colors[w] {
							group[s.Rank()] = in[v]
						}
					}
					for i := range count {
						if g, x := bitsAt(dt, want[w], i), expectBits(dt, op, group, i); g != x && !(dt.IsFloat() && math.IsNaN(get(dt, want[w], i))) {
							t.Fatalf("%dx%d: AllReduce(%v, %v) element %d of rank %d's group: bits %#x, want %#x", np, k, op, dt, i, w, g, x)
						}
					}
				}
			}
		}
	}
}

// putFloat writes v, rounded to the float dtype dt, as element i of b.
func putFloat(dt ir.DType, b []byte, i int, v float64) {
	switch dt {
	case ir.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(ir.F16FromFloat64(v)))
	case ir.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(ir.BF16FromFloat64(v)))
	case ir.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case ir.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
}
