package runtime_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// copyModes are the settings of FERRY_ASYNC_COPY and FERRY_HOST_COPY_GBPS the
// copy tests run under: asynchronous (the default), asynchronous over a slow
// simulated link, and synchronous.
var copyModes = []struct{ async, gbps string }{{"", ""}, {"1", "0.05"}, {"0", ""}}

// roundTrip returns x moved to the other memory space and back.
func roundTrip(x *trace.Array) *trace.Array {
	other := ir.PinnedHost
	if x.Space() == ir.PinnedHost {
		other = ir.Device
	}
	return trace.DevicePut(trace.DevicePut(x, other), x.Space())
}

// scanCopyCase is a scan whose body copies its xs slice between memory
// spaces, and the float64 reference of its results.
type scanCopyCase struct {
	name    string
	space   ir.MemorySpace // where xs lives
	reverse bool
	// body maps the carry (f32[m]) and the xs slice (f32[m]) to the new carry
	// and the y.
	body func(c, x *trace.Array) (*trace.Array, *trace.Array)
	// ref is body in float64.
	ref    func(c, x []float64) (nc, y []float64)
	ySpace ir.MemorySpace
}

var scanCopyCases = []scanCopyCase{
	{
		name: "device xs, device→host→device", space: ir.Device, ySpace: ir.Device,
		body: func(c, x *trace.Array) (*trace.Array, *trace.Array) { return c, roundTrip(x) },
		ref:  func(c, x []float64) ([]float64, []float64) { return c, x },
	},
	{
		name: "host xs, host→device→host", space: ir.PinnedHost, ySpace: ir.PinnedHost,
		body: func(c, x *trace.Array) (*trace.Array, *trace.Array) { return c, roundTrip(x) },
		ref:  func(c, x []float64) ([]float64, []float64) { return c, x },
	},
	{
		name: "host xs, to device, computed, host output", space: ir.PinnedHost, ySpace: ir.PinnedHost,
		body: func(c, x *trace.Array) (*trace.Array, *trace.Array) {
			return c, trace.DevicePut(trace.Neg(trace.DevicePut(x, ir.Device)), ir.PinnedHost)
		},
		ref: func(c, x []float64) ([]float64, []float64) { return c, mapF(x, func(v float64) float64 { return -v }) },
	},
	{
		name: "device xs, round trip into the carry, reverse", space: ir.Device, ySpace: ir.Device, reverse: true,
		body: func(c, x *trace.Array) (*trace.Array, *trace.Array) {
			y := roundTrip(x)
			return trace.Add(c, y), y
		},
		ref: func(c, x []float64) ([]float64, []float64) { return addF(c, x), x },
	},
	{
		name: "device xs, host output of the round trip", space: ir.Device, ySpace: ir.PinnedHost,
		body: func(c, x *trace.Array) (*trace.Array, *trace.Array) {
			h := trace.DevicePut(x, ir.PinnedHost)
			return trace.Add(c, trace.DevicePut(h, ir.Device)), h
		},
		ref: func(c, x []float64) ([]float64, []float64) { return addF(c, x), x },
	},
}

func mapF(x []float64, f func(float64) float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = f(v)
	}
	return out
}

