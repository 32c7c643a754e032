package collective

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"testing"

	"github.com/ferryml/ferry/ir"
)

// expectBits is the exact expected result of reducing element i of the ranks'
// buffers: wrapped integers, or the documented rank-order fold for floats.
func expectBits(dt ir.DType, op Op, bufs [][]byte, i int) uint64 {
	if dt.IsFloat() {
		xs := make([]float64, len(bufs))
		for k, b := range bufs {
			xs[k] = get(dt, b, i)
		}
		return orderedFold(dt, op, xs)
	}
	xs := make([]int64, len(bufs))
	for k, b := range bufs {
		xs[k] = getInt(dt, b, i)
	}
	v := uint64(refReduceInt(dt, op, xs))
	if dt.Size() < 8 {
		v &= 1<<(8*dt.Size()) - 1
	}
	return v
}

// checkNear checks a float result against the float64 reduction.
func checkNear(t *testing.T, dt ir.DType, op Op, bufs [][]byte, i int, got float64) {
	t.Helper()
	xs := make([]float64, len(bufs))
	for k, b := range bufs {
		xs[k] = get(dt, b, i)
	}
	want, scale := refReduceFloat(op, xs)
	// float32 accumulation (n roundings) plus the final rounding to dt.
	tol := float64(len(bufs)+1)*0x1p-24*scale + eps(dt)*math.Abs(want)
	if dt == ir.Float16 {
		tol += 0x1p-25 // half the spacing of f16 subnormals
	}
	if math.Abs(got-want) > tol {
		t.Fatalf("%v %v over %d ranks, element %d: got %g, want %g ± %g (inputs %v)", dt, op, len(bufs), i, got, want, tol, xs)
	}
}

func TestAllReduce(t *testing.T) {
	r := newRand(t)
	for _, n := range sizes {
		for _, dt := range ir.AllDTypes {
			for op := Sum; op <= Min; op++ {
				count := r.IntN(3*tile + 200) // several tiles and uneven slices
				if r.IntN(6) == 0 {
					count = r.IntN(4)
				}
				inPlace := r.IntN(2) == 0
				esz := dt.Size()
				orig, send, recv := make([][]byte, n), make([][]byte, n), make([][]byte, n)
				for k := range n {
					orig[k] = alloc(count * esz)
					fill(r, dt, orig[k])
					send[k] = alloc(count * esz)
					copy(send[k], orig[k])
					recv[k] = send[k]
					if !inPlace {
						recv[k] = alloc(count * esz)
					}
				}
				noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
					return c.AllReduce(ctx, op, dt, send[c.Rank()], recv[c.Rank()])
				}))
				for k := 1; k < n; k++ {
					if !bytes.Equal(recv[k], recv[0]) {
						t.Fatalf("%v %v n=%d: rank %d's result differs from rank 0's", dt, op, n, k)
					}
				}
				for i := range count {
					if got, want := bitsAt(dt, recv[0], i), expectBits(dt, op, orig, i); got != want {
						t.Fatalf("%v %v n=%d count=%d in-place=%v element %d: got bits %#x, want %#x", dt, op, n, count, inPlace, i, got, want)
					}
					if dt.IsFloat() {
						checkNear(t, dt, op, orig, i, get(dt, recv[0], i))
					}
				}
			}
		}
	}
}

// TestHalfAccumulatesInFloat32: 256 + 1 + … + 1 (8 ranks) in bfloat16 steps
// stays 256 (each +1 is a tie rounded to even); in float32 it is 263, which
// rounds once to 264.
func TestHalfAccumulatesInFloat32(t *testing.T) {
	const n = 8
	send, recv := make([][]byte, n), make([][]byte, n)
	for k := range n {
		v := ir.BF16FromFloat64(1)
		if k == 0 {
			v = ir.BF16FromFloat64(256)
		}
		send[k], recv[k] = alloc(2), alloc(2)
		binary.LittleEndian.PutUint16(send[k], uint16(v))
	}
	noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
		return c.AllReduce(ctx, Sum, ir.BFloat16, send[c.Rank()], recv[c.Rank()])
	}))
	for k := range n {
		if got := get(ir.BFloat16, recv[k], 0); got != 264 {
			t.Fatalf("rank %d: bf16 sum = %v, want 264", k, got)
		}
	}
}

