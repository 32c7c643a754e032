package runtime_test

import (
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// shardCase is a mesh and a spec to shard arrays of a given rank with.
type shardCase struct {
	name    string
	shape   []int    // mesh axis sizes
	axes    []string // mesh axis names
	devices []int    // nil: 0, 1, …
	spec    ir.PartitionSpec
	rank    int
}

func shardCases() []shardCase {
	perm8 := []int{3, 0, 7, 5, 1, 6, 2, 4}
	return []shardCase{
		{"8/rows", []int{8}, []string{"x"}, nil, ir.P("x", ""), 2},
		{"8/cols", []int{8}, []string{"x"}, nil, ir.P("", "x"), 2},
		{"8/replicated", []int{8}, []string{"x"}, nil, ir.P(), 2},
		{"8perm/rows", []int{8}, []string{"x"}, perm8, ir.P("x"), 2},
		{"8perm/vector", []int{8}, []string{"x"}, perm8, ir.P("x"), 1},
		{"8/scalar", []int{8}, []string{"x"}, nil, nil, 0},
		{"2x4/rows", []int{2, 4}, []string{"x", "y"}, nil, ir.P("x", ""), 2},
		{"2x4perm/cols", []int{2, 4}, []string{"x", "y"}, perm8, ir.P("", "y"), 2},
		{"2x4perm/both", []int{2, 4}, []string{"x", "y"}, perm8, ir.P("x", "y"), 2},
		{"2x4perm/transposed", []int{2, 4}, []string{"x", "y"}, perm8, ir.P("y", "x"), 2},
		{"2x4perm/replicated", []int{2, 4}, []string{"x", "y"}, perm8, ir.P(), 2},
		{"2x4perm/xy-rows", []int{2, 4}, []string{"x", "y"}, perm8, ir.PartitionSpec{{"x", "y"}, nil}, 2},
		{"2x4perm/yx-cols", []int{2, 4}, []string{"x", "y"}, perm8, ir.PartitionSpec{nil, {"y", "x"}}, 2},
		{"4x2perm/rows", []int{4, 2}, []string{"x", "y"}, []int{6, 7, 4, 5, 2, 3, 0, 1}, ir.P("x", ""), 2},
		{"4x2perm/both-3d", []int{4, 2}, []string{"x", "y"}, perm8, ir.P("y", "", "x"), 3},
		{"4x2/xy-middle-3d", []int{4, 2}, []string{"x", "y"}, nil, ir.PartitionSpec{nil, {"x", "y"}, nil}, 3},
	}
}

// sharding is the case's sharding.
func (c shardCase) sharding(t *testing.T) *ir.NamedSharding {
	t.Helper()
	mesh, err := ir.NewMesh(c.shape, c.axes, c.devices...)
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(mesh, c.spec)
	require.NoError(t, err)
	return s
}

// expectBounds computes, independently of ir, the block of a device at
// mesh position flat: mesh coordinates row-major, then for each dimension
// the block index over its axes (the first major).
func expectBounds(c shardCase, shape []int, flat int) (start, limit []int) {
	coords := make([]int, len(c.shape))
	for k := len(c.shape) - 1; k >= 0; k-- {
		coords[k] = flat % c.shape[k]
		flat /= c.shape[k]
	}
	start, limit = make([]int, len(shape)), make([]int, len(shape))
	for d := range shape {
		block, ways := 0, 1
		if d < len(c.spec) {
			for _, a := range c.spec[d] {
				k := indexOf(c.axes, a)
				block = block*c.shape[k] + coords[k]
				ways *= c.shape[k]
			}
		}
		size := shape[d] / ways
		start[d], limit[d] = block*size, (block+1)*size
	}
	return start, limit
}

func indexOf(xs []string, x string) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	panic(x)
}

// randShape returns a shape of the given rank whose dimensions the case's
// spec divides.
func randShape(rng *rand.Rand, c shardCase) []int {
	shape := make([]int, c.rank)
	for d := range shape {
		ways := 1
		if d < len(c.spec) {
			for _, a := range c.spec[d] {
				ways *= c.shape[indexOf(c.axes, a)]
			}
		}
		shape[d] = ways * (1 + rng.IntN(5))
	}
	return shape
}

