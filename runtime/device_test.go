package runtime_test

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// poolSnapshot is the statistics of every pool of every device.
type poolSnapshot map[[2]int]rt.MemStats

func snapshotPools(t *testing.T) poolSnapshot {
	t.Helper()
	out := poolSnapshot{}
	for _, d := range rt.Devices() {
		for _, sp := range ir.AllSpaces {
			s, err := rt.DeviceMemoryStats(d, sp)
			require.NoError(t, err)
			require.Equal(t, d.ID, s.Device)
			require.Equal(t, sp, s.Space)
			out[[2]int{d.ID, int(sp)}] = s
		}
	}
	return out
}

func randFloats(rng *rand.Rand, n int) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	return xs
}

func cpuDev(id int) rt.Device { return rt.Device{Platform: "cpu", ID: id, Kind: "cpu"} }

// With four virtual devices, an array put on a device is there (DeviceOf,
// its values), committed, and counted in that device's pool only.
func TestVirtualDevicesPlacement(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	devs := rt.Devices()
	require.Len(t, devs, 4)
	for i, d := range devs {
		require.Equal(t, cpuDev(i), d)
		require.Equal(t, fmt.Sprintf("cpu:%d(cpu)", i), d.String())
	}
	rng := testseed.Rand(t, 1)
	var keep []*trace.Array
	for range 12 {
		d := devs[rng.IntN(4)]
		n := 1 + rng.IntN(5000)
		data := randFloats(rng, n)
		x := rt.FromSlice(data)
		dx, err := rt.DeviceOf(x)
		require.NoError(t, err)
		require.Equal(t, devs[0], dx, "arrays are made on the default device")
		require.False(t, rt.IsCommitted(x))

		before := snapshotPools(t)
		y, err := rt.ToDevice(x, d)
		require.NoError(t, err)
		after := snapshotPools(t)
		keep = append(keep, y)

		dy, err := rt.DeviceOf(y)
		require.NoError(t, err)
		require.Equal(t, d, dy)
		require.True(t, rt.IsCommitted(y))
		require.Equal(t, data, y.Float32s())
		held := (int64(4*n) + 63) / 64 * 64
		for k, s := range after {
			b := before[k]
			if k == [2]int{d.ID, int(ir.Device)} {
				require.Equal(t, b.BytesInUse+held, s.BytesInUse, "device pool of %v", d)
				require.Equal(t, b.NumAllocs+1, s.NumAllocs)
				require.Equal(t, b.LiveAllocs+1, s.LiveAllocs)
			} else {
				require.Equal(t, b.BytesInUse, s.BytesInUse, "pool %v", k)
				require.Equal(t, b.NumAllocs, s.NumAllocs, "pool %v", k)
			}
		}
		// Already committed there: the same array, nothing allocated.
		z, err := rt.ToDevice(y, d)
		require.NoError(t, err)
		require.Same(t, y, z)
		require.NoError(t, x.Delete())
	}
	// A pinned_host array goes to the device's pinned_host pool.
	h := trace.DevicePut(rt.FromSlice(randFloats(rng, 100)), ir.PinnedHost)
	before := snapshotPools(t)
	h3, err := rt.ToDevice(h, devs[3])
	require.NoError(t, err)
	require.Equal(t, ir.PinnedHost, h3.Space())
	after := snapshotPools(t)
	k := [2]int{3, int(ir.PinnedHost)}
	require.Equal(t, before[k].BytesInUse+448, after[k].BytesInUse)
	for kk, s := range after {
		if kk != k {
			require.Equal(t, before[kk].NumAllocs, s.NumAllocs, "pool %v", kk)
		}
	}
	for _, y := range keep {
		require.NoError(t, y.Delete())
	}
	for _, s := range snapshotPools(t) {
		if s.Device != 0 {
			require.Equal(t, s.Device == 3 && s.Space == ir.PinnedHost, s.BytesInUse > 0, "%+v", s)
		}
	}
}