func TestMaxMinPropagateNaN(t *testing.T) {
	nan := float32(math.NaN())
	in := [][]float32{{nan, 1, 3}, {2, nan, -1}}
	for _, op := range []Op{Max, Min} {
		send, recv := make([][]byte, 2), make([][]byte, 2)
		for k := range 2 {
			send[k], recv[k] = alloc(12), alloc(12)
			for i, v := range in[k] {
				binary.LittleEndian.PutUint32(send[k][4*i:], math.Float32bits(v))
			}
		}
		noErrors(t, ranks(t, 2, func(ctx context.Context, c *Local) error {
			return c.AllReduce(ctx, op, ir.Float32, send[c.Rank()], recv[c.Rank()])
		}))
		want := []float64{math.NaN(), math.NaN(), 3}
		if op == Min {
			want[2] = -1
		}
		for i, w := range want {
			if got := get(ir.Float32, recv[1], i); !(got == w || math.IsNaN(got) && math.IsNaN(w)) {
				t.Fatalf("%v element %d = %v, want %v", op, i, got, w)
			}
		}
	}
}

func TestAllGather(t *testing.T) {
	r := newRand(t)
	for _, n := range sizes {
		for _, dt := range ir.AllDTypes {
			shape, axis := randShape(r, 1)
			if r.IntN(4) == 0 {
				shape = nil
			}
			esz := dt.Size()
			local := numel(shape)
			if shape == nil {
				local = r.IntN(50)
			}
			send, recv := make([][]byte, n), make([][]byte, n)
			for k := range n {
				send[k], recv[k] = alloc(local*esz), alloc(n*local*esz)
				fill(r, dt, send[k])
			}
			ax := axis
			if shape == nil {
				ax = 0
			}
			noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
				return c.AllGather(ctx, dt, shape, ax, send[c.Rank()], recv[c.Rank()])
			}))
			s := shape
			if s == nil {
				s = []int{local}
			}
			out := append([]int(nil), s...)
			out[ax] *= n
			want := alloc(n * local * esz)
			for k := range n {
				for i := range local {
					idx := unravel(i, s)
					idx[ax] += k * s[ax]
					copyElem(esz, want, ravel(idx, out), send[k], i)
				}
			}
			for k := range n {
				if !bytes.Equal(recv[k], want) {
					t.Fatalf("%v%v axis %d n=%d: rank %d gathered the wrong bytes", dt, shape, ax, n, k)
				}
			}
		}
	}
}

func TestReduceScatter(t *testing.T) {
	r := newRand(t)
	for _, n := range sizes {
		for _, dt := range ir.AllDTypes {
			for op := Sum; op <= Min; op++ {
				shape, axis := randShape(r, n)
				if r.IntN(3) == 0 { // large enough for several tiles
					shape, axis = []int{n * (tile + r.IntN(tile)), 1 + r.IntN(2)}, r.IntN(2)
					shape[axis] = n * (1 + r.IntN(3))
				}
				esz, full := dt.Size(), numel(shape)
				send, recv := make([][]byte, n), make([][]byte, n)
				for k := range n {
					send[k], recv[k] = alloc(full*esz), alloc(full/n*esz)
					fill(r, dt, send[k])
				}
				noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
					return c.ReduceScatter(ctx, op, dt, shape, axis, send[c.Rank()], recv[c.Rank()])
				}))
				out := append([]int(nil), shape...)
				out[axis] /= n
				for k := range n {
					for j := range full / n {
						idx := unravel(j, out)
						idx[axis] += k * out[axis]
						src := ravel(idx, shape)
						if got, want := bitsAt(dt, recv[k], j), expectBits(dt, op, send, src); got != want {
							t.Fatalf("%v %v%v axis %d n=%d: rank %d element %d: got bits %#x, want %#x", op, dt, shape, axis, n, k, j, got, want)
						}
					}
				}
			}
		}
	}
}

func TestAllToAll(t *testing.T) {
	r := newRand(t)
	for _, n := range sizes {
		for _, dt := range ir.AllDTypes {
			shape, split := randShape(r, n)
			concat := r.IntN(len(shape))
			esz, full := dt.Size(), numel(shape)
			send, recv := make([][]byte, n), make([][]byte, n)
			for k := range n {
				send[k], recv[k] = alloc(full*esz), alloc(full*esz)
				fill(r, dt, send[k])
			}
			noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
				return c.AllToAll(ctx, dt, shape, split, concat, send[c.Rank()], recv[c.Rank()])
			}))
			chunk := append([]int(nil), shape...)
			chunk[split] /= n
			out := append([]int(nil), chunk...)
			out[concat] *= n
			for dst := range n {
				want := alloc(full * esz)
				for src := range n {
					for i := range numel(chunk) {
						in := unravel(i, chunk)
						in[split] += dst * chunk[split]
						at := unravel(i, chunk)
						at[concat] += src * chunk[concat]
						copyElem(esz, want, ravel(at, out), send[src], ravel(in, shape))
					}
				}
				if !bytes.Equal(recv[dst], want) {
					t.Fatalf("%v%v split %d concat %d n=%d: rank %d received the wrong bytes", dt, shape, split, concat, n, dst)
				}
			}
		}
	}
}

