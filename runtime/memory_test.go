package runtime_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// here returns "runtime/memory_test.go:N" for the line that calls it.
func here() string {
	_, file, line, _ := goruntime.Caller(1)
	i := strings.LastIndexByte(file, '/')
	j := strings.LastIndexByte(file[:i], '/')
	return fmt.Sprintf("%s:%d", file[j+1:], line)
}

// hereLine returns the number of the line that calls it.
func hereLine() int {
	_, _, line, _ := goruntime.Caller(1)
	return line
}

// exact is a bfc pool whose limit is the whole capacity.
func exact(capacity int64) rt.MemoryConfig { return rt.MemoryConfig{Capacity: capacity, Fraction: 1} }

func deviceStats() rt.MemStats { return rt.MemoryStats(ir.Device) }

// waitFreed collects garbage until the device pool's BytesInUse is want.
func waitFreed(t *testing.T, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for deviceStats().BytesInUse != want {
		if time.Now().After(deadline) {
			t.Fatalf("BytesInUse = %d, want %d after GC", deviceStats().BytesInUse, want)
		}
		goruntime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestParseMemorySize(t *testing.T) {
	good := map[string]int64{
		"123":         123,
		"1e9":         1_000_000_000,
		"64MiB":       64 << 20,
		"64mib":       64 << 20,
		"1.5GiB":      3 << 29,
		"512MB":       512_000_000,
		"2 KiB":       2048,
		" 7B ":        7,
		"1TiB":        1 << 40,
		"2.5e3KB":     2_500_000,
		"1.9":         1,
		"17179869184": 16 << 30,
	}
	for s, want := range good {
		got, err := rt.ParseMemorySize(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "abc", "64M", "12 parsecs", "-5", "0", "0.5", "1e30", "1.5.3GiB", "0x10", "NaN", "inf", "MiB", "99999999999999999999"} {
		_, err := rt.ParseMemorySize(s)
		require.Error(t, err, s)
		require.Contains(t, err.Error(), "bad memory size", s)
	}
	_, err := rt.ParseMemorySize("64M")
	require.ErrorContains(t, err, "MiB")
}

func TestMemoryConfigFromEnv(t *testing.T) {
	for _, k := range []string{rt.EnvDeviceMemory, rt.EnvHostMemory, rt.EnvAllocator, rt.EnvPreallocate, rt.EnvMemFraction} {
		t.Setenv(k, "")
	}
	c, err := rt.MemoryConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, int64(0), c.Capacity)
	require.Equal(t, "bfc", c.Allocator)
	require.True(t, *c.Preallocate)
	require.Equal(t, 0.75, c.Fraction)

	t.Setenv(rt.EnvDeviceMemory, "1.5GiB")
	t.Setenv(rt.EnvHostMemory, "unlimited")
	t.Setenv(rt.EnvAllocator, "platform")
	t.Setenv(rt.EnvPreallocate, "false")
	t.Setenv(rt.EnvMemFraction, "0.5")
	c, err = rt.MemoryConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, int64(3<<29), c.Capacity)
	require.Equal(t, int64(0), c.HostCapacity)
	require.Equal(t, "platform", c.Allocator)
	require.False(t, *c.Preallocate)
	require.Equal(t, 0.5, c.Fraction)

	for k, v := range map[string]string{rt.EnvDeviceMemory: "lots", rt.EnvHostMemory: "-1", rt.EnvAllocator: "cuda_async", rt.EnvPreallocate: "maybe", rt.EnvMemFraction: "1.5"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			_, err := rt.MemoryConfigFromEnv()
			require.ErrorContains(t, err, k)
		})
	}
}

func TestBadEnvironmentFailsAllocations(t *testing.T) {
	t.Setenv(rt.EnvDeviceMemory, "lots")
	rt.ResetMemoryForTest() // re-read the environment at next use
	t.Cleanup(rt.ResetMemoryForTest)
	_, _, err := rt.MemoryPools().Alloc(ir.Device, 10, "x")
	require.ErrorContains(t, err, rt.EnvDeviceMemory)
	_, err = rt.NewArray([]float32{1})
	if err == nil {
		_, err = rt.FromSlice([]float32{1}).Literal()
	}
	require.ErrorContains(t, err, `"lots"`)
}

