package collective

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryml/ferry/ir"
)

// members returns the ranks of c's parent (their values in mine) in c's rank
// order, by all-gathering them: it checks the ordering and the data path.
func members(ctx context.Context, c Communicator, mine int32) ([]int32, error) {
	out := alloc(4 * c.Size())
	if err := c.AllGather(ctx, ir.Int32, nil, 0, int32s(mine), out); err != nil {
		return nil, err
	}
	return readInt32s(out), nil
}

func TestMeshAxes(t *testing.T) {
	mesh := []int{2, 4}
	cases := []struct {
		axes []int
		want func(r int) []int32 // the members of rank r's group, in order
	}{
		{[]int{1}, func(r int) []int32 { b := int32(r / 4 * 4); return []int32{b, b + 1, b + 2, b + 3} }},
		{[]int{0}, func(r int) []int32 { return []int32{int32(r % 4), int32(r%4 + 4)} }},
		{[]int{0, 1}, func(int) []int32 { return []int32{0, 1, 2, 3, 4, 5, 6, 7} }},
		{[]int{1, 0}, func(int) []int32 { return []int32{0, 4, 1, 5, 2, 6, 3, 7} }},
		{[]int{}, func(r int) []int32 { return []int32{int32(r)} }},
	}
	for _, tc := range cases {
		noErrors(t, ranks(t, 8, func(ctx context.Context, c *Local) error {
			sub, err := MeshAxes(ctx, c, mesh, tc.axes...)
			if err != nil {
				return err
			}
			got, err := members(ctx, sub, int32(c.Rank()))
			if err != nil {
				return err
			}
			if want := tc.want(c.Rank()); !slices.Equal(got, want) {
				return fmt.Errorf("axes %v: group %v, want %v", tc.axes, got, want)
			}
			// A reduction over the sub-group only.
			sum := alloc(4)
			if err := sub.AllReduce(ctx, Sum, ir.Int32, int32s(int32(c.Rank())), sum); err != nil {
				return err
			}
			var want int32
			for _, m := range got {
				want += m
			}
			if s := readInt32s(sum)[0]; s != want {
				return fmt.Errorf("axes %v: sum %d, want %d", tc.axes, s, want)
			}
			return nil
		}))
	}
}

func TestSplitGroupsAndNesting(t *testing.T) {
	noErrors(t, ranks(t, 8, func(ctx context.Context, c *Local) error { return splitNesting(ctx, c) }))
}

// splitNesting splits 8 ranks into odd and even groups and those into pairs.
func splitNesting(ctx context.Context, c Communicator) error {
	groups := [][]int{{0, 2, 4, 6}, {7, 5, 3, 1}}
	sub, err := SplitGroups(ctx, c, groups)
	if err != nil {
		return err
	}
	got, err := members(ctx, sub, int32(c.Rank()))
	if err != nil {
		return err
	}
	want := []int32{0, 2, 4, 6}
	if c.Rank()%2 == 1 {
		want = []int32{7, 5, 3, 1}
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("group %v, want %v", got, want)
	}
	// Split the sub-group again: pairs by position, using the parent and
	// the children alternately.
	pair, err := sub.Split(ctx, sub.Rank()/2, -sub.Rank())
	if err != nil {
		return err
	}
	for range 3 {
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		got, err := members(ctx, pair, int32(c.Rank()))
		if err != nil {
			return err
		}
		i := sub.Rank() / 2 * 2 // keys are negated: the pair is reversed
		if w := []int32{want[i+1], want[i]}; !slices.Equal(got, w) {
			return fmt.Errorf("pair %v, want %v", got, w)
		}
	}
	return nil
}

func TestSplitUndefined(t *testing.T) {
	noErrors(t, ranks(t, 4, func(ctx context.Context, c *Local) error { return splitUndefined(ctx, c) }))
}