// blockValues slices the block [start, limit) of the row-major array data of
// the given shape, by nested index arithmetic.
func blockValues[T any](data []T, shape, start, limit []int) []T {
	var out []T
	idx := append([]int{}, start...)
	n := 1
	for d := range shape {
		n *= limit[d] - start[d]
	}
	for range n {
		g := 0
		for d := range shape {
			g = g*shape[d] + idx[d]
		}
		out = append(out, data[g])
		for d := len(shape) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < limit[d] {
				break
			}
			idx[d] = start[d]
		}
	}
	return out
}

func bits(xs []float32) []uint32 {
	out := make([]uint32, len(xs))
	for i, x := range xs {
		out[i] = math.Float32bits(x)
	}
	return out
}

// held is the bytes a pool holds for an f32 buffer of n elements.
func held(n int) int64 { return (int64(4*n) + 63) / 64 * 64 }

// DevicePut puts on every mesh device exactly its block (replicas in full
// on each replica's device), in its pool only; the shards hold the slices
// of the original; gathering back is bit-exact; Delete frees every pool.
func TestDevicePutShards(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 8})
	rng := testseed.Rand(t, 2)
	for _, c := range shardCases() {
		t.Run(c.name, func(t *testing.T) {
			s := c.sharding(t)
			meshDevs := c.devices
			if meshDevs == nil {
				meshDevs = []int{0, 1, 2, 3, 4, 5, 6, 7}
			}
			for range 3 {
				shape := randShape(rng, c)
				n := ir.Shape(shape).Size()
				data := randFloats(rng, n)
				l, err := ir.LiteralOf(ir.Shape(shape), data)
				require.NoError(t, err)
				x := trace.FromLiteral(l)

				before := snapshotPools(t)
				y, err := rt.DevicePut(x, s)
				require.NoError(t, err)
				after := snapshotPools(t)

				require.True(t, y.HasType(x.Type().WithSharding(s)), "%v", y.Type())
				require.True(t, rt.IsCommitted(y))
				_, err = rt.DeviceOf(y)
				require.ErrorContains(t, err, "is sharded over devices")

				shards, err := rt.Shards(y)
				require.NoError(t, err)
				require.Len(t, shards, 8)
				perDevice := map[int]int64{}
				for flat, sh := range shards {
					id := meshDevs[flat]
					require.Equal(t, cpuDev(id), sh.Device, "shard %d", flat)
					start, limit := expectBounds(c, shape, flat)
					require.Equal(t, start, sh.Start, "shard %d", flat)
					require.Equal(t, limit, sh.Limit, "shard %d", flat)
					local := make([]int, len(shape))
					for d := range shape {
						local[d] = limit[d] - start[d]
					}
					require.True(t, sh.Array.HasType(ir.TypeOf(ir.Float32, local...)), "%v", sh.Array.Type())
					d, err := rt.DeviceOf(sh.Array)
					require.NoError(t, err)
					require.Equal(t, cpuDev(id), d)
					require.Equal(t, bits(blockValues(data, shape, start, limit)), bits(sh.Array.Float32s()), "shard %d on %d", flat, id)
					perDevice[id] += held(sh.Array.Size())
				}
				// Each device holds exactly its shard, in its own pool.
				for k, a := range after {
					b := before[k]
					if k[1] == int(ir.Device) {
						require.Equal(t, b.BytesInUse+perDevice[k[0]], a.BytesInUse, "device pool of cpu:%d", k[0])
						require.Equal(t, b.NumAllocs+1, a.NumAllocs, "device pool of cpu:%d", k[0])
					} else {
						require.Equal(t, b.BytesInUse, a.BytesInUse, "pool %v", k)
					}
				}
				// LiveArrays lists every shard on its device.
				live := map[int]int{}
				for _, la := range rt.LiveArrays() {
					if la.Platform == "cpu" && la.Space == ir.Device && la.Bytes == int64(4*shards[0].Array.Size()) && la.Type.Shape.Equal(shards[0].Array.Shape()) {
						live[la.Device]++
					}
				}
				for _, id := range meshDevs {
					require.GreaterOrEqual(t, live[id], 1, "live arrays of cpu:%d: %+v", id, rt.LiveArrays())
				}

				// The whole array, read or gathered onto any device, bit for bit.
				require.Equal(t, bits(data), bits(y.Float32s()))
				dev := rt.Devices()[rng.IntN(8)]
				g, err := rt.ToDevice(y, dev)
				require.NoError(t, err)
				require.True(t, g.HasType(x.Type()), "%v", g.Type())
				gd, err := rt.DeviceOf(g)
				require.NoError(t, err)
				require.Equal(t, dev, gd)
				require.Equal(t, bits(data), bits(g.Float32s()))
				require.NoError(t, g.Delete())

				// Putting it again with the same sharding is the same array.
				z, err := rt.DevicePut(y, s)
				require.NoError(t, err)
				require.Same(t, y, z)

				require.NoError(t, y.Delete())
				for k, a := range snapshotPools(t) {
					require.Equal(t, before[k].BytesInUse, a.BytesInUse, "pool %v after Delete", k)
				}
				_, err = y.Literal()
				require.ErrorContains(t, err, "deleted")
				require.NoError(t, x.Delete())
			}
		})
	}
}