func TestConfigureMemoryValidates(t *testing.T) {
	for _, c := range []rt.MemoryConfig{{Capacity: -1}, {HostCapacity: -1}, {Allocator: "magic"}, {Fraction: 1.5}, {Fraction: -0.1}} {
		require.Error(t, rt.ConfigureMemory(c), "%+v", c)
	}
}

func TestLimits(t *testing.T) {
	f := false
	cases := []struct {
		cfg                   rt.MemoryConfig
		limit, hostLimit      int64
		reservedAfterFirstUse int64
	}{
		{rt.MemoryConfig{Capacity: 64 << 20}, 48 << 20, 0, 48 << 20},                             // 75 %, pre-allocated
		{rt.MemoryConfig{Capacity: 64 << 20, Fraction: 0.5}, 32 << 20, 0, 32 << 20},              // fraction
		{rt.MemoryConfig{Capacity: 64 << 20, Preallocate: &f}, 48 << 20, 0, 2 << 20},             // growth: first region 2 MiB
		{rt.MemoryConfig{Capacity: 1000, Fraction: 1}, 960, 0, 960},                              // rounded down to 64 bytes
		{rt.MemoryConfig{Capacity: 64 << 20, Allocator: "platform"}, 64 << 20, 0, 64},            // platform: whole capacity, exact sizes
		{rt.MemoryConfig{HostCapacity: 1 << 20}, 0, 1 << 20, 2 << 20},                            // unlimited device: grows
		{rt.MemoryConfig{HostCapacity: 1000, Allocator: "platform", Fraction: 0.1}, 0, 1000, 64}, // the fraction is for the device
	}
	for _, c := range cases {
		rt.SetMemoryForTest(t, c.cfg)
		s := deviceStats()
		require.Equal(t, c.limit, s.Limit, "%+v", c.cfg)
		require.Equal(t, c.cfg.Capacity, s.Capacity)
		require.Equal(t, c.hostLimit, rt.MemoryStats(ir.PinnedHost).Limit, "%+v", c.cfg)
		require.Zero(t, s.Reserved)
		x := rt.FromSlice(make([]float32, 16))
		require.Equal(t, c.reservedAfterFirstUse, deviceStats().Reserved, "%+v", c.cfg)
		require.NoError(t, x.Delete())
	}
}

func TestPlatformAllocator(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Capacity: 1000, Allocator: "platform"})
	pools := rt.MemoryPools()
	a, relA, err := pools.Alloc(ir.Device, 600, "a")
	require.NoError(t, err)
	b, relB, err := pools.Alloc(ir.Device, 400, "b") // exactly full
	require.NoError(t, err)
	for _, m := range [][]byte{a, b} {
		require.Zero(t, uintptr(unsafePointer(m))%64)
	}
	s := deviceStats()
	require.Equal(t, int64(1000), s.BytesInUse)
	require.Equal(t, int64(1000), s.Reserved)
	require.Zero(t, s.LargestFreeBlock)
	require.Zero(t, s.Fragmentation)
	require.Equal(t, "platform", s.Allocator)
	_, _, err = pools.Alloc(ir.Device, 1, "one byte too many")
	var oom *rt.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Equal(t, int64(1000), oom.InUse)
	relB()
	relB() // releasing twice is harmless
	require.Equal(t, int64(600), deviceStats().BytesInUse)
	_, relC, err := pools.Alloc(ir.Device, 400, "c")
	require.NoError(t, err)
	relA()
	relC()
	s = deviceStats()
	require.Zero(t, s.BytesInUse)
	require.Zero(t, s.Reserved)
	require.Equal(t, int64(1000), s.PeakBytesInUse)
	require.Equal(t, int64(3), s.NumAllocs)
}