// splitUndefined splits ranks 3 and 1 of 4 off; the others get nil.
func splitUndefined(ctx context.Context, c Communicator) error {
	sub, err := SplitGroups(ctx, c, [][]int{{3, 1}})
	if err != nil {
		return err
	}
	if c.Rank()%2 == 0 {
		if sub != nil {
			return fmt.Errorf("rank %d is in no group but got a communicator of %d ranks", c.Rank(), sub.Size())
		}
		return nil
	}
	got, err := members(ctx, sub, int32(c.Rank()))
	if err == nil && !slices.Equal(got, []int32{3, 1}) {
		err = fmt.Errorf("group %v, want [3 1]", got)
	}
	return err
}

// expectAll checks that every rank failed with an error wrapping target whose
// message contains each of words.
func expectAll(t *testing.T, errs []error, target error, words ...string) {
	t.Helper()
	for r, err := range errs {
		if !errors.Is(err, target) {
			t.Fatalf("rank %d: got error %v, want one wrapping %q", r, err, target)
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("rank %d: error %q does not mention %q", r, err, w)
			}
		}
	}
}

// stillWorks checks that the group runs a correct all-reduce.
func stillWorks[C Communicator](t *testing.T, cs []C) {
	t.Helper()
	n := len(cs)
	noErrors(t, runOn(cs, func(ctx context.Context, c C) error {
		out := alloc(8)
		if err := c.AllReduce(ctx, Sum, ir.Int32, int32s(int32(c.Rank()), 1), out); err != nil {
			return err
		}
		if got := readInt32s(out); got[0] != int32(n*(n-1)/2) || got[1] != int32(n) {
			return fmt.Errorf("all-reduce after the error: got %v", got)
		}
		return nil
	}))
}

// errCase is a call that fails on every rank of 4 with an error wrapping
// ErrMismatch or ErrInvalid whose message holds words.
type errCase struct {
	name  string
	call  func(ctx context.Context, c Communicator) error
	words []string
}

