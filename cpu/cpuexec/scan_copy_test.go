package cpuexec

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// roundTripScan is a scan over xs (f32[n,m] in space) whose body moves each
// slice to the other memory space and back: ys = xs (in space); with device
// xs the body adds each slice to the carry (carry = init + Σ slices), with
// pinned_host xs it passes the carry through. The copy out of the xs slice
// is double buffered, and the copy back reads its result.
func roundTripScan(t *testing.T, n, m int, space ir.MemorySpace, reverse bool) *ir.Func {
	other := ir.PinnedHost
	if space == ir.PinnedHost {
		other = ir.Device
	}
	f := ir.NewFunc("round_trip_scan")
	cT := ir.TypeOf(ir.Float32, m)
	xT := ir.TypeOf(ir.Float32, m).WithSpace(space)
	pc, pxs := f.Body.AddParam(cT), f.Body.AddParam(ir.TypeOf(ir.Float32, n, m).WithSpace(space))
	body := f.NewRegion()
	c, x := body.AddParam(cT), body.AddParam(xT)
	there := add1(t, body, ir.DevicePut, ir.Attrs{"space": other}, x)
	back := add1(t, body, ir.DevicePut, ir.Attrs{"space": space}, there)
	carry := c // a device reader of the copy to device would cost its reservation
	if space == ir.Device {
		carry = add1(t, body, ir.Add, nil, c, back)
	}
	body.Results = []*ir.Value{carry, back}
	op := addOp(t, f.Body, ir.Scan, []*ir.Value{pc, pxs}, ir.Attrs{"num_consts": 0, "num_carry": 1, "length": n, "reverse": reverse}, body)
	f.Body.Results = op.Results
	return f
}

// A scan body's round trip of its xs slice through the other memory space,
// compiled by the real pipeline, gives every iteration its own slice with
// asynchronous copies (the default), over a slow simulated link, and
// synchronous ones: the next slice's prefetch waits for the copy back, which
// still reads the buffer it overwrites, on the other copy worker.
func TestScanRoundTripCopy(t *testing.T) {
	const n, m = 7, 9
	r := freshRand(t)
	for _, space := range []ir.MemorySpace{ir.Device, ir.PinnedHost} {
		for _, reverse := range []bool{false, true} {
			f := roundTripScan(t, n, m, space, reverse)
			p, err := passes.Compile(f, passes.Options{})
			require.NoError(t, err)
			e, err := New(p)
			require.NoError(t, err)
			pre := prefetches(e.body)
			require.Len(t, pre, 1, "the copy of the xs slice is double buffered:\n%v", p.Func)
			require.Len(t, pre[0].Wait, 1, "its prefetch waits for the copy back")
			args := randArgs(r, f)
			want, err := eval.Run(f, cloneAll(args))
			require.NoError(t, err)
			// Independently: ys = xs, carry = init (+ Σ slices in f32, in
			// iteration order, with device xs).
			require.True(t, bytes.Equal(args[1].Data, want[1].Data), "eval: ys are the xs")
			for j := range m {
				s := ir.View[float32](args[0])[j]
				for it := range n {
					i := it
					if reverse {
						i = n - 1 - it
					}
					if space == ir.Device {
						s += ir.View[float32](args[1])[i*m+j]
					}
				}
				require.Equal(t, s, ir.View[float32](want[0])[j], "eval: carry %d", j)
			}
			for _, c := range []struct{ async, gbps string }{{"", ""}, {"1", "0.02"}, {"0", ""}} {
				what := fmt.Sprintf("%v xs, reverse=%v, async=%q gbps=%q", space, reverse, c.async, c.gbps)
				for range 3 {
					got := runWith(t, e, args, c.async, c.gbps)
					for i := range want {
						require.True(t, got[i].Type.Equal(want[i].Type), what)
						require.True(t, bytes.Equal(got[i].Data, want[i].Data), "%s: result %d:\n got %v\nwant %v", what, i, head(got[i]), head(want[i]))
					}
				}
			}
		}
	}
}

// A scan body whose results have no operands (constants, an iota) and a
// broadcast constant: the ys slices of the small ones are not 8-byte
// aligned from iteration 1 on, and the values are computed into them.
func TestScanConstantYs(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		f := ir.NewFunc("scan_consts")
		cT := ir.TypeOf(ir.Int32)
		pc := f.Body.AddParam(cT)
		body := f.NewRegion()
		body.AddParam(cT)
		k := constant(t, body, int32(-1))
		y := constant(t, body, int32(7))
		u := constant(t, body, uint8(3))
		h := add1(t, body, ir.Constant, ir.Attrs{"value": ir.Scalar(float32(2.5))})
		io := add1(t, body, ir.Iota, ir.Attrs{"dtype": ir.Float32, "shape": []int{3}, "dim": 0})
		b := bcast(t, body, constant(t, body, int64(-9)), []int{2})
		body.Results = []*ir.Value{k, y, u, h, io, b}
		op := addOp(t, f.Body, ir.Scan, []*ir.Value{pc}, ir.Attrs{"num_consts": 0, "num_carry": 1, "length": n}, body)
		f.Body.Results = op.Results
		p, err := passes.Compile(f, passes.Options{})
		require.NoError(t, err)
		got := runBoth(t, p, []*ir.Literal{ir.Scalar(int32(42))})
		require.Equal(t, int32(-1), ir.View[int32](got[0])[0])
		for i := range n {
			require.Equal(t, int32(7), ir.View[int32](got[1])[i])
			require.Equal(t, uint8(3), ir.View[uint8](got[2])[i])
			require.Equal(t, float32(2.5), ir.View[float32](got[3])[i])
			require.Equal(t, []float32{0, 1, 2}, ir.View[float32](got[4])[i*3:i*3+3])
			require.Equal(t, []int64{-9, -9}, ir.View[int64](got[5])[i*2:i*2+2])
		}
	}
}

// prefetches lists the double-buffered copies of g's nested scan bodies.
func prefetches(g *region) []passes.Prefetch {
	var out []passes.Prefetch
	out = append(out, g.sched.Prefetch...)
	for _, st := range g.steps {
		for _, s := range st.subs {
			out = append(out, prefetches(s)...)
		}
	}
	return out
}

// The offloaded scans' prefetches are read by compute only: none of them
// waits for a copy or a collective, so they start as early as before.
func TestOffloadPrefetchReaders(t *testing.T) {
	p, err := passes.Compile(offloadScanFunc(t, 4, 8), passes.Options{})
	require.NoError(t, err)
	e, err := New(p)
	require.NoError(t, err)
	pre := prefetches(e.body)
	require.NotEmpty(t, pre)
	for _, q := range pre {
		for _, j := range q.Wait {
			require.Equal(t, passes.QueueCompute, bodyOf(e.body, q).sched.Steps[j].Queue)
		}
	}
}

// bodyOf returns the scan body of g (or of a region nested in it) whose
// schedule holds prefetch q.
func bodyOf(g *region, q passes.Prefetch) *region {
	for _, p := range g.sched.Prefetch {
		if p.Step == q.Step && p.After == q.After && p.Param == q.Param {
			return g
		}
	}
	for _, st := range g.steps {
		for _, s := range st.subs {
			if b := bodyOf(s, q); b != nil {
				return b
			}
		}
	}
	return nil
}
