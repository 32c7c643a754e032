package optim_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// withDeviceCapacity gives the device pool a capacity of n bytes (the platform
// allocator: a set of buffers fits iff their sizes add up to at most n) for
// the rest of the test.
func withDeviceCapacity(t *testing.T, n int64) {
	t.Helper()
	require.NoError(t, rt.ConfigureMemory(rt.MemoryConfig{Capacity: n, Allocator: rt.AllocatorPlatform}))
	t.Cleanup(func() { restoreMemory(t) })
}

// restoreMemory puts back the pools of the environment's settings
// (FERRY_DEVICE_MEMORY and the others; unlimited when unset).
func restoreMemory(t *testing.T) {
	cfg, err := rt.MemoryConfigFromEnv()
	require.NoError(t, err)
	require.NoError(t, rt.ConfigureMemory(cfg))
}

// freeAtEnd deletes the concrete leaves of trees when the test ends (before
// withDeviceCapacity's cleanup, if registered after it), so that the pools
// can be replaced without waiting for the garbage collector.
func freeAtEnd(t *testing.T, trees ...any) {
	t.Cleanup(func() {
		for _, tree := range trees {
			for _, x := range trace.Leaves(tree) {
				_ = x.Delete()
			}
		}
	})
}

// bigParams is a parameters tree of 2·n f32 elements in device memory.
func bigParams(n int) Params {
	return Params{W: trace.Zeros(ir.Shape{n}, ir.Float32), B: trace.Zeros(ir.Shape{n}, ir.Float32)}
}

// Init returns an *OutOfMemoryError, not a panic, when the state does not fit
// in device memory, and frees the part of the state it made.
func TestInitOutOfMemoryIsAnError(t *testing.T) {
	const n = 1 << 14 // 64 KiB per leaf
	for _, c := range optCases() {
		t.Run(c.name, func(t *testing.T) {
			withDeviceCapacity(t, 3*4*n) // the params and one more leaf, no more
			p := bigParams(n)
			freeAtEnd(t, p)
			var err error
			require.NotPanics(t, func() { _, err = c.opt.init(p) })
			if c.moments == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			var oom *rt.OutOfMemoryError
			require.True(t, errors.As(err, &oom), "%v", err)
			require.Equal(t, ir.Device, oom.Space)
			require.ErrorContains(t, err, "out of memory")
			// The params and maybe scalar constants (garbage) are left, not
			// the leaves made before the allocation that failed.
			require.Less(t, rt.MemoryStats(ir.Device).BytesInUse, int64(3*4*n), "the state made before failing is freed")
		})
	}
}

// InitIn builds the state straight in pinned_host: with a device capacity
// that holds the params but not the state, it succeeds, the device peak stays
// at the params' bytes, and every leaf is in pinned_host and zero. Init and
// ToSpace (the old recipe) runs out of device memory there.
func TestInitInPinnedHostNeverUsesDevice(t *testing.T) {
	const n = 1 << 14
	paramBytes := int64(2 * 4 * n)
	for _, c := range optCases() {
		t.Run(c.name, func(t *testing.T) {
			withDeviceCapacity(t, paramBytes+4*n/2) // room for half a leaf more
			p := bigParams(n)
			freeAtEnd(t, p)
			before := rt.MemoryStats(ir.Device).BytesInUse // the params and garbage scalars
			require.Less(t, before, paramBytes+64)
			rt.ResetPeakMemory()
			s, err := c.opt.initIn(p, ir.PinnedHost)
			require.NoError(t, err)
			freeAtEnd(t, s)
			require.Equal(t, before, rt.MemoryStats(ir.Device).PeakBytesInUse, "device peak")
			want := c.moments * paramBytes
			var hostBytes int64
			for _, x := range trace.Leaves(s) {
				require.Equal(t, ir.PinnedHost, x.Space())
				for _, v := range x.Float64s() {
					require.Zero(t, v)
				}
				if x.Rank() > 0 {
					hostBytes += x.Type().Bytes()
				}
			}
			require.Equal(t, want, hostBytes, "the state's arrays")

			if c.moments > 0 {
				var oldErr error
				require.NotPanics(t, func() {
					var s0 any
					if s0, oldErr = c.opt.init(p); oldErr == nil {
						freeAtEnd(t, s0)
						_, oldErr = optim.ToSpace(s0, ir.PinnedHost)
					}
				})
				var oom *rt.OutOfMemoryError
				require.True(t, errors.As(oldErr, &oom), "Init then ToSpace: %v", oldErr)
			}
		})
	}
}

// InitIn into pinned_host reports a full pinned_host pool as an error too.
func TestInitInHostOutOfMemory(t *testing.T) {
	const n = 1 << 12
	require.NoError(t, rt.ConfigureMemory(rt.MemoryConfig{HostCapacity: 4 * n, Allocator: rt.AllocatorPlatform}))
	t.Cleanup(func() { restoreMemory(t) })
	p := bigParams(n)
	freeAtEnd(t, p)
	_, err := optim.InitIn(optim.Adam[Params](optim.Constant(1), 0.9, 0.999, 1e-8), p, ir.PinnedHost)
	var oom *rt.OutOfMemoryError
	require.True(t, errors.As(err, &oom), "%v", err)
	require.Equal(t, ir.PinnedHost, oom.Space)
	require.Zero(t, rt.MemoryStats(ir.PinnedHost).BytesInUse, "the leaves made before are freed")
}

// Abstract params give an abstract state of the right types in the space
// asked for, and InitIn works while tracing.
func TestInitInAbstractAndTraced(t *testing.T) {
	opt := optim.Chain(optim.ClipByGlobalNorm[Params](1), optim.Adam[Params](optim.Constant(1), 0.9, 0.999, 1e-8))
	ap := Params{W: trace.Abstract(ir.TypeOf(ir.BFloat16, 1000, 1000)), B: trace.Abstract(ir.TypeOf(ir.Float32, 1000))}
	s, err := optim.InitIn(opt, ap, ir.PinnedHost)
	require.NoError(t, err)
	require.True(t, s.Second.Mu.W.IsAbstract())
	require.Equal(t, ir.TypeOf(ir.BFloat16, 1000, 1000).WithSpace(ir.PinnedHost), s.Second.Nu.W.Type())
	require.Equal(t, ir.TypeOf(ir.Int32).WithSpace(ir.PinnedHost), s.Second.Count.Type())

	initFn := rt.Jit(func(p Params) (optim.AdamState[Params], error) {
		return optim.InitIn(optim.Adam[Params](optim.Constant(1), 0.9, 0.999, 1e-8), p, ir.PinnedHost)
	})
	st, err := initFn(toParams(randVec(newRand(t), 16, 1)))
	require.NoError(t, err)
	require.Equal(t, ir.PinnedHost, st.Mu.W.Space())
	require.Equal(t, ir.PinnedHost, st.Count.Space())
	require.Equal(t, make([]float32, 12), st.Nu.W.Float32s())
}