// Each device has its own capacity: filling one device's pool is an
// out-of-memory error naming that device, while the others have room.
func TestVirtualDeviceOutOfMemory(t *testing.T) {
	for _, alloc := range []string{rt.AllocatorBFC, rt.AllocatorPlatform} {
		t.Run(alloc, func(t *testing.T) {
			const capacity = 1 << 20
			rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4, Capacity: capacity, Allocator: alloc})
			wantLimit := int64(capacity)
			if alloc == rt.AllocatorBFC {
				wantLimit = capacity * 3 / 4 // FERRY_MEM_FRACTION applies per device
			}
			for _, d := range rt.Devices() {
				s, err := rt.DeviceMemoryStats(d, ir.Device)
				require.NoError(t, err)
				require.Equal(t, int64(capacity), s.Capacity, "%v", d)
				require.Equal(t, wantLimit, s.Limit, "%v", d)
				require.Zero(t, s.Reserved, "%v: nothing reserved before first use", d)
			}
			rng := testseed.Rand(t, 2)
			n := int(wantLimit/4) - 16*(1+rng.IntN(100)) // fills most of a device
			big := &ir.Literal{Type: ir.TypeOf(ir.Float32, n), Data: make([]byte, 4*n)}
			x1, err := rt.FromLiteralOn(big, cpuDev(1))
			require.NoError(t, err)
			d1, _ := rt.DeviceOf(x1)
			require.Equal(t, 1, d1.ID)
			_, site := rt.FromSlice([]float32{0}), here() // device 0 stays nearly empty

			_, err = rt.FromLiteralOn(big, cpuDev(1))
			var oom *rt.OutOfMemoryError
			require.ErrorAs(t, err, &oom)
			require.Equal(t, 1, oom.Device)
			require.Equal(t, 4, oom.Devices)
			require.Equal(t, ir.Device, oom.Space)
			require.Equal(t, int64(4*n), oom.Requested)
			require.Len(t, oom.Largest, 1, "the report lists device 1's buffers only")
			require.Equal(t, 1, oom.Largest[0].Device)
			require.Contains(t, err.Error(), "out of memory in device memory of cpu:1: cannot allocate")
			require.NotContains(t, err.Error(), site)

			// The other devices have room for the same array.
			for _, id := range []int{0, 2, 3} {
				y, err := rt.FromLiteralOn(big, cpuDev(id))
				require.NoError(t, err, "device %d", id)
				require.NoError(t, y.Delete())
			}
			// A computation on device 1 that needs another buffer of that
			// size runs out there too.
			f := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Add(x, x) })
			_, err = f.Call(x1)
			require.ErrorAs(t, err, &oom)
			require.Equal(t, 1, oom.Device)
			require.Contains(t, err.Error(), "of cpu:1")
			require.NoError(t, x1.Delete())
		})
	}
}

// A jitted function runs on the device of its (committed) arguments and
// allocates its results, temporaries and host outputs there only; eager ops
// too. Scalars made on the default device follow the committed operand.
func TestJitRunsOnArgumentsDevice(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	rng := testseed.Rand(t, 3)
	n := 100 + rng.IntN(2000)
	xs, ys := randFloats(rng, n), randFloats(rng, n)
	dev2 := rt.Devices()[2]
	x, err := rt.ToDevice(rt.FromSlice(xs), dev2)
	require.NoError(t, err)
	y, err := rt.ToDevice(rt.FromSlice(ys), dev2)
	require.NoError(t, err)

	f := rt.Jit(func(x, y *trace.Array) (*trace.Array, *trace.Array) {
		z := trace.Add(trace.Mul(x, y), trace.Exp(x))
		return trace.Mul(z, trace.Scalar(0.5)), trace.Sum(z)
	}, rt.OutSpace(1, ir.PinnedHost))
	f(x, y) // traced once (tracing makes its scalar on the default device)
	rt.ResetPeakMemory()
	before := snapshotPools(t)
	z, s := f(x, y)
	after := snapshotPools(t)
	for _, out := range []*trace.Array{z, s} {
		d, err := rt.DeviceOf(out)
		require.NoError(t, err)
		require.Equal(t, dev2, d)
		require.True(t, rt.IsCommitted(out))
	}
	require.Equal(t, ir.PinnedHost, s.Space())
	var sum float64
	for i, v := range z.Float32s() {
		want := float64(xs[i])*float64(ys[i]) + math.Exp(float64(xs[i]))
		sum += want
		require.InDelta(t, 0.5*want, float64(v), 1e-5*(1+math.Abs(want)))
	}
	require.InDelta(t, sum, float64(s.Item()), 1e-4*(1+math.Abs(sum)))
	for k, a := range after {
		b := before[k]
		if k[0] == 2 {
			require.Greater(t, a.NumAllocs, b.NumAllocs, "pool %v", k)
			continue
		}
		require.Equal(t, b.NumAllocs, a.NumAllocs, "pool %v allocated", k)
		require.Equal(t, b.BytesInUse, a.PeakBytesInUse, "pool %v peak", k)
	}

	// Eager ops on device 2 run there as well, with the weak scalar moved.
	before = snapshotPools(t)
	w := trace.Add(x, rt.Scalar(1))
	d, err := rt.DeviceOf(w)
	require.NoError(t, err)
	require.Equal(t, dev2, d)
	require.True(t, rt.IsCommitted(w))
	for i, v := range w.Float32s() {
		require.InDelta(t, float64(xs[i])+1, float64(v), 1e-6)
	}
	after = snapshotPools(t)
	k := [2]int{2, int(ir.Device)}
	require.Equal(t, before[k].BytesInUse+(int64(4*n)+63)/64*64, after[k].BytesInUse, "w alone is on device 2: the scalar's copy is freed")
	for _, id := range []int{1, 3} {
		for _, sp := range ir.AllSpaces {
			k := [2]int{id, int(sp)}
			require.Equal(t, before[k].NumAllocs, after[k].NumAllocs, "pool %v", k)
		}
	}

	// Uncommitted arguments run on device 0, uncommitted.
	u := trace.Add(rt.FromSlice(xs), rt.FromSlice(ys))
	d, _ = rt.DeviceOf(u)
	require.Equal(t, 0, d.ID)
	require.False(t, rt.IsCommitted(u))
}