// Resharding: an array sharded one way is put with another sharding (on
// other devices too) and keeps its values; pinned_host arrays stay there.
func TestDevicePutReshardAndSpace(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 8})
	rng := testseed.Rand(t, 3)
	m8, err := ir.NewMesh([]int{8}, []string{"x"})
	require.NoError(t, err)
	m24, err := ir.NewMesh([]int{2, 2}, []string{"a", "b"}, 6, 4, 2, 5)
	require.NoError(t, err)
	data := randFloats(rng, 16*8)
	x := rt.FromSlice(data)
	x2 := trace.Reshape(x, 16, 8)
	y, err := rt.DevicePut(x2, &ir.NamedSharding{Mesh: m8, Spec: ir.P("x")})
	require.NoError(t, err)
	z, err := rt.DevicePut(y, &ir.NamedSharding{Mesh: m24, Spec: ir.P("b", "a")})
	require.NoError(t, err)
	require.Equal(t, bits(data), bits(z.Float32s()))
	shards, err := rt.Shards(z)
	require.NoError(t, err)
	require.Len(t, shards, 4)
	for i, sh := range shards {
		require.Equal(t, []int{6, 4, 2, 5}[i], sh.Device.ID)
	}

	h := trace.DevicePut(x2, ir.PinnedHost)
	hs, err := rt.DevicePut(h, &ir.NamedSharding{Mesh: m8, Spec: ir.P("", "x")})
	require.NoError(t, err)
	require.Equal(t, ir.PinnedHost, hs.Space())
	shards, err = rt.Shards(hs)
	require.NoError(t, err)
	for _, sh := range shards {
		require.Equal(t, ir.PinnedHost, sh.Array.Space())
		st, err := rt.DeviceMemoryStats(sh.Device, ir.PinnedHost)
		require.NoError(t, err)
		require.GreaterOrEqual(t, st.BytesInUse, held(16))
	}
	require.Equal(t, bits(data), bits(hs.Float32s()))

	// An unsharded array is one shard, on its device.
	one, err := rt.Shards(x2)
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.Equal(t, []int{0, 0}, one[0].Start)
	require.Equal(t, []int{16, 8}, one[0].Limit)
	require.Same(t, x2, one[0].Array)
	for _, a := range []*trace.Array{x, x2, y, z, h, hs} {
		require.NoError(t, a.Delete())
	}
}

// requireErrorAt checks that err is a *trace.Error for this test file's
// line, whose message contains every part of want.
func requireErrorAt(t *testing.T, err error, line int, want ...string) {
	t.Helper()
	require.Error(t, err)
	t.Log(err)
	var te *trace.Error
	require.True(t, errors.As(err, &te), "%T: %v", err, err)
	require.Equal(t, fmt.Sprintf("runtime/sharded_test.go:%d", line), fmt.Sprintf("%s:%d", te.File, te.Line), "%v", err)
	for _, w := range want {
		require.Contains(t, err.Error(), w)
	}
}

func thisLine() int {
	_, _, line, _ := goruntime.Caller(1)
	return line
}

