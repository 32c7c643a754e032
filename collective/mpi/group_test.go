package mpi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

// gatherInts all-gathers one int64 per rank.
func gatherInts(t *testing.T, c collective.Communicator, v int) []int {
	t.Helper()
	send, recv := alloc(8), alloc(8*c.Size())
	set(ir.Int64, send, 0, float64(v))
	if err := c.AllGather(context.Background(), ir.Int64, nil, 0, send, recv); err != nil {
		t.Fatal(err)
	}
	out := make([]int, c.Size())
	for i := range out {
		out[i] = int(get(ir.Int64, recv, i))
	}
	return out
}

// TestMPIMismatchInvalid: a call whose arguments differ across ranks is an
// ErrMismatch on every rank, a rank's invalid arguments an ErrInvalid naming
// it on every rank, and the communicator stays usable.
func TestMPIMismatchInvalid(t *testing.T) {
	w := jobWorld(t)
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	elems := 4
	if rank == 0 {
		elems = 8
	}
	b := alloc(4 * elems)
	if err := w.AllReduce(ctx, collective.Sum, ir.Float32, b, b); !errors.Is(err, collective.ErrMismatch) {
		t.Fatalf("AllReduce of different lengths: got %v, want ErrMismatch", err)
	}
	var err error
	if rank == n-1 {
		err = w.Broadcast(ctx, ir.Float32, 0, alloc(16))
	} else {
		err = w.Barrier(ctx)
	}
	if !errors.Is(err, collective.ErrMismatch) || !strings.Contains(err.Error(), "Broadcast") {
		t.Fatalf("Barrier against Broadcast: got %v, want ErrMismatch naming Broadcast", err)
	}
	op := collective.Sum
	if rank == n-1 {
		op = collective.Op(9)
	}
	err = w.AllReduce(ctx, op, ir.Float32, alloc(16), alloc(16))
	if !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("rank %d of %d", n-1, n)) {
		t.Fatalf("AllReduce with op 9 on rank %d: got %v, want ErrInvalid naming the rank", n-1, err)
	}
	shape := []int{3, n}
	if rank == 0 {
		shape = []int{3, n + 1} // does not match send's length
	}
	err = w.AllGather(ctx, ir.Float32, shape, 1, alloc(4*3*n), alloc(4*3*n*n))
	if !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("AllGather with a bad shape on rank 0: got %v, want ErrInvalid", err)
	}
	if got := gatherInts(t, w, rank); !slices.Equal(got, seq(n)) {
		t.Fatalf("after the errors, AllGather gives %v", got)
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestMPISplit: colors by parity with the keys reversed, the last rank
// (of four or more) Undefined; the sub-communicators run collectives.
func TestMPISplit(t *testing.T) {
	w := jobWorld(t)
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	color := rank % 2
	if n >= 4 && rank == n-1 {
		color = collective.Undefined
	}
	sub, err := w.Split(ctx, color, -rank)
	if err != nil {
		t.Fatal(err)
	}
	if color == collective.Undefined {
		if sub != nil {
			t.Fatal("color Undefined gave a communicator")
		}
		barrier(t)
		return
	}
	defer sub.Close()
	var members []int // world ranks of the group, in key order (rank descending)
	for r := n - 1; r >= 0; r-- {
		if r%2 == color && !(n >= 4 && r == n-1) {
			members = append(members, r)
		}
	}
	if sub.Size() != len(members) || sub.Rank() != slices.Index(members, rank) {
		t.Fatalf("rank %d: sub-communicator rank %d of %d, want %d of %d", rank, sub.Rank(), sub.Size(), slices.Index(members, rank), len(members))
	}
	if got := gatherInts(t, sub, rank); !slices.Equal(got, members) {
		t.Fatalf("AllGather of world ranks over color %d: %v, want %v", color, got, members)
	}
	testAllReduceSmall(t, sub, 5000+color)
	barrier(t)
}

// testAllReduceSmall checks an f32 and a bf16 sum over c against the float64
// reference and Local's bits (bf16).
func testAllReduceSmall(t *testing.T, c collective.Communicator, id int) {
	t.Helper()
	n, rank := c.Size(), c.Rank()
	for _, dt := range []ir.DType{ir.Float32, ir.BFloat16} {
		in := make([][]byte, n)
		for r := range in {
			in[r] = inputs(dt, 300, id, r)
		}
		recv := alloc(len(in[rank]))
		if err := c.AllReduce(context.Background(), collective.Sum, dt, in[rank], recv); err != nil {
			t.Fatal(err)
		}
		xs := make([]float64, n)
		for i := range 300 {
			for r := range n {
				xs[r] = get(dt, in[r], i)
			}
			if got, want := get(dt, recv, i), reduce64(collective.Sum, dt, xs); !close64(got, want, tolerance(dt, 2*float64(n))) {
				t.Fatalf("%v sum over %d ranks: element %d is %v, want %v", dt, n, i, got, want)
			}
		}
		if dt == ir.BFloat16 {
			ref := local(t, n, func(ctx context.Context, l *collective.Local) ([]byte, error) {
				o := alloc(len(recv))
				return o, l.AllReduce(ctx, collective.Sum, dt, in[l.Rank()], o)
			})
			if string(recv) != string(ref[rank]) {
				t.Fatalf("bf16 sum over %d ranks: the bits differ from Local's", n)
			}
		}
	}
}

// TestMPIMeshAxes lays the ranks out on a 2 × n/2 mesh and checks the rows,
// the columns and the whole mesh in transposed order.
func TestMPIMeshAxes(t *testing.T) {
	w := jobWorld(t)
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	if n%2 != 0 {
		t.Skipf("%d ranks do not make a 2 × n/2 mesh", n)
	}
	mesh := []int{2, n / 2}
	row, col := rank/mesh[1], rank%mesh[1]
	for _, tc := range []struct {
		axes []int
		want []int // world ranks of this rank's group, in order
	}{
		{[]int{1}, rowRanks(row, mesh)},
		{[]int{0}, []int{col, mesh[1] + col}},
		{[]int{1, 0}, transposed(mesh)},
	} {
		sub, err := collective.MeshAxes(ctx, w, mesh, tc.axes...)
		if err != nil {
			t.Fatal(err)
		}
		if got := gatherInts(t, sub, rank); !slices.Equal(got, tc.want) {
			t.Fatalf("mesh %v axes %v: group %v, want %v", mesh, tc.axes, got, tc.want)
		}
		testAllReduceSmall(t, sub, 6000+len(tc.axes)*10+tc.axes[0]*100+tc.want[0])
		sub.Close()
	}
}

func rowRanks(row int, mesh []int) []int {
	var s []int
	for c := range mesh[1] {
		s = append(s, row*mesh[1]+c)
	}
	return s
}

func transposed(mesh []int) []int {
	var s []int
	for c := range mesh[1] {
		for r := range mesh[0] {
			s = append(s, r*mesh[1]+c)
		}
	}
	return s
}

// TestMPIConcurrent runs collectives on two duplicates of the world from two
// goroutines at once (MPI_THREAD_MULTIPLE).
func TestMPIConcurrent(t *testing.T) {
	w := jobWorld(t)
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	var dups [2]collective.Communicator
	for i := range dups {
		d, err := w.Split(ctx, 0, rank)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		dups[i] = d
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for g, d := range dups {
		wg.Go(func() {
			for it := range 100 {
				elems := 1 + (it*37+g*11)%500
				send, recv := alloc(8*elems), alloc(8*elems)
				for i := range elems {
					set(ir.Int64, send, i, float64(rank*1000+i+it+g))
				}
				if err := d.AllReduce(ctx, collective.Sum, ir.Int64, send, recv); err != nil {
					errs[g] = err
					return
				}
				for i := range elems {
					// Σ_r (r·1000 + i + it + g)
					want := float64(1000*n*(n-1)/2 + n*(i+it+g))
					if got := get(ir.Int64, recv, i); got != want {
						errs[g] = fmt.Errorf("goroutine %d iteration %d: element %d is %v, want %v", g, it, i, got, want)
						return
					}
				}
				all := alloc(8 * elems * n)
				if err := d.AllGather(ctx, ir.Int64, []int{elems}, 0, send, all); err != nil {
					errs[g] = err
					return
				}
				for r := range n {
					if got, want := get(ir.Int64, all, r*elems), float64(r*1000+it+g); got != want {
						errs[g] = fmt.Errorf("goroutine %d iteration %d: gathered %v from rank %d, want %v", g, it, got, r, want)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// waitAborted waits (boundedly) until an abort message from another process
// reaches this one's world.
func waitAborted(t *testing.T, c *Comm) error {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		c.w.poll()
		if err := c.w.failed(); err != nil {
			return err
		}
	}
	t.Fatal("no abort message arrived within a minute")
	return nil
}

// TestMPITimeout: the last rank skips an AllReduce; the others return the
// timeout error (naming the collective, the rank, the size, the timeout and
// the rank that did not join)
// after FERRY_COLLECTIVE_TIMEOUT, and their abort reaches the last rank,
// whose next call fails with ErrAborted naming the rank that gave up.
func TestMPITimeout(t *testing.T) {
	jobWorld(t)
	t.Setenv(TimeoutEnv, "300ms")
	tw, err := newWorld()
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	ctx := context.Background()
	n, rank := tw.Size(), tw.Rank()
	if rank != n-1 {
		start := time.Now()
		err := tw.AllReduce(ctx, collective.Sum, ir.Float32, alloc(64), alloc(64))
		t.Logf("rank %d: AllReduce returned after %v: %v", rank, time.Since(start), err)
		// This rank's own timeout, or the abort of another that timed out first.
		bad := !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), ErrTimeout.Error())
		skipper := fmt.Sprintf("rank(s) [%d] of %d did not join it", n-1, n)
		if n > p2pDescMax {
			skipper = "a rank did not join it"
		}
		for _, s := range []string{"AllReduce", fmt.Sprintf("of %d", n), "300ms", TimeoutEnv, skipper} {
			bad = bad || !strings.Contains(err.Error(), s)
		}
		if err2 := tw.Barrier(ctx); !errors.Is(err2, collective.ErrAborted) {
			err, bad = fmt.Errorf("a call after the timeout returned %v, want ErrAborted", err2), true
		}
		barrier(t)
		if bad {
			t.Fatalf("got %v, want ErrAborted and the timeout naming AllReduce, the rank of %d, 300ms, %s and the skipping rank", err, n, TimeoutEnv)
		}
		return
	}
	barrier(t) // the others have timed out
	err = waitAborted(t, tw)
	if err2 := tw.Barrier(ctx); !errors.Is(err2, collective.ErrAborted) {
		t.Fatalf("the skipping rank's next call: got %v, want ErrAborted", err2)
	}
	if !strings.Contains(err.Error(), "gave up in AllReduce") || !strings.Contains(err.Error(), "timed out") && !strings.Contains(err.Error(), "did not complete") {
		t.Fatalf("the abort that reached the skipping rank does not name the collective and the timeout: %v", err)
	}
	t.Logf("rank %d: %v", rank, err)
}

// TestMPIContext: a context that ends while the others wait for the last
// rank aborts the communicator with ctx.Err().
func TestMPIContext(t *testing.T) {
	jobWorld(t)
	cw, err := newWorld()
	if err != nil {
		t.Fatal(err)
	}
	defer cw.Close()
	n, rank := cw.Size(), cw.Rank()
	if rank != n-1 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err := cw.Broadcast(ctx, ir.Uint8, 0, alloc(10))
		barrier(t)
		// This rank's deadline, or the abort of another whose deadline came first.
		if !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
			t.Fatalf("got %v, want ErrAborted and DeadlineExceeded", err)
		}
		return
	}
	barrier(t)
	if rank == n-1 {
		if err := waitAborted(t, cw); !strings.Contains(err.Error(), "deadline") {
			t.Fatalf("the abort does not say why: %v", err)
		}
	}
}

// TestMPIAbort: rank 0's Abort reaches every rank; all later calls fail
// with ErrAborted and the reason, and Close then Split-free calls report
// ErrClosed.
func TestMPIAbort(t *testing.T) {
	jobWorld(t)
	aw, err := newWorld()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sub, err := aw.Split(ctx, 0, aw.Rank())
	if err != nil {
		t.Fatal(err)
	}
	if aw.Rank() == 0 {
		aw.Abort(errors.New("boom"))
		aw.Abort(errors.New("second")) // the first wins
	}
	barrier(t)
	if aw.Rank() != 0 {
		waitAborted(t, aw)
	}
	for _, c := range []collective.Communicator{aw, sub} {
		err := c.Barrier(ctx)
		if !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), "boom") || strings.Contains(err.Error(), "second") {
			t.Fatalf("after rank 0's Abort: got %v, want ErrAborted with boom", err)
		}
	}
	sub.Close()
	aw.Close()
	if err := aw.Barrier(ctx); !errors.Is(err, collective.ErrClosed) {
		t.Fatalf("after Close: got %v, want ErrClosed", err)
	}
}