func TestAllocZeroesAndAligns(t *testing.T) {
	for _, alloc := range []string{"bfc", "platform"} {
		rt.SetMemoryForTest(t, rt.MemoryConfig{Capacity: 1 << 20, Allocator: alloc, Fraction: 1})
		pools := rt.MemoryPools()
		for _, n := range []int64{1, 63, 64, 65, 1000, 4096, 100_000} {
			m, rel, err := pools.Alloc(ir.Device, n, "x")
			require.NoError(t, err)
			require.Len(t, m, int(n))
			require.Equal(t, int(n), cap(m))
			require.Zero(t, uintptr(unsafePointer(m))%64, "%s %d", alloc, n)
			for i := range m {
				if m[i] != 0 {
					t.Fatalf("%s: byte %d of %d not zero", alloc, i, n)
				}
				m[i] = 0xee
			}
			rel()
		}
		m, rel, err := pools.Alloc(ir.Device, 0, "empty")
		require.NoError(t, err)
		require.Empty(t, m)
		rel()
		_, _, err = pools.Alloc(ir.Device, -1, "negative")
		require.Error(t, err)
	}
}

func TestOutOfMemoryReport(t *testing.T) {
	rt.SetMemoryForTest(t, exact(1<<20))
	big, bigSite := rt.FromSlice(make([]float32, 128<<10)), here() // 512 KiB
	small, smallSite := rt.FromSlice(make([]int32, 1000), 10, 100), here()
	pools := rt.MemoryPools()
	scratch, relScratch, err := pools.Alloc(ir.Device, 100<<10, "temp arena of g")
	require.NoError(t, err)
	scratchSite := here()
	_ = scratch

	_, _, err = pools.Alloc(ir.Device, 600<<10, "output 0 of f")
	var oom *rt.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Equal(t, ir.Device, oom.Space)
	require.Equal(t, int64(600<<10), oom.Requested)
	require.Equal(t, "output 0 of f", oom.What)
	require.Equal(t, "bfc", oom.Allocator)
	require.Equal(t, int64(1<<20), oom.Capacity)
	require.Equal(t, int64(1<<20), oom.Limit)
	require.Equal(t, int64(512<<10+4032+100<<10), oom.InUse)
	require.Equal(t, int64(1<<20)-oom.InUse, oom.LargestFree)
	require.Equal(t, int64(3), oom.LiveAllocs)
	require.Len(t, oom.Largest, 3)
	require.Equal(t, "f32[131072]", oom.Largest[0].Type.String())
	require.Equal(t, bigSite, oom.Largest[0].Site)
	require.Equal(t, "temp arena of g", oom.Largest[1].What)
	require.False(t, oom.Largest[1].IsArray)
	require.Equal(t, scratchSite[:strings.LastIndexByte(scratchSite, ':')], oom.Largest[1].Site[:strings.LastIndexByte(oom.Largest[1].Site, ':')])
	require.Equal(t, "i32[10,100]", oom.Largest[2].Type.String())
	require.Equal(t, smallSite, oom.Largest[2].Site)

	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{
		"out of memory in device memory: cannot allocate 600 KiB (614400 bytes) for output 0 of f",
		"capacity 1 MiB (1048576 bytes)",
		"512 KiB  f32[131072]  made at " + bigSite,
		"temp arena of g",
		"i32[10,100]  made at " + smallSite,
		rt.EnvDeviceMemory,
	} {
		require.Contains(t, msg, want)
	}

	// The pool is still usable: a smaller request fits.
	m, rel, err := pools.Alloc(ir.Device, 400<<10, "smaller")
	require.NoError(t, err)
	require.Len(t, m, 400<<10)
	rel()
	// Deleting the big array frees 512 KiB at the start of the slab, but the
	// small array and the arena split the free memory in two.
	require.NoError(t, big.Delete())
	s := deviceStats()
	require.Equal(t, int64(512<<10), s.LargestFreeBlock)
	require.InDelta(t, 1-float64(512<<10)/float64(1<<20-4032-100<<10), s.Fragmentation, 1e-12)
	_, _, err = pools.Alloc(ir.Device, 600<<10, "output 0 of f")
	require.ErrorAs(t, err, &oom)
	// Freeing them coalesces everything: now it fits.
	relScratch()
	require.NoError(t, small.Delete())
	s = deviceStats()
	require.Equal(t, int64(1<<20), s.LargestFreeBlock)
	require.Zero(t, s.Fragmentation)
	_, rel, err = pools.Alloc(ir.Device, 600<<10, "output 0 of f")
	require.NoError(t, err)
	rel()
	require.Zero(t, deviceStats().BytesInUse)
}