// Bad shardings are errors naming the problem and the caller's line.
func TestDevicePutErrors(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	x := trace.Reshape(rt.FromSlice(make([]float32, 24)), 6, 4)
	m4, err := ir.NewMesh([]int{4}, []string{"x"})
	require.NoError(t, err)
	m8, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	require.NoError(t, err)
	mHigh, err := ir.NewMesh([]int{2, 2}, []string{"x", "y"}, 0, 1, 2, 7)
	require.NoError(t, err)

	_, err = rt.DevicePut(x, &ir.NamedSharding{Mesh: m4, Spec: ir.P("x")})
	requireErrorAt(t, err, thisLine()-1, "DevicePut", "cannot shard f32[6,4]", "dimension 0", "has size 6", "mesh axis x (size 4) does not divide")
	_, err = rt.DevicePut(x, &ir.NamedSharding{Mesh: m4, Spec: ir.P("z")})
	requireErrorAt(t, err, thisLine()-1, `mesh axis "z"`, "does not have")
	_, err = rt.DevicePut(x, &ir.NamedSharding{Mesh: m4, Spec: ir.P("", "", "x")})
	requireErrorAt(t, err, thisLine()-1, "more than the 2 dimensions")
	_, err = rt.DevicePut(x, &ir.NamedSharding{Mesh: m8, Spec: ir.P("x", "y")})
	requireErrorAt(t, err, thisLine()-1, "mesh[x=2,y=4] needs 8 devices, the cpu backend has 4; set FERRY_CPU_DEVICES=8")
	_, err = rt.DevicePut(x, &ir.NamedSharding{Mesh: mHigh, Spec: ir.P("x", "y")})
	requireErrorAt(t, err, thisLine()-1, "uses device 7", "devices 0 to 3", "FERRY_CPU_DEVICES")
	_, err = rt.DevicePut(x, &ir.NamedSharding{Mesh: &ir.Mesh{}, Spec: ir.P("x")})
	requireErrorAt(t, err, thisLine()-1, "NewMesh")
	_, err = rt.DevicePut(x, &ir.NamedSharding{Spec: ir.P("x")})
	requireErrorAt(t, err, thisLine()-1, "has no mesh")
	_, err = rt.DevicePut(x, nil)
	requireErrorAt(t, err, thisLine()-1, "nil sharding", "rt.ToDevice")
	_, err = rt.DevicePut(nil, &ir.NamedSharding{Mesh: m4, Spec: ir.P("x")})
	requireErrorAt(t, err, thisLine()-1, "nil array")
	_, err = rt.DevicePut(trace.Abstract(ir.TypeOf(ir.Float32, 4)), &ir.NamedSharding{Mesh: m4, Spec: ir.P("x")})
	requireErrorAt(t, err, thisLine()-1, "abstract")
	// Nothing was left allocated on any device by the failures.
	for _, s := range snapshotPools(t) {
		if s.Device != 0 {
			require.Zero(t, s.BytesInUse, "%+v", s)
		}
	}
}

