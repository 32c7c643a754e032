package mpi

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

var ops = []collective.Op{collective.Sum, collective.Prod, collective.Max, collective.Min}

// exactReduce reports whether c's reduction of dt with op must give Local's
// bits: everything but native float sums and products (Open MPI's order).
func exactReduce(c *Comm, op collective.Op, dt ir.DType) bool {
	_, _, native := c.native(op, dt)
	return !native || !dt.IsFloat()
}

// TestMPIAllReduce checks every dtype and op against a float64 reference of
// every rank's inputs, Local's bits where the engine promises them (f16 and
// bf16 sums among them), equal bits on every rank, and in-place calls.
func TestMPIAllReduce(t *testing.T) {
	w := jobWorld(t)
	testAllReduce(t, w, 100)
}

func testAllReduce(t *testing.T, w *Comm, id int) {
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	for _, dt := range ir.AllDTypes {
		for _, op := range ops {
			for _, elems := range []int{1, 7, 1000, 5000} {
				id++
				name := fmt.Sprintf("%v %v %d", op, dt, elems)
				in := make([][]byte, n)
				for r := range in {
					in[r] = inputs(dt, elems, id, r)
					if dt.IsFloat() && (op == collective.Max || op == collective.Min) && r == n-1 {
						set(dt, in[r], elems/2, math.NaN()) // NaN propagates
					}
				}
				send := slices.Clone(in[rank])
				recv := alloc(len(send))
				inPlace := elems == 7
				if inPlace {
					recv = send
				}
				if err := w.AllReduce(ctx, op, dt, send, recv); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				xs := make([]float64, n)
				for i := range elems {
					mag := 0.0
					for r := range n {
						xs[r] = get(dt, in[r], i)
						mag += math.Abs(xs[r])
					}
					if op == collective.Prod {
						mag = 1
						for _, x := range xs {
							mag *= math.Abs(x)
						}
						mag *= float64(n)
					}
					want := reduce64(op, dt, xs)
					if got := get(dt, recv, i); !close64(got, want, tolerance(dt, mag)) {
						t.Fatalf("%s: element %d is %v, want %v (inputs %v)", name, i, got, want, xs)
					}
				}
				if exactReduce(w, op, dt) {
					ref := local(t, n, func(ctx context.Context, c *collective.Local) ([]byte, error) {
						out := alloc(len(send))
						return out, c.AllReduce(ctx, op, dt, in[c.Rank()], out)
					})
					if !bytes.Equal(recv, ref[rank]) {
						t.Fatalf("%s: the bits differ from collective.Local's", name)
					}
				}
				allSame(t, w, recv, name)
			}
		}
	}
}

// arrayCase is one shape of the array collectives' tests; the shapes hold the
// group size n so that it divides them where needed.
func arrayShapes(n int) [][]int {
	return [][]int{nil, {2 * n, 3, n}, {3, 2 * n, 5}, {n}, {1, n, 2}, {2, 2, 2 * n, 3}, {n, 0, 2}}
}

var moveTypes = []ir.DType{ir.Float32, ir.BFloat16, ir.Int64, ir.Uint8, ir.Bool}

// TestMPIAllGather checks every axis of several shapes and dtypes against
// the concatenation written out here, and Local's bits.
func TestMPIAllGather(t *testing.T) {
	w := jobWorld(t)
	testArrays(t, w, 1000)
}

func testArrays(t *testing.T, w *Comm, id int) {
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	for _, dt := range moveTypes {
		for _, shape := range arrayShapes(n) {
			sh := shape
			if sh == nil {
				sh = []int{3 * n}
			}
			elems := numel(sh)
			for axis := range sh {
				id++
				in := make([][]byte, n)
				for r := range in {
					in[r] = inputs(dt, elems, id, r)
				}
				name := fmt.Sprintf("%v%v axis %d", dt, shape, axis)
				// AllGather: out[idx] = in[idx[axis] / sh[axis]][idx with idx[axis] % sh[axis]].
				recv := alloc(len(in[rank]) * n)
				if err := w.AllGather(ctx, dt, shape, axis, in[rank], recv); err != nil {
					t.Fatalf("AllGather %s: %v", name, err)
				}
				out := slices.Clone(sh)
				out[axis] *= n
				for i := range numel(out) {
					idx := unravel(i, out)
					r := idx[axis] / sh[axis]
					idx[axis] %= sh[axis]
					if got, want := get(dt, recv, i), get(dt, in[r], ravel(idx, sh)); got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
						t.Fatalf("AllGather %s: element %v is %v, want %v", name, unravel(i, out), got, want)
					}
				}
				ref := local(t, n, func(ctx context.Context, c *collective.Local) ([]byte, error) {
					o := alloc(len(recv))
					return o, c.AllGather(ctx, dt, shape, axis, in[c.Rank()], o)
				})
				if !bytes.Equal(recv, ref[rank]) {
					t.Fatalf("AllGather %s: the bits differ from Local's", name)
				}
				if sh[axis]%n != 0 {
					continue
				}
				testReduceScatter(t, w, dt, shape, sh, axis, in)
				for concat := range sh {
					testAllToAll(t, w, dt, shape, sh, axis, concat, in)
				}
			}
		}
	}
}