func TestCollectivePermute(t *testing.T) {
	r := newRand(t)
	for _, n := range sizes {
		for trial := range 3 {
			dt := ir.AllDTypes[r.IntN(len(ir.AllDTypes))]
			targets := r.Perm(n)
			var pairs []Pair
			for s, tg := range targets {
				if trial == 0 || r.IntN(2) == 0 { // trial 0: a full permutation
					pairs = append(pairs, Pair{s, tg})
				}
			}
			count := r.IntN(100)
			send, recv := make([][]byte, n), make([][]byte, n)
			for k := range n {
				send[k], recv[k] = alloc(count*dt.Size()), alloc(count*dt.Size())
				fill(r, dt, send[k])
				for i := range recv[k] {
					recv[k][i] = 0xAB // must be overwritten with zeros or data
				}
			}
			noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
				return c.CollectivePermute(ctx, dt, pairs, send[c.Rank()], recv[c.Rank()])
			}))
			for k := range n {
				want := make([]byte, count*dt.Size())
				for _, p := range pairs {
					if p.Target == k {
						want = send[p.Source]
					}
				}
				if !bytes.Equal(recv[k], want) {
					t.Fatalf("n=%d pairs %v: rank %d received the wrong bytes", n, pairs, k)
				}
			}
		}
	}
}

func TestBroadcast(t *testing.T) {
	r := newRand(t)
	for _, n := range sizes {
		root, dt, count := r.IntN(n), ir.AllDTypes[r.IntN(len(ir.AllDTypes))], r.IntN(5000)
		buf := make([][]byte, n)
		for k := range n {
			buf[k] = alloc(count * dt.Size())
			fill(r, dt, buf[k])
		}
		want := bytes.Clone(buf[root])
		noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
			return c.Broadcast(ctx, dt, root, buf[c.Rank()])
		}))
		for k := range n {
			if !bytes.Equal(buf[k], want) {
				t.Fatalf("n=%d root %d: rank %d has the wrong bytes", n, root, k)
			}
		}
	}
}

func TestBarrier(t *testing.T) {
	for _, n := range sizes {
		arrived := make([]int, n) // each rank writes only its own entry
		noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
			for it := 1; it <= 50; it++ {
				arrived[c.Rank()] = it
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				for k, a := range arrived {
					if a < it {
						return fmt.Errorf("iteration %d: rank %d passed the barrier before rank %d arrived", it, c.Rank(), k)
					}
				}
				if err := c.Barrier(ctx); err != nil { // nobody starts it+1 before all checked
					return err
				}
			}
			return nil
		}))
	}
}

// int32s is a helper for small integer collectives in tests.
func int32s(vs ...int32) []byte {
	b := alloc(4 * len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return b
}

func readInt32s(b []byte) []int32 {
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// TestDeterministicAcrossRuns repeats the same f32 and bf16 sums with ranks
// scheduled differently each time and expects the same bytes every time, on
// every rank.
func TestDeterministicAcrossRuns(t *testing.T) {
	r := newRand(t)
	const n, count = 8, 3*tile + 77
	for _, dt := range []ir.DType{ir.Float32, ir.BFloat16, ir.Float16} {
		send := make([][]byte, n)
		for k := range n {
			send[k] = alloc(count * dt.Size())
			fill(r, dt, send[k])
		}
		var first []byte
		for run := range 5 {
			recv := make([][]byte, n)
			noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
				for range (c.Rank() + run) % 4 {
					runtime.Gosched() // a different arrival order each run
				}
				recv[c.Rank()] = alloc(count * dt.Size())
				return c.AllReduce(ctx, Sum, dt, send[c.Rank()], recv[c.Rank()])
			}))
			if first == nil {
				first = recv[0]
			}
			for k := range n {
				if !bytes.Equal(recv[k], first) {
					t.Fatalf("%v run %d: rank %d's sum differs from run 0's", dt, run, k)
				}
			}
		}
	}
}