// Computations take sharded arrays: eager ops, Grad, Vmap and jitted calls
// (arguments, leaves of trees, captured arrays, lowering) run partitioned
// over the mesh and give the values of the unsharded computation; results
// are sharded arrays.
func TestShardedArraysComputed(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 8})
	mesh, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(mesh, ir.P("x", "y"))
	require.NoError(t, err)
	x := trace.Reshape(rt.FromSlice(randFloats(testseed.Rand(t, 2), 32)), 4, 8)
	y, err := rt.DevicePut(x, s)
	require.NoError(t, err)
	xv := x.Float32s()
	check := func(got *trace.Array, f func(v float32) float32) {
		t.Helper()
		require.NotNil(t, got.Type().Sharding, "%v is not sharded", got.Type())
		for i, v := range got.Float32s() {
			require.InDelta(t, f(xv[i]), v, 1e-5, "element %d", i)
		}
	}
	check(trace.Add(x, y), func(v float32) float32 { return 2 * v })
	check(trace.Exp(y), func(v float32) float32 { return float32(math.Exp(float64(v))) })
	var sum float64
	for _, v := range xv {
		sum += float64(v)
	}
	require.InDelta(t, sum, trace.Sum(y).Float64s()[0], 1e-4)
	check(trace.Grad(func(a *trace.Array) *trace.Array { return trace.Sum(trace.Mul(a, a)) })(y), func(v float32) float32 { return 2 * v })
	check(trace.Vmap(func(a *trace.Array) *trace.Array { return trace.Exp(a) })(y), func(v float32) float32 { return float32(math.Exp(float64(v))) })

	f := rt.Jit(func(a, b *trace.Array) (*trace.Array, error) { return trace.Mul(a, b), nil })
	got, err := f(x, y)
	require.NoError(t, err)
	check(got, func(v float32) float32 { return v * v })
	type pair struct{ A, B *trace.Array }
	h := rt.Jit(func(p pair) (*trace.Array, error) { return trace.Add(p.A, p.B), nil })
	got, err = h(pair{x, y})
	require.NoError(t, err)
	check(got, func(v float32) float32 { return 2 * v })
	captured := rt.Jit(func(a *trace.Array) (*trace.Array, error) { return trace.Add(a, y), nil })
	got, err = captured(x)
	require.NoError(t, err)
	check(got, func(v float32) float32 { return 2 * v })

	// A program compiled for an unsharded argument does not take a sharded one.
	c, err := rt.Lower(func(a *trace.Array) *trace.Array { return trace.Neg(a) }, x)
	require.NoError(t, err)
	cc, err := c.Compile()
	require.NoError(t, err)
	_, err = cc.Call(y)
	requireErrorAt(t, err, thisLine()-1, "argument leaf 0 is f32[4,8]{sharding<mesh[x=2,y=4], [x,y]>}, compiled for f32[4,8]")
	l, err := rt.Lower(func(a *trace.Array) *trace.Array { return trace.Neg(a) }, y)
	require.NoError(t, err)
	cs, err := l.Compile()
	require.NoError(t, err)
	_, err = cs.CallOn(rt.Devices()[3], y)
	requireErrorAt(t, err, thisLine()-1, "partitioned over mesh[x=2,y=4]")
	outs, err := cs.Call(y)
	require.NoError(t, err)
	check(outs[0].(*trace.Array), func(v float32) float32 { return -v })

	// Gathered, it computes on one device as usual.
	gy, err := rt.ToDevice(y, rt.Devices()[5])
	require.NoError(t, err)
	got, err = f(gy, gy)
	require.NoError(t, err)
	for i, v := range got.Float32s() {
		require.Equal(t, xv[i]*xv[i], v)
	}
	d, err := rt.DeviceOf(got)
	require.NoError(t, err)
	require.Equal(t, 5, d.ID)
	require.True(t, strings.HasPrefix(y.String(), "f32[4,8]"), y.String())
}

// Element sizes of 1, 2 and 8 bytes shard and gather alike.
func TestDevicePutDTypes(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 8})
	rng := testseed.Rand(t, 4)
	mesh, err := ir.NewMesh([]int{4, 2}, []string{"x", "y"}, 5, 1, 7, 3, 0, 6, 4, 2)
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(mesh, ir.P("y", "", "x"))
	require.NoError(t, err)
	shape := []int{2 * (1 + rng.IntN(3)), 1 + rng.IntN(3), 4 * (1 + rng.IntN(3))}
	n := shape[0] * shape[1] * shape[2]
	u8 := make([]uint8, n)
	bf := make([]ir.BF16, n)
	i64 := make([]int64, n)
	for i := range n {
		u8[i] = uint8(rng.IntN(256))
		bf[i] = ir.BF16(rng.Uint32())
		i64[i] = rng.Int64()
	}
	checkDTypeShards(t, s, shape, u8)
	checkDTypeShards(t, s, shape, bf)
	checkDTypeShards(t, s, shape, i64)
}

func checkDTypeShards[T ir.Native](t *testing.T, s *ir.NamedSharding, shape []int, data []T) {
	t.Helper()
	l, err := ir.LiteralOf(ir.Shape(shape), data)
	require.NoError(t, err)
	x := trace.FromLiteral(l)
	y, err := rt.DevicePut(x, s)
	require.NoError(t, err)
	shards, err := rt.Shards(y)
	require.NoError(t, err)
	c := shardCase{shape: []int{4, 2}, axes: []string{"x", "y"}, spec: s.Spec}
	for flat, sh := range shards {
		start, limit := expectBounds(c, shape, flat)
		require.Equal(t, start, sh.Start)
		sl, err := sh.Array.Literal()
		require.NoError(t, err)
		require.Equal(t, blockValues(data, shape, start, limit), ir.View[T](sl), "%v shard %d", l.Type.DType, flat)
	}
	g, err := rt.ToDevice(y, rt.Devices()[6])
	require.NoError(t, err)
	gl, err := g.Literal()
	require.NoError(t, err)
	require.Equal(t, data, ir.View[T](gl))
	for _, a := range []*trace.Array{x, y, g} {
		require.NoError(t, a.Delete())
	}
}