func TestOutOfMemoryForArrays(t *testing.T) {
	rt.SetMemoryForTest(t, exact(64<<10))
	x, err := rt.NewArray(make([]float32, 32<<10)) // 128 KiB > 64 KiB
	if err == nil {
		_, err = x.Literal()
	}
	var oom *rt.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Equal(t, "array", oom.What)
	require.Equal(t, int64(128<<10), oom.Requested)
	y := rt.FromSlice([]float32{1, 2, 3})
	require.Equal(t, []float32{1, 2, 3}, y.Float32s())
}

func TestHostPool(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Capacity: 1 << 20, HostCapacity: 4096, Fraction: 1})
	l, err := ir.LiteralOf(ir.Shape{2, 256}, make([]float32, 512)) // 2 KiB
	require.NoError(t, err)
	l.Type.Space = ir.PinnedHost
	h, err := rt.FromLiteral(l)
	require.NoError(t, err)
	require.Equal(t, ir.PinnedHost, h.Space())
	require.Equal(t, int64(2048), rt.MemoryStats(ir.PinnedHost).BytesInUse)
	require.Zero(t, deviceStats().BytesInUse)
	_, _, err = rt.MemoryPools().Alloc(ir.PinnedHost, 4000, "offload")
	var oom *rt.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Equal(t, ir.PinnedHost, oom.Space)
	require.Contains(t, err.Error(), rt.EnvHostMemory)
	require.NoError(t, h.Delete())
}

func TestGrowthMode(t *testing.T) {
	f := false
	rt.SetMemoryForTest(t, rt.MemoryConfig{Capacity: 8 << 20, Fraction: 1, Preallocate: &f})
	pools := rt.MemoryPools()
	_, rel1, err := pools.Alloc(ir.Device, 1024, "a")
	require.NoError(t, err)
	require.Equal(t, int64(2<<20), deviceStats().Reserved)
	_, rel2, err := pools.Alloc(ir.Device, 3<<20, "b") // new region of max(3 MiB, 4 MiB)
	require.NoError(t, err)
	require.Equal(t, int64(6<<20), deviceStats().Reserved)
	_, _, err = pools.Alloc(ir.Device, 5<<19, "c") // 2.5 MiB: no free chunk fits, 2 MiB left to grow
	var oom *rt.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Equal(t, int64(6<<20), oom.Reserved)
	rel2()
	_, rel3, err := pools.Alloc(ir.Device, 5<<19, "c") // fits the freed region
	require.NoError(t, err)
	rel3()
	rel1()
	// All free: empty regions are given back when a request needs the room.
	_, rel4, err := pools.Alloc(ir.Device, 7<<20, "d")
	require.NoError(t, err)
	require.Equal(t, int64(8<<20), deviceStats().Reserved)
	rel4()
}

func TestDelete(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	x := rt.FromSlice([]float32{1, 2, 3})
	require.Equal(t, int64(64), deviceStats().BytesInUse) // 12 bytes rounded to 64
	require.NoError(t, x.Delete())
	site := here()
	require.Zero(t, deviceStats().BytesInUse)
	_, err := x.Literal()
	require.ErrorIs(t, err, rt.ErrDeleted)
	require.NotErrorIs(t, err, rt.ErrDonated)
	require.ErrorContains(t, err, "f32[3] was deleted at "+site[:strings.LastIndexByte(site, ':')])
	require.NoError(t, x.Delete()) // twice is fine
	require.Contains(t, x.String(), "deleted")
	require.Panics(t, func() { x.Float32s() })
}

func TestFreedWhenUnreachable(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	keep := rt.FromSlice(make([]float32, 100))
	func() {
		for i := 0; i < 10; i++ {
			x := rt.FromSlice(make([]float32, 1000))
			y := trace.Neg(x) // eager op: its output is pool memory too
			require.Equal(t, float32(0), y.Float32s()[0])
		}
	}()
	require.Greater(t, deviceStats().BytesInUse, int64(448))
	waitFreed(t, 448) // only keep's 400 bytes, rounded to 448
	require.Equal(t, int64(21), deviceStats().NumAllocs)
	goruntime.KeepAlive(keep)
}