// Committed arguments on different devices are an error naming them, their
// devices and the caller's line, for jitted functions and eager ops; no
// copy is made.
func TestMixedDeviceArguments(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	rng := testseed.Rand(t, 5)
	// The sources on device 0 are deleted now, not left to the garbage
	// collector, whose finalizer could free them between the snapshots.
	x0, y0 := rt.FromSlice(randFloats(rng, 8)), rt.FromSlice(randFloats(rng, 8))
	x, err := rt.ToDevice(x0, rt.Devices()[1])
	require.NoError(t, err)
	y, err := rt.ToDevice(y0, rt.Devices()[3])
	require.NoError(t, err)
	require.NoError(t, x0.Delete())
	require.NoError(t, y0.Delete())
	f := rt.NewJitted(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) })
	before := snapshotPools(t)
	line := hereLine() + 1
	_, err = f.Call(x, y)
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{"argument 0 (f32[8]) is committed to cpu:1", "argument 1 (f32[8]) to cpu:3", fmt.Sprintf("device_test.go:%d", line)} {
		require.Contains(t, msg, want)
	}
	require.Equal(t, before, snapshotPools(t), "nothing allocated or copied")

	// A tree argument names its leaf.
	g := rt.NewJitted(func(p []*trace.Array) *trace.Array { return trace.Add(p[0], p[1]) })
	_, err = g.Call([]*trace.Array{x, y})
	require.ErrorContains(t, err, "leaf 0 of argument 0 (f32[8]) is committed to cpu:1 and leaf 1 of argument 0 (f32[8]) to cpu:3")

	var te *trace.Error
	func() {
		defer func() {
			r := recover()
			require.NotNil(t, r)
			var ok bool
			te, ok = r.(*trace.Error)
			require.True(t, ok, "%v", r)
		}()
		line = hereLine() + 1
		trace.Add(x, y)
	}()
	require.Equal(t, line, te.Line)
	require.Contains(t, te.Error(), "operand 0 (f32[8]) is committed to cpu:1 and operand 1 (f32[8]) to cpu:3")

	// A donated argument is never copied to another device.
	h := rt.NewJitted(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) }, rt.Donate(0))
	_, err = h.Call(rt.FromSlice(randFloats(rng, 8)), y)
	require.ErrorContains(t, err, "argument 0 (f32[8]) is donated but on cpu:0")
}

// ResetPeakMemory resets the peaks of every device's pools.
func TestResetPeakAllDevices(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	rng := testseed.Rand(t, 6)
	var keep []*trace.Array
	// Every source on device 0 is deleted at once (not left to a garbage
	// collector's finalizer, which could free it after the peaks are
	// reset).
	onDevice := func(n int, d rt.Device) *trace.Array {
		src := rt.FromSlice(randFloats(rng, n))
		a, err := rt.ToDevice(src, d)
		require.NoError(t, err)
		if a != src {
			require.NoError(t, src.Delete())
		}
		return a
	}
	for _, d := range rt.Devices() {
		tmp := onDevice(1000+rng.IntN(1000), d)
		keep = append(keep, onDevice(10, d))
		require.NoError(t, tmp.Delete())
	}
	for _, s := range snapshotPools(t) {
		if s.Space == ir.Device && s.Device > 0 {
			require.Greater(t, s.PeakBytesInUse, s.BytesInUse, "device %d", s.Device)
		}
	}
	rt.ResetPeakMemory()
	for _, s := range snapshotPools(t) {
		require.Equal(t, s.BytesInUse, s.PeakBytesInUse, "device %d %v", s.Device, s.Space)
	}
	for _, k := range keep {
		require.NoError(t, k.Delete())
	}
}