func addF(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// run runs the case's scan over xs (f32[n,m]) and init (f32[m]) jitted or
// eagerly and returns the final carry and the ys.
func (c scanCopyCase) run(t *testing.T, jit bool, init, xs *trace.Array) (carry, ys *trace.Array) {
	t.Helper()
	fn := func(init, xs *trace.Array) (*trace.Array, *trace.Array) {
		var opts []trace.ScanOption
		if c.reverse {
			opts = append(opts, trace.ScanReverse())
		}
		cs, ys := trace.Scan(func(cr, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			nc, y := c.body(cr[0], x[0])
			return []*trace.Array{nc}, []*trace.Array{y}
		}, []*trace.Array{init}, []*trace.Array{xs}, opts...)
		return cs[0], ys[0]
	}
	if jit {
		outs, err := rt.NewJitted(fn).Call(init, xs)
		require.NoError(t, err)
		return outs[0].(*trace.Array), outs[1].(*trace.Array)
	}
	return fn(init, xs)
}

// A scan whose body copies its xs slice to the other memory space and back
// (or to device, computes, and writes a pinned_host y) gives, jitted and
// eager, with asynchronous copies on, over a slow simulated link and off,
// every iteration's own slice: the next iteration's prefetched copy of xs
// must not overwrite a slice a copy of this iteration is still reading.
func TestScanCopyRoundTrip(t *testing.T) {
	r := newRand(t)
	for _, c := range scanCopyCases {
		t.Run(c.name, func(t *testing.T) { c.check(t, r) })
	}
}

func (c scanCopyCase) check(t *testing.T, r *rand.Rand) {
	const n, m = 6, 5
	for _, mode := range copyModes {
		t.Setenv("FERRY_ASYNC_COPY", mode.async)
		t.Setenv("FERRY_HOST_COPY_GBPS", mode.gbps)
		for _, jit := range []bool{true, false} {
			what := fmt.Sprintf("%s, jit=%v, async=%q gbps=%q", c.name, jit, mode.async, mode.gbps)
			x0, xv := randSlice(r, m), randSlice(r, n*m)
			xs := rt.FromSlice(xv, n, m)
			if c.space == ir.PinnedHost {
				xs = trace.DevicePut(xs, ir.PinnedHost)
			}
			carry, ys := c.run(t, jit, rt.FromSlice(x0, m), xs)

			wantC := f64s(x0)
			wantY := make([]float64, n*m)
			for it := range n {
				i := it
				if c.reverse {
					i = n - 1 - it
				}
				var y []float64
				wantC, y = c.ref(wantC, f64s(xv[i*m:(i+1)*m]))
				copy(wantY[i*m:], y)
			}
			require.Equal(t, ir.Shape{n, m}, ys.Shape(), what)
			require.Equal(t, ir.Float32, ys.DType(), what)
			require.Equal(t, c.ySpace, ys.Space(), what)
			requireF32Near(t, wantY, ys.Float32s(), what+": ys")
			requireF32Near(t, wantC, carry.Float32s(), what+": carry")
		}
	}
}

// While and cond bodies that copy their state to the other memory space and
// back: every copy a region starts is complete when it ends, so each
// iteration sees the previous one's state.
func TestLoopCopyRoundTrip(t *testing.T) {
	const n, m = 5, 7
	r := newRand(t)
	for _, mode := range copyModes {
		t.Setenv("FERRY_ASYNC_COPY", mode.async)
		t.Setenv("FERRY_HOST_COPY_GBPS", mode.gbps)
		for _, jit := range []bool{true, false} {
			what := fmt.Sprintf("jit=%v, async=%q gbps=%q", jit, mode.async, mode.gbps)
			xv := randSlice(r, m)
			// while i < n: x = roundTrip(x) + 1 (through host when i is
			// even, via cond), i++.
			fn := func(x *trace.Array) *trace.Array {
				st := trace.While(func(s []*trace.Array) *trace.Array {
					return trace.Less(s[0], trace.ScalarAs(n, ir.Int32))
				}, func(s []*trace.Array) []*trace.Array {
					even := trace.Equal(trace.Rem(s[0], trace.ScalarAs(2, ir.Int32)), trace.ScalarAs(0, ir.Int32))
					x := trace.Cond(even, func(o []*trace.Array) []*trace.Array {
						return []*trace.Array{roundTrip(o[0])}
					}, func(o []*trace.Array) []*trace.Array {
						return []*trace.Array{trace.Neg(roundTrip(trace.Neg(o[0])))}
					}, s[1])[0]
					return []*trace.Array{trace.Add(s[0], trace.ScalarAs(1, ir.Int32)), trace.Add(roundTrip(x), trace.OnesLike(x))}
				}, trace.ScalarAs(0, ir.Int32), x)
				return st[1]
			}
			x := rt.FromSlice(xv, m)
			var got *trace.Array
			if jit {
				got = rt.Jit(fn)(x)
			} else {
				got = fn(x)
			}
			requireF32Near(t, mapF(f64s(xv), func(v float64) float64 { return v + n }), got.Float32s(), what)
		}
	}
}

func f64s(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

func requireF32Near(t *testing.T, want []float64, got []float32, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		require.InDelta(t, want[i], float64(got[i]), 1e-5*(1+abs(want[i])), "%s [%d]: got %v, want %v", what, i, got, want)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// constOut is a constant or iota a scan body returns, and its value at
// flat index i.
type constOut struct {
	name string
	dt   ir.DType
	make func() *trace.Array
	at   func(i int) float64
	sh   ir.Shape
}

func constOuts() []constOut {
	var out []constOut
	for _, dt := range ir.AllDTypes {
		if dt == ir.Bool {
			continue
		}
		v := -1.0 // 7 for unsigned dtypes
		if dt.IsUnsigned() {
			v = 7
		}
		out = append(out,
			constOut{name: "scalar " + dt.String(), dt: dt, sh: ir.Shape{}, make: func() *trace.Array { return trace.ScalarAs(v, dt) }, at: func(int) float64 { return v }},
			constOut{name: "full " + dt.String(), dt: dt, sh: ir.Shape{3}, make: func() *trace.Array { return trace.Full(ir.Shape{3}, 5, dt) }, at: func(int) float64 { return 5 }},
			constOut{name: "iota " + dt.String(), dt: dt, sh: ir.Shape{3}, make: func() *trace.Array { return trace.Iota(dt, ir.Shape{3}, 0) }, at: func(i int) float64 { return float64(i) }},
			constOut{name: "iota+1 " + dt.String(), dt: dt, sh: ir.Shape{3}, make: func() *trace.Array {
				return trace.Add(trace.Iota(dt, ir.Shape{3}, 0), trace.Full(ir.Shape{3}, 1, dt))
			}, at: func(i int) float64 { return float64(i + 1) }},
			constOut{name: "iota2 " + dt.String(), dt: dt, sh: ir.Shape{2, 3}, make: func() *trace.Array { return trace.Iota(dt, ir.Shape{2, 3}, 1) }, at: func(i int) float64 { return float64(i % 3) }},
		)
	}
	out = append(out,
		constOut{name: "scalar bool", dt: ir.Bool, sh: ir.Shape{}, make: func() *trace.Array { return trace.ScalarAs(1, ir.Bool) }, at: func(int) float64 { return 1 }},
		constOut{name: "full bool", dt: ir.Bool, sh: ir.Shape{3}, make: func() *trace.Array { return trace.Full(ir.Shape{3}, 1, ir.Bool) }, at: func(int) float64 { return 1 }})
	return out
}

// A scan body whose ys and new carry are constants or iotas (no operands,
// so nothing of the iteration flows into them) gives, jitted and eager, for
// 1 to 5 iterations, the constant in every slice of the ys and as the final
// carry, with the right dtypes and shapes. The ys slices of small outputs sit
// at offsets that are not 8-byte aligned.
func TestScanConstantOutputs(t *testing.T) {
	r := newRand(t)
	outs := constOuts()
	for _, n := range []int{1, 2, 3, 5} {
		for _, jit := range []bool{true, false} {
			// Each run takes a random handful of the outputs: as ys, and one
			// as the carry.
			perm := r.Perm(len(outs))
			for len(perm) > 0 {
				k := min(len(perm), 1+r.IntN(4))
				sel := perm[:k]
				perm = perm[k:]
				carryOut := outs[sel[0]]
				runConstScan(t, r, n, jit, carryOut, sel, outs)
			}
		}
	}
}

func runConstScan(t *testing.T, r *rand.Rand, n int, jit bool, carryOut constOut, sel []int, outs []constOut) {
	t.Helper()
	what := fmt.Sprintf("n=%d jit=%v carry=%s", n, jit, carryOut.name)
	fn := func(init *trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, _ []*trace.Array) ([]*trace.Array, []*trace.Array) {
			var ys []*trace.Array
			for _, k := range sel {
				ys = append(ys, outs[k].make())
			}
			return []*trace.Array{carryOut.make()}, ys
		}, []*trace.Array{init}, nil, trace.ScanLength(n))
		return append(c, ys...)
	}
	// The initial carry: random values of the carry's type.
	l := ir.NewLiteral(ir.TypeOf(carryOut.dt, carryOut.sh...))
	for i := range l.Type.Size() {
		l.SetFloat64At(i, float64(r.IntN(100)))
	}
	init, err := rt.FromLiteral(l)
	require.NoError(t, err)
	var got []*trace.Array
	if jit {
		got = rt.Jit(fn)(init)
	} else {
		got = fn(init)
	}
	require.Len(t, got, 1+len(sel), what)
	check := func(a *trace.Array, o constOut, shape ir.Shape, slices int, what string) {
		require.Equal(t, o.dt, a.DType(), what)
		require.Equal(t, shape, a.Shape(), what)
		lit, err := a.Literal()
		require.NoError(t, err, what)
		sz := o.sh.Size()
		for s := range slices {
			for i := range sz {
				require.Equal(t, o.at(i), lit.Float64At(s*sz+i), "%s: slice %d element %d", what, s, i)
			}
		}
	}
	check(got[0], carryOut, carryOut.sh, 1, what+": carry")
	for j, k := range sel {
		o := outs[k]
		check(got[1+j], o, append(ir.Shape{n}, o.sh...), n, fmt.Sprintf("%s: ys %d (%s)", what, j, o.name))
	}
}