// A shard that does not fit its device is an out-of-memory error naming the
// device, and the shards already placed are freed.
func TestDevicePutOutOfMemory(t *testing.T) {
	const capacity = 1 << 14
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 8, Capacity: capacity, Allocator: rt.AllocatorPlatform})
	mesh, err := ir.NewMesh([]int{8}, []string{"x"})
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(mesh, ir.P("x"))
	require.NoError(t, err)
	// cpu:5 is nearly full.
	filler, err := rt.FromLiteralOn(ir.NewLiteral(ir.TypeOf(ir.Float32, capacity/4-128)), rt.Devices()[5])
	require.NoError(t, err)
	x := rt.FromSlice(make([]float32, 8*256)) // 1 KiB per device
	before := snapshotPools(t)
	_, err = rt.DevicePut(x, s)
	requireErrorAt(t, err, thisLine()-1, "DevicePut", "out of memory in device memory of cpu:5")
	for k, a := range snapshotPools(t) {
		require.Equal(t, before[k].BytesInUse, a.BytesInUse, "pool %v", k)
	}
	require.NoError(t, filler.Delete())
	y, err := rt.DevicePut(x, s)
	require.NoError(t, err)
	require.Equal(t, make([]float32, 8*256), y.Float32s())
	require.NoError(t, y.Delete())
	require.NoError(t, x.Delete())
}

// A sharded array that becomes garbage frees its shards, like any array.
func TestDevicePutGarbage(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 8})
	mesh, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(mesh, ir.P("", "y"))
	require.NoError(t, err)
	x := trace.FromLiteral(ir.NewLiteral(ir.TypeOf(ir.Float32, 8, 8)))
	before := snapshotPools(t)
	func() {
		y, err := rt.DevicePut(x, s)
		require.NoError(t, err)
		require.Len(t, y.Float32s(), 64)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		goruntime.GC()
		left := 0
		for k, a := range snapshotPools(t) {
			if a.BytesInUse != before[k].BytesInUse {
				left++
			}
		}
		if left == 0 {
			goruntime.KeepAlive(x)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pools still hold the garbage sharded array's shards", left)
		}
		time.Sleep(time.Millisecond)
	}
}

// Bad shardings given to a jitted function are errors naming the problem
// and the caller's line: an axis that does not divide the dimension it
// splits (InShardings, OutShardings, a constraint inside the function), a
// mesh with more devices than the backend has, more shardings than leaves.
func TestShardedJitErrors(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	x := trace.Reshape(rt.FromSlice(make([]float32, 24)), 6, 4)
	m4, err := ir.NewMesh([]int{4}, []string{"x"})
	require.NoError(t, err)
	m8, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	require.NoError(t, err)
	rows, err := ir.NewNamedSharding(m4, ir.P("x", ""))
	require.NoError(t, err)
	cols, err := ir.NewNamedSharding(m4, ir.P("", "x"))
	require.NoError(t, err)
	both, err := ir.NewNamedSharding(m8, ir.P("", "y"))
	require.NoError(t, err)
	neg := func(a *trace.Array) (*trace.Array, error) { return trace.Neg(a), nil }

	_, err = rt.Jit(neg, rt.InShardings(rows))(x)
	requireErrorAt(t, err, thisLine()-1, "WithShardingConstraint", "cannot shard f32[6,4]", "dimension 0 of shape [6,4] has size 6")
	_, err = rt.Jit(func(a *trace.Array) (*trace.Array, error) { return trace.Reshape(a, 4, 6), nil }, rt.OutShardings(cols))(x)
	requireErrorAt(t, err, thisLine()-1, "cannot shard f32[4,6]", "dimension 1 of shape [4,6] has size 6")
	_, err = rt.Jit(func(a *trace.Array) (*trace.Array, error) {
		return trace.WithShardingConstraint(trace.Neg(a), rows), nil // line -1 of the check
	})(x)
	requireErrorAt(t, err, thisLine()-2, "cannot shard f32[6,4]")
	_, err = rt.Jit(neg, rt.InShardings(both))(x)
	requireErrorAt(t, err, thisLine()-1, "mesh[x=2,y=4] needs 8 devices, the cpu backend has 4")
	_, err = rt.Jit(neg, rt.InShardings(cols, cols))(x)
	requireErrorAt(t, err, thisLine()-1, "InShardings has 2 entries for 1 arguments (with 1 array leaves)")
	_, err = rt.Jit(neg, rt.OutShardings(cols, cols))(x)
	requireErrorAt(t, err, thisLine()-1, "OutShardings has 2 entries for 1 results (with 1 array leaves)")

	// Laid out as asked, it runs on the mesh.
	y, err := rt.Jit(neg, rt.InShardings(cols))(x)
	require.NoError(t, err)
	require.True(t, y.Type().Sharding.EquivalentTo(cols, 2), "%v", y.Type())
	for _, v := range y.Float32s() {
		require.Equal(t, float32(0), v)
	}
}