func TestGarbageIsCollectedBeforeOOM(t *testing.T) {
	rt.SetMemoryForTest(t, exact(1<<20))
	for i := 0; i < 20; i++ {
		x, err := rt.NewArray(make([]float32, 100<<10)) // 400 KiB; two fit
		require.NoError(t, err)
		_, err = x.Literal()
		require.NoError(t, err, "iteration %d", i)
	}
}

func TestPeakAndReset(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	a := rt.FromSlice(make([]float32, 1000))
	b := rt.FromSlice(make([]float32, 1000))
	s := deviceStats()
	require.Equal(t, int64(8064), s.BytesInUse)
	require.Equal(t, int64(8064), s.PeakBytesInUse)
	require.Equal(t, int64(2), s.NumAllocs)
	require.Equal(t, int64(2), s.LiveAllocs)
	require.NoError(t, a.Delete())
	s = deviceStats()
	require.Equal(t, int64(4032), s.BytesInUse)
	require.Equal(t, int64(8064), s.PeakBytesInUse)
	rt.ResetPeakMemory()
	require.Equal(t, int64(4032), deviceStats().PeakBytesInUse)
	require.NoError(t, b.Delete())
	require.Equal(t, int64(4032), deviceStats().PeakBytesInUse)
}

func TestLiveArrays(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	require.Empty(t, rt.LiveArrays())
	a, siteA := rt.FromSlice(make([]float32, 10), 2, 5), here()
	b, siteB := rt.FromSlice(make([]float64, 100)), here()
	l, err := ir.LiteralOf(ir.Shape{50}, make([]int32, 50))
	require.NoError(t, err)
	l.Type.Space = ir.PinnedHost
	c, err := rt.FromLiteral(l)
	require.NoError(t, err)
	siteC := here()
	_, rel, err := rt.MemoryPools().Alloc(ir.Device, 1<<20, "temp arena") // not an array
	require.NoError(t, err)
	defer rel()
	live := rt.LiveArrays()
	require.Len(t, live, 3)
	require.Equal(t, "f64[100]", live[0].Type.String())
	require.Equal(t, int64(800), live[0].Bytes)
	require.Equal(t, siteB, live[0].Site)
	require.Equal(t, "i32[50]{pinned_host}", live[1].Type.String())
	require.Equal(t, ir.PinnedHost, live[1].Space)
	require.Equal(t, int64(200), live[1].Bytes)
	require.Equal(t, siteC[:strings.LastIndexByte(siteC, ':')], live[1].Site[:strings.LastIndexByte(live[1].Site, ':')])
	require.Equal(t, "f32[2,5]", live[2].Type.String())
	require.Equal(t, siteA, live[2].Site)
	require.Equal(t, ir.Device, live[2].Space)
	for _, x := range live {
		require.True(t, x.IsArray)
		require.Equal(t, "array", x.What)
		require.GreaterOrEqual(t, x.Age, time.Duration(0))
	}
	require.Equal(t, "800 B f64[100] at "+siteB, live[0].String())
	for _, x := range []*trace.Array{a, b, c} {
		require.NoError(t, x.Delete())
	}
	require.Empty(t, rt.LiveArrays())
}

func TestConfigureMemoryWhileLive(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	x, site := rt.FromSlice(make([]float32, 1000)), here()
	err := rt.ConfigureMemory(exact(1 << 20))
	require.ErrorContains(t, err, "1 buffers are still live")
	require.ErrorContains(t, err, site)
	require.Equal(t, "", deviceStats().Allocator[:0]) // stats still readable
	require.Zero(t, deviceStats().Capacity)           // unchanged
	require.NoError(t, x.Delete())
	require.NoError(t, rt.ConfigureMemory(exact(1<<20)))
	require.Equal(t, int64(1<<20), deviceStats().Capacity)
	// Unreachable arrays do not block reconfiguration: they are collected.
	func() { rt.FromSlice(make([]float32, 1000)) }()
	require.NoError(t, rt.ConfigureMemory(rt.MemoryConfig{Allocator: "platform"}))
	require.Equal(t, "platform", deviceStats().Allocator)
}