// LiveArrays attributes every array to its device.
func TestLiveArraysDevices(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	rng := testseed.Rand(t, 7)
	want := map[int]int{}
	var keep []*trace.Array
	for range 10 {
		id := rng.IntN(4)
		n := 1 + rng.IntN(300)
		l := &ir.Literal{Type: ir.TypeOf(ir.Int32, n), Data: make([]byte, 4*n)}
		x, err := rt.FromLiteralOn(l, cpuDev(id))
		require.NoError(t, err)
		keep = append(keep, x)
		want[id]++
	}
	got := map[int]int{}
	for _, l := range rt.LiveArrays() {
		require.Equal(t, "cpu", l.Platform)
		require.True(t, strings.HasPrefix(l.Site, "runtime/device_test.go:"), l.Site)
		got[l.Device]++
	}
	require.Equal(t, want, got)
	// The memory profile labels each sample with its device.
	var buf bytes.Buffer
	require.NoError(t, rt.SaveDeviceMemoryProfile(&buf))
	p, err := profile.Parse(&buf)
	require.NoError(t, err)
	got = map[int]int{}
	for _, smp := range p.Sample {
		var id int
		_, err := fmt.Sscanf(smp.Label["device"][0], "cpu:%d", &id)
		require.NoError(t, err)
		got[id]++
	}
	require.Equal(t, want, got)
	for _, x := range keep {
		require.NoError(t, x.Delete())
	}
	require.Empty(t, rt.LiveArrays())
}

// With the default configuration there is one device, cpu:0, and naming
// another is an error.
func TestOneDeviceByDefault(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	require.Equal(t, []rt.Device{cpuDev(0)}, rt.Devices())
	x := rt.FromSlice([]float32{1, 2, 3})
	d, err := rt.DeviceOf(x)
	require.NoError(t, err)
	require.Equal(t, cpuDev(0), d)
	s, err := rt.DeviceMemoryStats(d, ir.Device)
	require.NoError(t, err)
	require.Equal(t, rt.MemoryStats(ir.Device), s)
	_, err = rt.ToDevice(x, cpuDev(1))
	require.ErrorContains(t, err, "no device cpu:1: the cpu backend has cpu:0 (set FERRY_CPU_DEVICES")
	_, err = rt.DeviceMemoryStats(rt.Device{Platform: "cuda"}, ir.Device)
	require.ErrorContains(t, err, "no device cuda:0")
	_, err = rt.DeviceOf(trace.Abstract(x.Type()))
	require.ErrorContains(t, err, "abstract")
	_, err = rt.DeviceOf(nil)
	require.Error(t, err)
	// Committed to device 0 is still device 0.
	y, err := rt.ToDevice(x, d)
	require.NoError(t, err)
	require.True(t, rt.IsCommitted(y))
	require.Equal(t, []float32{2, 4, 6}, trace.Add(y, x).Float32s())
}

// FERRY_CPU_DEVICES sets the number of devices the pools are made with;
// SetCPUDeviceCount changes it, keeping the memory settings.
func TestCPUDevicesFromEnv(t *testing.T) {
	t.Setenv(rt.EnvCPUDevices, "3")
	t.Setenv(rt.EnvDeviceMemory, "1MiB")
	rt.ResetMemoryForTest()
	t.Cleanup(rt.ResetMemoryForTest)
	require.Len(t, rt.Devices(), 3)
	s, err := rt.DeviceMemoryStats(cpuDev(2), ir.Device)
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), s.Capacity)

	require.NoError(t, rt.SetCPUDeviceCount(5))
	require.Len(t, rt.Devices(), 5)
	s, err = rt.DeviceMemoryStats(cpuDev(4), ir.Device)
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), s.Capacity, "the capacity is kept")
	require.Error(t, rt.SetCPUDeviceCount(0))

	for _, bad := range []string{"0", "-1", "two", "100000"} {
		t.Setenv(rt.EnvCPUDevices, bad)
		_, err := rt.MemoryConfigFromEnv()
		require.ErrorContains(t, err, "FERRY_CPU_DEVICES", bad)
	}
	_, err = rt.MemoryConfig{Devices: -2}.Normalized()
	require.Error(t, err)
	// A bad setting fails every allocation with the reason.
	rt.ResetMemoryForTest()
	_, err = rt.NewArray([]float32{1})
	require.ErrorContains(t, err, "FERRY_CPU_DEVICES")
	var oom *rt.OutOfMemoryError
	require.False(t, errors.As(err, &oom))
}

