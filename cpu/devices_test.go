package cpu

import (
	"errors"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Every device has its own pools: AllocOn, FromLiteralOn and executions on
// a device count there only, and the backend lists the devices.
func TestDevicesHaveTheirOwnPools(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{Devices: 3, Capacity: 1 << 20, HostCapacity: 1 << 19})
	be := cpuBackend{}
	require.Equal(t, 3, MemoryPools().NumDevices())
	require.Equal(t, []backend.Device{{Platform: "cpu", ID: 0, Kind: "cpu"}, {Platform: "cpu", ID: 1, Kind: "cpu"}, {Platform: "cpu", ID: 2, Kind: "cpu"}}, be.Devices())
	rng := testseed.Rand(t, 11)
	want := map[[2]int]int64{}
	var rels []func()
	for range 20 {
		dev, sp := rng.IntN(3), ir.AllSpaces[rng.IntN(len(ir.AllSpaces))]
		n := int64(1 + rng.IntN(10000))
		_, rel, err := MemoryPools().AllocOn(dev, sp, n, "scratch")
		require.NoError(t, err)
		rels = append(rels, rel)
		want[[2]int{dev, int(sp)}] += (n + 63) / 64 * 64
	}
	for dev := range 3 {
		for _, sp := range ir.AllSpaces {
			s, ok := DeviceMemoryStats(dev, sp)
			require.True(t, ok)
			require.Equal(t, dev, s.Device)
			require.Equal(t, want[[2]int{dev, int(sp)}], s.BytesInUse, "device %d %v", dev, sp)
			bs, ok := be.MemoryStats(dev, sp)
			require.True(t, ok)
			require.Equal(t, s.BytesInUse, bs.BytesInUse)
			require.Equal(t, dev, bs.Device)
		}
		s, _ := DeviceMemoryStats(dev, ir.PinnedHost)
		require.Equal(t, int64(1<<19), s.Capacity, "FERRY_HOST_MEMORY applies per device")
	}
	for _, a := range be.LiveAllocations() {
		require.Less(t, a.Device, 3)
		require.Equal(t, "scratch", a.What)
	}
	require.Equal(t, MemoryStats(ir.Device), MemoryPools().stats(0, ir.Device), "MemoryStats is device 0's")
	_, ok := DeviceMemoryStats(3, ir.Device)
	require.False(t, ok)
	_, ok = be.MemoryStats(3, ir.Device)
	require.False(t, ok)
	_, _, err := MemoryPools().AllocOn(5, ir.Device, 10, "x")
	require.ErrorContains(t, err, "no device cpu:5: the CPU backend has 3 devices")
	for _, rel := range rels {
		rel()
	}

	// A buffer made on device 2 is there, committed; an execution on it
	// runs there and its results are committed if asked.
	b, err := be.FromLiteralOn(f32Literal(t, 1, 2, 3), 2)
	require.NoError(t, err)
	require.Equal(t, 2, b.(backend.DeviceBuffer).Device())
	require.True(t, b.(backend.DeviceBuffer).Committed())
	_, err = be.FromLiteralOn(f32Literal(t, 1), 3)
	require.ErrorContains(t, err, "no device cpu:3")
	x := trace.FromBuffer(b)
	before := [3]int64{}
	for d := range 3 {
		before[d] = MemoryPools().stats(d, ir.Device).NumAllocs
	}
	exe := compileAdd(t, x)
	res, err := exe.Execute([]trace.Buffer{b, b}, backend.ExecOptions{Device: 2, Commit: true})
	require.NoError(t, err)
	dev, committed := backend.BufferDevice(res[0])
	require.Equal(t, 2, dev)
	require.True(t, committed)
	l, err := res[0].Literal()
	require.NoError(t, err)
	require.Equal(t, []float32{2, 4, 6}, ir.View[float32](l))
	for d := range 3 {
		got := MemoryPools().stats(d, ir.Device).NumAllocs
		if d == 2 {
			require.Greater(t, got, before[d])
		} else {
			require.Equal(t, before[d], got, "device %d", d)
		}
	}
	// Arguments not on the execution's device, or a device that does not
	// exist, are errors.
	_, err = exe.Execute([]trace.Buffer{b, b}, backend.ExecOptions{Device: 1})
	require.ErrorContains(t, err, "argument 0 (f32[3]) is on cpu:2, but the call runs on cpu:1")
	_, err = exe.Execute([]trace.Buffer{b, b}, backend.ExecOptions{Device: 7})
	require.ErrorContains(t, err, "no device cpu:7")
}

// compileAdd compiles x + y for arrays of x's type.
func compileAdd(t *testing.T, x *trace.Array) backend.Executable {
	tr := trace.NewFuncTracer("add")
	px, py := tr.ParamLike(x), tr.ParamLike(x)
	tr.Push()
	r := trace.Add(px, py)
	tr.Pop()
	out := tr.Output(r)
	tr.Close()
	f := tr.Func()
	f.Body.Results = []*ir.Value{out}
	exe, err := cpuBackend{}.Compile(f, backend.CompileOptions{})
	require.NoError(t, err)
	return exe
}

// Each device's bfc pool pre-allocates its own slab at its first use only,
// and runs out of memory on its own.
func TestDevicePreallocationAndOOM(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{Devices: 4, Capacity: 1 << 20})
	_, rel, err := MemoryPools().AllocOn(2, ir.Device, 1000, "x")
	require.NoError(t, err)
	defer rel()
	for d := range 4 {
		s := MemoryPools().stats(d, ir.Device)
		if d == 2 {
			require.Equal(t, int64(3<<18), s.Reserved, "the slab of 0.75 MiB")
		} else {
			require.Zero(t, s.Reserved, "device %d", d)
		}
	}
	_, _, err = MemoryPools().AllocOn(2, ir.Device, 3<<18, "too much")
	var oom *backend.OutOfMemoryError
	require.True(t, errors.As(err, &oom))
	require.Equal(t, 2, oom.Device)
	require.Equal(t, 4, oom.Devices)
	require.Contains(t, oom.Error(), "out of memory in device memory of cpu:2: cannot allocate 768 KiB")
	_, rel3, err := MemoryPools().AllocOn(3, ir.Device, 3<<18, "fits")
	require.NoError(t, err)
	rel3()
}

// SetDeviceCount keeps the other settings and refuses while buffers are live.
func TestSetDeviceCount(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{Capacity: 1 << 20, Allocator: backend.AllocatorPlatform})
	require.NoError(t, SetDeviceCount(2))
	require.Len(t, cpuBackend{}.Devices(), 2)
	s, _ := DeviceMemoryStats(1, ir.Device)
	require.Equal(t, int64(1<<20), s.Capacity)
	require.Equal(t, backend.AllocatorPlatform, s.Allocator)
	b, err := newBuffer(f32Literal(t, 1))
	require.NoError(t, err)
	require.ErrorContains(t, SetDeviceCount(3), "still live")
	require.NoError(t, b.Delete())
	require.Error(t, SetDeviceCount(0))
	require.Error(t, SetDeviceCount(backend.MaxCPUDevices+1))
	require.Len(t, cpuBackend{}.Devices(), 2)
}