func TestMismatch(t *testing.T) {
	cs, err := NewLocal(4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range mismatchCases() {
		t.Run(tc.name, func(t *testing.T) {
			expectAll(t, runOn(asComms(cs), tc.call), ErrMismatch, tc.words...)
			stillWorks(t, cs)
		})
	}
}

func mismatchCases() []errCase {
	f32 := func(k int) []byte { return alloc(4 * k) }
	return []errCase{
		{"size", func(ctx context.Context, c Communicator) error {
			k := 8 + c.Rank()/3
			return c.AllReduce(ctx, Sum, ir.Float32, f32(k), f32(k))
		}, []string{"rank 3 called AllReduce(sum, f32[9])", "AllReduce(sum, f32[8])"}},
		{"dtype", func(ctx context.Context, c Communicator) error {
			dt := ir.Float32
			if c.Rank() == 2 {
				dt = ir.Int32
			}
			return c.AllReduce(ctx, Sum, dt, f32(8), f32(8))
		}, []string{"i32"}},
		{"op", func(ctx context.Context, c Communicator) error {
			op := Sum
			if c.Rank() == 1 {
				op = Max
			}
			return c.AllReduce(ctx, op, ir.Float32, f32(8), f32(8))
		}, []string{"max"}},
		{"collective", func(ctx context.Context, c Communicator) error {
			if c.Rank() == 3 {
				return c.AllGather(ctx, ir.Float32, nil, 0, f32(2), f32(8))
			}
			return c.AllReduce(ctx, Sum, ir.Float32, f32(8), f32(8))
		}, []string{"AllGather"}},
		{"barrier", func(ctx context.Context, c Communicator) error {
			if c.Rank() == 0 {
				return c.Barrier(ctx)
			}
			return c.Broadcast(ctx, ir.Float32, 0, f32(3))
		}, []string{"rank 0 called Barrier", "Broadcast"}},
		{"shape", func(ctx context.Context, c Communicator) error {
			shape := []int{2, 4}
			if c.Rank() == 1 {
				shape = []int{4, 2}
			}
			return c.AllGather(ctx, ir.Float32, shape, 0, f32(8), f32(32))
		}, []string{"[4 2]"}},
		{"root", func(ctx context.Context, c Communicator) error {
			return c.Broadcast(ctx, ir.Float32, c.Rank()/2, f32(3))
		}, []string{"root 1"}},
		{"pairs", func(ctx context.Context, c Communicator) error {
			pairs := []Pair{{0, 1}, {1, 0}}
			if c.Rank() == 2 {
				pairs = pairs[:1]
			}
			return c.CollectivePermute(ctx, ir.Float32, pairs, f32(2), f32(2))
		}, []string{"pairs"}},
	}
}

func TestInvalid(t *testing.T) {
	cs, err := NewLocal(4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range invalidCases() {
		t.Run(tc.name, func(t *testing.T) {
			expectAll(t, runOn(asComms(cs), tc.call), ErrInvalid, tc.words...)
			stillWorks(t, cs)
		})
	}
	if _, err := NewLocal(0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("NewLocal(0): %v", err)
	}
}

func invalidCases() []errCase {
	f32 := func(k int) []byte { return alloc(4 * k) }
	return []errCase{
		{"recv length", func(ctx context.Context, c Communicator) error {
			return c.AllReduce(ctx, Sum, ir.Float32, f32(8), f32(8-c.Rank()/2))
		}, []string{"rank 2", "recv has 28 bytes"}},
		{"partial elements", func(ctx context.Context, c Communicator) error {
			return c.AllReduce(ctx, Sum, ir.Float32, alloc(6), alloc(6))
		}, []string{"6 bytes", "whole number"}},
		{"misaligned", func(ctx context.Context, c Communicator) error {
			b := alloc(40)
			return c.AllReduce(ctx, Sum, ir.Float32, b[2:34], f32(8))
		}, []string{"aligned"}},
		{"op", func(ctx context.Context, c Communicator) error {
			return c.AllReduce(ctx, Op(9), ir.Float32, f32(8), f32(8))
		}, []string{"op(9)"}},
		{"dtype", func(ctx context.Context, c Communicator) error {
			return c.AllReduce(ctx, Sum, ir.InvalidDType, f32(8), f32(8))
		}, []string{"dtype"}},
		{"partial overlap", func(ctx context.Context, c Communicator) error {
			b := f32(12)
			return c.AllReduce(ctx, Sum, ir.Float32, b[:32], b[16:])
		}, []string{"overlap"}},
		{"axis", func(ctx context.Context, c Communicator) error {
			return c.AllGather(ctx, ir.Float32, []int{2, 4}, 2, f32(8), f32(32))
		}, []string{"axis 2 is out of range"}},
		{"shape", func(ctx context.Context, c Communicator) error {
			return c.AllGather(ctx, ir.Float32, []int{3, 4}, 0, f32(8), f32(32))
		}, []string{"shape f32[3 4]"}},
		{"indivisible", func(ctx context.Context, c Communicator) error {
			return c.ReduceScatter(ctx, Sum, ir.Float32, []int{2, 6}, 1, f32(12), f32(3))
		}, []string{"not divisible by the 4 ranks"}},
		{"concat axis", func(ctx context.Context, c Communicator) error {
			return c.AllToAll(ctx, ir.Float32, []int{4, 2}, 0, -1, f32(8), f32(8))
		}, []string{"concat axis -1"}},
		{"pairs", func(ctx context.Context, c Communicator) error {
			return c.CollectivePermute(ctx, ir.Float32, []Pair{{0, 1}, {2, 1}}, f32(2), f32(2))
		}, []string{"repeats"}},
		{"pair rank", func(ctx context.Context, c Communicator) error {
			return c.CollectivePermute(ctx, ir.Float32, []Pair{{0, 4}}, f32(2), f32(2))
		}, []string{"outside [0, 4)"}},
		{"root", func(ctx context.Context, c Communicator) error {
			return c.Broadcast(ctx, ir.Float32, 4, f32(2))
		}, []string{"root 4"}},
		{"split color", func(ctx context.Context, c Communicator) error {
			_, err := c.Split(ctx, -2, 0)
			return err
		}, []string{"color -2"}},
		{"groups", func(ctx context.Context, c Communicator) error {
			_, err := SplitGroups(ctx, c, [][]int{{0, 1}, {1, 2}})
			return err
		}, []string{"rank 1 is listed twice"}},
		{"mesh", func(ctx context.Context, c Communicator) error {
			_, err := MeshAxes(ctx, c, []int{3, 2}, 0)
			return err
		}, []string{"mesh [3 2]"}},
	}
}

func TestTimeoutAborts(t *testing.T) {
	cs, err := NewLocal(4)
	if err != nil {
		t.Fatal(err)
	}
	// Rank 3 never arrives: the others give up when their context ends.
	errs := runOn(cs[:3], func(_ context.Context, c *Local) error {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return c.AllReduce(ctx, Sum, ir.Float32, alloc(16), alloc(16))
	})
	expectAll(t, errs, ErrAborted, "gave up in AllReduce")
	gaveUp := 0
	for _, err := range errs {
		if errors.Is(err, context.DeadlineExceeded) {
			gaveUp++
		}
	}
	if gaveUp != 3 {
		t.Fatalf("%d ranks' errors wrap context.DeadlineExceeded, want 3: %v", gaveUp, errs)
	}
	// Later calls fail at once, on every rank.
	expectAll(t, runOn(cs, func(ctx context.Context, c *Local) error { return c.Barrier(ctx) }), ErrAborted)
}

func TestAbortWakesEveryone(t *testing.T) {
	cs, err := NewLocal(4)
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("device 3 fell over")
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for r := range 3 {
		wg.Go(func() { errs[r] = cs[r].Barrier(context.Background()) }) // would wait forever for rank 3
	}
	cs[3].Abort(cause)
	cs[3].Abort(errors.New("second abort is ignored"))
	wg.Wait()
	expectAll(t, errs, ErrAborted, "device 3 fell over")
	expectAll(t, errs, cause)
}

func TestAbortReachesSubgroups(t *testing.T) {
	cs, err := NewLocal(4)
	if err != nil {
		t.Fatal(err)
	}
	subs := make([]Communicator, 4)
	noErrors(t, runOn(cs, func(ctx context.Context, c *Local) error {
		sub, err := c.Split(ctx, c.Rank()%2, 0)
		subs[c.Rank()] = sub
		return err
	}))
	cs[0].Abort(errors.New("stop"))
	expectAll(t, runOn(cs, func(ctx context.Context, c *Local) error {
		return subs[c.Rank()].Barrier(ctx)
	}), ErrAborted, "stop")
}

func TestClosed(t *testing.T) {
	cs, err := NewLocal(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].Barrier(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Barrier after Close: %v", err)
	}
}

func TestConcurrentUseOfOneRank(t *testing.T) {
	cs, err := NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- cs[0].Barrier(context.Background()) }()
	for !cs[0].busy.Load() {
		runtime.Gosched()
	}
	if err := cs[0].Barrier(context.Background()); err == nil || !strings.Contains(err.Error(), "already in a call") {
		t.Fatalf("second call on a busy rank: %v", err)
	}
	if err := cs[1].Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestInterleaved runs a long random sequence of collectives (the same on
// every rank) with ranks racing ahead of each other, some calls invalid on one
// rank, over the world and over two sub-groups, and checks every result.
func TestInterleaved(t *testing.T) {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	noErrors(t, ranks(t, 4, func(ctx context.Context, c *Local) error { return interleaved(ctx, c, seed, 300) }))
}

// interleaved runs the steps of TestInterleaved on one rank.
func interleaved(ctx context.Context, c Communicator, seed uint64, steps int) error {
	plan := rand.New(rand.NewPCG(seed, 1))                    // the same on every rank
	jitter := rand.New(rand.NewPCG(seed, uint64(2+c.Rank()))) // different per rank
	half, err := c.Split(ctx, c.Rank()/2, c.Rank())
	if err != nil {
		return err
	}
	for step := range steps {
		comm := c
		if plan.IntN(3) == 0 {
			comm = half
		}
		m, me := comm.Size(), comm.Rank()
		if jitter.IntN(4) == 0 {
			runtime.Gosched()
		}
		k := 1 + plan.IntN(16)
		bad := plan.IntN(10) == 0 && me == plan.IntN(m)
		switch plan.IntN(4) {
		case 0:
			out := alloc(4 * k)
			if bad {
				out = out[:4*k-4]
			}
			err := comm.AllReduce(ctx, Sum, ir.Int32, int32s(slices.Repeat([]int32{int32(me + step)}, k)...), out)
			if invalid, ok := checkStep(err, bad); !ok {
				return fmt.Errorf("step %d: %v", step, err)
			} else if !invalid {
				if want := int32(m*(m-1)/2 + m*step); readInt32s(out)[k-1] != want {
					return fmt.Errorf("step %d: all-reduce %d, want %d", step, readInt32s(out)[k-1], want)
				}
			}
		case 1:
			out := alloc(4 * m)
			err := comm.AllGather(ctx, ir.Int32, nil, 0, int32s(int32(me*step)), out)
			if _, ok := checkStep(err, false); !ok {
				return fmt.Errorf("step %d: %v", step, err)
			}
			for i, v := range readInt32s(out) {
				if v != int32(i*step) {
					return fmt.Errorf("step %d: all-gather %v", step, readInt32s(out))
				}
			}
		case 2:
			root := plan.IntN(m)
			buf := int32s(int32(me), int32(step))
			if bad {
				buf = buf[:6]
			}
			err := comm.Broadcast(ctx, ir.Int32, root, buf)
			if invalid, ok := checkStep(err, bad); !ok {
				return fmt.Errorf("step %d: %v", step, err)
			} else if !invalid && (readInt32s(buf)[0] != int32(root) || readInt32s(buf)[1] != int32(step)) {
				return fmt.Errorf("step %d: broadcast %v, want root %d", step, readInt32s(buf), root)
			}
		case 3:
			if err := comm.Barrier(ctx); err != nil {
				return fmt.Errorf("step %d: %v", step, err)
			}
		}
	}
	return nil
}

// checkStep: the call may fail only with ErrInvalid, and every rank sees it
// when one rank (perhaps another) was bad. It reports whether the call failed
// and whether that was acceptable.
func checkStep(err error, bad bool) (invalid, ok bool) {
	if err == nil {
		return false, !bad
	}
	return true, errors.Is(err, ErrInvalid)
}

// TestCompleteOnReturn: when a call returns, this rank's recv holds the whole
// result and no other rank still reads this rank's send, which the rank
// overwrites at once.
func TestCompleteOnReturn(t *testing.T) {
	const n, count = 4, 4 * tile
	noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
		send, recv := alloc(4*count), alloc(4*count)
		for it := range 20 {
			v := slices.Repeat([]int32{int32(c.Rank() + it)}, count)
			copy(send, int32s(v...))
			if err := c.AllReduce(ctx, Sum, ir.Int32, send, recv); err != nil {
				return err
			}
			clear(send) // a slow peer still reading would now sum zeros
			want := int32(n*(n-1)/2 + n*it)
			for i, got := range readInt32s(recv) {
				if got != want {
					return fmt.Errorf("iteration %d: element %d = %d on return, want %d", it, i, got, want)
				}
			}
			if it%3 == 0 {
				runtime.Gosched()
			}
		}
		return nil
	}))
}