// Compiled.CallOn runs a program on a named device: one without arguments
// allocates there only; uncommitted arguments are copied there; an
// argument committed elsewhere is an error.
func TestCompiledCallOn(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	rng := testseed.Rand(t, 8)
	n := 10 + rng.IntN(1000)
	low, err := rt.Lower(func() *trace.Array {
		return trace.Mul(trace.Iota(ir.Float32, []int{n}, 0), trace.Full([]int{n}, 2, ir.Float32))
	})
	require.NoError(t, err)
	c, err := low.Compile()
	require.NoError(t, err)
	dev3 := rt.Devices()[3]
	before := snapshotPools(t)
	outs, err := c.CallOn(dev3)
	require.NoError(t, err)
	after := snapshotPools(t)
	y := outs[0].(*trace.Array)
	d, err := rt.DeviceOf(y)
	require.NoError(t, err)
	require.Equal(t, dev3, d)
	require.True(t, rt.IsCommitted(y))
	for i, v := range y.Float32s() {
		require.Equal(t, float32(2*i), v)
	}
	for k, a := range after {
		if k[0] != 3 {
			require.Equal(t, before[k].NumAllocs, a.NumAllocs, "pool %v", k)
		}
	}
	require.Greater(t, after[[2]int{3, int(ir.Device)}].NumAllocs, before[[2]int{3, int(ir.Device)}].NumAllocs)

	f, err := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Neg(x) }).Lower(rt.FromSlice(make([]float32, 4)))
	require.NoError(t, err)
	neg, err := f.Compile()
	require.NoError(t, err)
	xs := randFloats(rng, 4)
	outs, err = neg.CallOn(dev3, rt.FromSlice(xs)) // uncommitted: copied to cpu:3
	require.NoError(t, err)
	d, _ = rt.DeviceOf(outs[0].(*trace.Array))
	require.Equal(t, dev3, d)
	for i, v := range outs[0].(*trace.Array).Float32s() {
		require.Equal(t, -xs[i], v)
	}
	x1, err := rt.ToDevice(rt.FromSlice(xs), rt.Devices()[1])
	require.NoError(t, err)
	_, err = neg.CallOn(dev3, x1)
	require.ErrorContains(t, err, "argument 0 (f32[4]) is committed to cpu:1 but the call runs on cpu:3")
	_, err = neg.CallOn(rt.Device{Platform: "cpu", ID: 4}, x1)
	require.ErrorContains(t, err, "no device cpu:4")
}

// One jitted function called concurrently on every device (as a program
// per device will be) computes each device's values there.
func TestDevicesRunConcurrently(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	f := rt.Jit(func(x, y *trace.Array) *trace.Array { return trace.Sub(trace.Mul(x, x), y) })
	rng := testseed.Rand(t, 9)
	const n = 257
	type job struct {
		x, y   *trace.Array
		xs, ys []float32
	}
	jobs := make([]job, 4)
	for i, d := range rt.Devices() {
		xs, ys := randFloats(rng, n), randFloats(rng, n)
		hx, hy := rt.FromSlice(xs), rt.FromSlice(ys)
		x, err := rt.ToDevice(hx, d)
		require.NoError(t, err)
		y, err := rt.ToDevice(hy, d)
		require.NoError(t, err)
		require.NoError(t, hx.Delete())
		require.NoError(t, hy.Delete())
		jobs[i] = job{x, y, xs, ys}
	}
	before := snapshotPools(t)
	errs := make(chan error, 4)
	for i, j := range jobs {
		go func() {
			for range 20 {
				z := f(j.x, j.y)
				if d, err := rt.DeviceOf(z); err != nil || d.ID != i {
					errs <- fmt.Errorf("device %d: result on %v, %v", i, d, err)
					return
				}
				for k, v := range z.Float32s() {
					want := float64(j.xs[k])*float64(j.xs[k]) - float64(j.ys[k])
					if math.Abs(float64(v)-want) > 1e-5*(1+math.Abs(want)) {
						errs <- fmt.Errorf("device %d: element %d is %v, want %v", i, k, v, want)
						return
					}
				}
				z.Delete()
			}
			errs <- nil
		}()
	}
	for range jobs {
		require.NoError(t, <-errs)
	}
	after := snapshotPools(t)
	for d := range 4 {
		k := [2]int{d, int(ir.Device)}
		require.GreaterOrEqual(t, after[k].NumAllocs-before[k].NumAllocs, int64(20), "device %d", d)
		require.Equal(t, before[k].BytesInUse, after[k].BytesInUse, "device %d: results deleted", d)
	}
}