// MakeShardedArray asks for each distinct block once, puts it on every
// device holding it, and gives the array DevicePut gives.
func TestMakeShardedArray(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 8})
	rng := testseed.Rand(t, 3)
	for _, c := range shardCases() {
		t.Run(c.name, func(t *testing.T) {
			s := c.sharding(t)
			shape := randShape(rng, c)
			n := ir.Shape(shape).Size()
			data := randFloats(rng, n)
			calls := map[string]int{}
			y, err := rt.MakeShardedArray(ir.TypeOf(ir.Float32, shape...).WithSharding(s), func(d rt.Device, start, limit []int) (*ir.Literal, error) {
				calls[fmt.Sprint(start)]++
				local := make(ir.Shape, len(shape))
				for i := range shape {
					local[i] = limit[i] - start[i]
				}
				return ir.LiteralOf(local, blockValues(data, shape, start, limit))
			})
			require.NoError(t, err)
			require.True(t, y.HasType(ir.TypeOf(ir.Float32, shape...).WithSharding(s)), "%v", y.Type())
			for k, v := range calls {
				require.Equal(t, 1, v, "block %s asked for %d times", k, v)
			}
			shards, err := rt.Shards(y)
			require.NoError(t, err)
			require.Len(t, shards, 8)
			require.Len(t, calls, s.NumShards())
			for flat, sh := range shards {
				start, limit := expectBounds(c, shape, flat)
				require.Equal(t, start, sh.Start)
				require.Equal(t, limit, sh.Limit)
				require.Equal(t, bits(blockValues(data, shape, start, limit)), bits(sh.Array.Float32s()), "shard %d", flat)
			}
			require.Equal(t, bits(data), bits(y.Float32s()))
			require.NoError(t, y.Delete())
		})
	}
}

func TestMakeShardedArrayErrors(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 8})
	mesh, err := ir.NewMesh([]int{8}, []string{"x"})
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(mesh, ir.P("x"))
	require.NoError(t, err)
	zero := func(_ rt.Device, start, limit []int) (*ir.Literal, error) {
		return ir.NewLiteral(ir.TypeOf(ir.Float32, limit[0]-start[0])), nil
	}
	_, err = rt.MakeShardedArray(ir.TypeOf(ir.Float32, 16), zero)
	require.ErrorContains(t, err, "has no sharding")
	_, err = rt.MakeShardedArray(ir.TypeOf(ir.Float32, 12).WithSharding(s), zero)
	require.ErrorContains(t, err, "cannot shard f32[12]")
	_, err = rt.MakeShardedArray(ir.TypeOf(ir.Int32, 16).WithSharding(s), zero)
	require.ErrorContains(t, err, "is f32[2], want i32[2]")
	_, err = rt.MakeShardedArray(ir.TypeOf(ir.Float32, 16).WithSharding(s), func(d rt.Device, start, limit []int) (*ir.Literal, error) {
		if d.ID == 5 {
			return nil, errors.New("no block for device 5")
		}
		return zero(d, start, limit)
	})
	require.ErrorContains(t, err, "no block for device 5")
}

// In a job of one ProcessBarrier returns at once, reporting this process
// when it failed.
func TestProcessBarrierJobOfOne(t *testing.T) {
	failed, err := rt.ProcessBarrier(true)
	require.NoError(t, err)
	require.Empty(t, failed)
	failed, err = rt.ProcessBarrier(false)
	require.NoError(t, err)
	require.Equal(t, []int{0}, failed)
}