// TestTwoStreams keeps two collectives in flight per rank: one stream on the
// communicator, another on a duplicate made by Split, from two goroutines.
func TestTwoStreams(t *testing.T) {
	noErrors(t, ranks(t, 4, func(ctx context.Context, c *Local) error { return twoStreams(ctx, c) }))
}

// twoStreams runs TestTwoStreams's two streams on one rank.
func twoStreams(ctx context.Context, c Communicator) error {
	n := c.Size()
	dup, err := c.Split(ctx, 0, c.Rank())
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	var errA, errB error
	wg.Go(func() {
		for it := range 50 {
			out := alloc(4)
			if errA = c.AllReduce(ctx, Sum, ir.Int32, int32s(int32(it)), out); errA != nil {
				return
			}
			if got := readInt32s(out)[0]; got != int32(n*it) {
				errA = fmt.Errorf("stream A iteration %d: %d", it, got)
				return
			}
		}
	})
	wg.Go(func() {
		for it := range 50 {
			got, err := members(ctx, dup, int32(dup.Rank()+it))
			if errB = err; err != nil {
				return
			}
			for i, v := range got {
				if v != int32(i+it) {
					errB = fmt.Errorf("stream B iteration %d: %v", it, got)
					return
				}
			}
		}
	})
	wg.Wait()
	return errors.Join(errA, errB)
}