func TestDeviceMemoryProfile(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	x, xLine := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3), hereLine()
	y := rt.FromSlice(make([]int32, 256))
	_, rel, err := rt.MemoryPools().Alloc(ir.Device, 1000, "temp arena of f")
	require.NoError(t, err)
	defer rel()

	var buf bytes.Buffer
	require.NoError(t, rt.SaveDeviceMemoryProfile(&buf))
	p, err := profile.Parse(&buf)
	require.NoError(t, err)
	require.NoError(t, p.CheckValid())
	require.Equal(t, "space", p.DefaultSampleType)
	require.Equal(t, []string{"allocations/count", "space/bytes"}, []string{p.SampleType[0].Type + "/" + p.SampleType[0].Unit, p.SampleType[1].Type + "/" + p.SampleType[1].Unit})
	require.Len(t, p.Sample, 3)
	sort.Slice(p.Sample, func(i, j int) bool { return p.Sample[i].Value[1] > p.Sample[j].Value[1] })
	got := make([]string, 3)
	for i, s := range p.Sample {
		got[i] = fmt.Sprintf("%v %s %s %s %s %s", s.Value, s.Label["space"], s.Label["kind"], s.Label["dtype"], s.Label["shape"], s.Label["what"])
		require.Equal(t, []int64{s.Value[1]}, s.NumLabel["bytes"])
		require.NotEmpty(t, s.Location)
	}
	require.Equal(t, []string{
		"[1 1024] [device] [array] [i32] [[256]] [array]",
		"[1 1000] [device] [scratch] [] [] [temp arena of f]",
		"[1 24] [device] [array] [f32] [[2,3]] [array]",
	}, got)
	// x's stack reaches this test at the line that made it.
	found := false
	for _, loc := range p.Sample[2].Location {
		for _, ln := range loc.Line {
			if strings.HasSuffix(ln.Function.Name, ".TestDeviceMemoryProfile") && ln.Line == int64(xLine) {
				found = true
			}
		}
	}
	require.True(t, found, "no frame of TestDeviceMemoryProfile at line %d in the profile", xLine)
	require.NoError(t, x.Delete())
	require.NoError(t, y.Delete())
}

func TestConcurrentAllocation(t *testing.T) {
	for _, alloc := range []string{"bfc", "platform"} {
		t.Run(alloc, func(t *testing.T) {
			rt.SetMemoryForTest(t, rt.MemoryConfig{Capacity: 8 << 20, Fraction: 1, Allocator: alloc})
			pools := rt.MemoryPools()
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 3))
					for i := 0; i < 150; i++ {
						switch i % 3 {
						case 0, 1:
							n := int64(1 + r.IntN(64<<10))
							m, rel, err := pools.Alloc(ir.Device, n, "scratch")
							if err != nil {
								errs <- err
								return
							}
							fill := byte(g + 1)
							for j := range m {
								m[j] = fill
							}
							for j := range m {
								if m[j] != fill {
									errs <- fmt.Errorf("goroutine %d: memory overwritten", g)
									return
								}
							}
							rel()
						case 2:
							v := make([]float32, 1+r.IntN(1000))
							for j := range v {
								v[j] = float32(g*1000 + j)
							}
							x := rt.FromSlice(v)
							if got := x.Float32s(); len(got) != len(v) || got[len(v)-1] != v[len(v)-1] {
								errs <- errors.New("array contents changed")
								return
							}
							_ = rt.MemoryStats(ir.Device)
							_ = rt.LiveArrays()
							if err := x.Delete(); err != nil {
								errs <- err
								return
							}
						}
					}
				}(g)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			s := deviceStats()
			require.Zero(t, s.BytesInUse)
			require.Equal(t, int64(8*150), s.NumAllocs)
			if alloc == "bfc" {
				require.Equal(t, s.Reserved, s.LargestFreeBlock) // everything coalesced back
			}
		})
	}
}