// testReduceScatter: out[idx] = reduce over ranks of in[r][idx with
// idx[axis] + rank·out[axis]].
func testReduceScatter(t *testing.T, w *Comm, dt ir.DType, shape, sh []int, axis int, in [][]byte) {
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	out := slices.Clone(sh)
	out[axis] /= n
	for _, op := range ops {
		name := fmt.Sprintf("ReduceScatter %v %v%v axis %d", op, dt, shape, axis)
		recv := alloc(len(in[rank]) / n)
		if err := w.ReduceScatter(ctx, op, dt, shape, axis, in[rank], recv); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		xs := make([]float64, n)
		for i := range numel(out) {
			idx := unravel(i, out)
			idx[axis] += rank * out[axis]
			mag := 0.0
			for r := range n {
				xs[r] = get(dt, in[r], ravel(idx, sh))
				mag += math.Abs(xs[r])
			}
			if op == collective.Prod {
				mag = float64(n) * math.Pow(2, float64(n))
			}
			want := reduce64(op, dt, xs)
			if got := get(dt, recv, i); !close64(got, want, tolerance(dt, mag)) {
				t.Fatalf("%s: element %v is %v, want %v", name, unravel(i, out), got, want)
			}
		}
		if exactReduce(w, op, dt) {
			ref := local(t, n, func(ctx context.Context, c *collective.Local) ([]byte, error) {
				o := alloc(len(recv))
				return o, c.ReduceScatter(ctx, op, dt, shape, axis, in[c.Rank()], o)
			})
			if !bytes.Equal(recv, ref[rank]) {
				t.Fatalf("%s: the bits differ from Local's", name)
			}
		}
	}
}

// testAllToAll: out has sh[split]/n then sh[concat]·n; out[idx] comes from
// rank j = idx[concat] / before[concat], at idx with idx[concat] taken modulo
// before[concat] and idx[split] + rank·out[split] (before is the shape after
// the split and before the concatenation).
func testAllToAll(t *testing.T, w *Comm, dt ir.DType, shape, sh []int, split, concat int, in [][]byte) {
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	if shape == nil && concat != 0 {
		return
	}
	name := fmt.Sprintf("AllToAll %v%v split %d concat %d", dt, shape, split, concat)
	before := slices.Clone(sh)
	before[split] /= n
	out := slices.Clone(before)
	out[concat] *= n
	recv := alloc(len(in[rank]))
	if err := w.AllToAll(ctx, dt, shape, split, concat, in[rank], recv); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for i := range numel(out) {
		idx := unravel(i, out)
		j := idx[concat] / before[concat]
		idx[concat] %= before[concat]
		idx[split] += rank * before[split]
		if got, want := get(dt, recv, i), get(dt, in[j], ravel(idx, sh)); got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("%s: element %v is %v, want %v", name, unravel(i, out), got, want)
		}
	}
	ref := local(t, n, func(ctx context.Context, c *collective.Local) ([]byte, error) {
		o := alloc(len(recv))
		return o, c.AllToAll(ctx, dt, shape, split, concat, in[c.Rank()], o)
	})
	if !bytes.Equal(recv, ref[rank]) {
		t.Fatalf("%s: the bits differ from Local's", name)
	}
}

// TestMPIPermuteBroadcast checks CollectivePermute (a ring, a partial map
// with zeros where no pair targets, a self pair) and Broadcast from every root.
func TestMPIPermuteBroadcast(t *testing.T) {
	w := jobWorld(t)
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	var ring, self []collective.Pair
	for r := range n {
		ring = append(ring, collective.Pair{Source: r, Target: (r + 1) % n})
		self = append(self, collective.Pair{Source: r, Target: r})
	}
	partial := []collective.Pair{{Source: n - 1, Target: 0}}
	for k, pairs := range [][]collective.Pair{ring, partial, self, nil} {
		dt := ir.Float32
		id := 3000 + k
		send := inputs(dt, 33, id, rank)
		recv := inputs(dt, 33, id+100, rank) // garbage to be overwritten
		if err := w.CollectivePermute(ctx, dt, pairs, send, recv); err != nil {
			t.Fatalf("pairs %v: %v", pairs, err)
		}
		want := alloc(len(send))
		for _, p := range pairs {
			if p.Target == rank {
				want = inputs(dt, 33, id, p.Source)
			}
		}
		if !bytes.Equal(recv, want) {
			t.Fatalf("pairs %v: rank %d received the wrong data", pairs, rank)
		}
	}
	for root := range n {
		for _, dt := range []ir.DType{ir.Float16, ir.Int64} {
			id := 3100 + root
			buf := inputs(dt, 100, id, rank)
			if err := w.Broadcast(ctx, dt, root, buf); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf, inputs(dt, 100, id, root)) {
				t.Fatalf("Broadcast %v from %d: rank %d has the wrong data", dt, root, rank)
			}
		}
	}
	if err := w.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMPIOrdered: with FERRY_MPI_REDUCE=ordered every reduction, float sums
// included, gives Local's bits.
func TestMPIOrdered(t *testing.T) {
	jobWorld(t)
	t.Setenv(ReduceEnv, "ordered")
	w, err := newWorld()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, _, native := w.native(collective.Sum, ir.Float32); native {
		t.Fatal("ordered mode reduces f32 sums with MPI")
	}
	ctx := context.Background()
	n, rank := w.Size(), w.Rank()
	for _, dt := range []ir.DType{ir.Float32, ir.Float64} {
		in := make([][]byte, n)
		for r := range in {
			in[r] = inputs(dt, 3000, 4000, r)
		}
		recv := alloc(len(in[rank]))
		if err := w.AllReduce(ctx, collective.Sum, dt, in[rank], recv); err != nil {
			t.Fatal(err)
		}
		ref := local(t, n, func(ctx context.Context, c *collective.Local) ([]byte, error) {
			o := alloc(len(recv))
			return o, c.AllReduce(ctx, collective.Sum, dt, in[c.Rank()], o)
		})
		if !bytes.Equal(recv, ref[rank]) {
			t.Fatalf("ordered %v sum: the bits differ from Local's", dt)
		}
	}
}
