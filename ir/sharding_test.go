package ir

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func mustMesh(t testing.TB, shape []int, names []string, devices ...int) *Mesh {
	t.Helper()
	m, err := NewMesh(shape, names, devices...)
	require.NoError(t, err)
	return m
}

func mustSharding(t testing.TB, m *Mesh, spec PartitionSpec) *NamedSharding {
	t.Helper()
	s, err := NewNamedSharding(m, spec)
	require.NoError(t, err)
	return s
}

func TestNewMeshErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		shape   []int
		names   []string
		devices []int
		want    string
	}{
		{"arity", []int{2, 4}, []string{"x"}, nil, "mesh: 2 axis sizes [2 4] but 1 names [x]"},
		{"empty name", []int{2, 4}, []string{"x", ""}, nil, "mesh: axis 1 has an empty name"},
		{"not identifier", []int{2}, []string{"a b"}, nil, `mesh: axis name "a b" is not an identifier`},
		{"leading digit", []int{2}, []string{"1x"}, nil, `mesh: axis name "1x" is not an identifier`},
		{"duplicate name", []int{2, 4}, []string{"x", "x"}, nil, `mesh: axis name "x" is used twice (axes 0 and 1)`},
		{"zero size", []int{2, 0}, []string{"x", "y"}, nil, "mesh: axis y has size 0; sizes must be positive"},
		{"negative size", []int{-2}, []string{"x"}, nil, "mesh: axis x has size -2; sizes must be positive"},
		{"too many devices", []int{1 << 10, 1 << 10}, []string{"x", "y"}, nil, "mesh: axis sizes [1024 1024] make more than MaxMeshDevices=65536 devices"},
		{"huge axis", []int{1 << 40}, []string{"x"}, nil, "make more than MaxMeshDevices"},
		{"device count", []int{2, 4}, []string{"x", "y"}, []int{0, 1, 2, 3, 4, 5}, "mesh: axis sizes [2 4] need 8 devices, got 6"},
		{"duplicate device", []int{2, 2}, []string{"x", "y"}, []int{0, 1, 3, 1}, "mesh: device 1 appears twice (positions 1 and 3)"},
		{"negative device", []int{2}, []string{"x"}, []int{0, -1}, "mesh: device -1 is negative"},
		{"no axes, two devices", nil, nil, []int{0, 1}, "mesh: axis sizes [] need 1 devices, got 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMesh(tc.shape, tc.names, tc.devices...)
			require.Nil(t, m)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestMeshAccessors(t *testing.T) {
	devs := []int{7, 6, 5, 4, 3, 2, 1, 0}
	m := mustMesh(t, []int{2, 4}, []string{"x", "y"}, devs...)
	require.Equal(t, 2, m.NumAxes())
	require.Equal(t, []string{"x", "y"}, m.AxisNames())
	require.Equal(t, []int{2, 4}, m.Shape())
	require.Equal(t, 8, m.NumDevices())
	require.Equal(t, devs, m.Devices())
	require.Equal(t, 2, m.AxisSize("x"))
	require.Equal(t, 4, m.AxisSize("y"))
	require.Equal(t, 0, m.AxisSize("z"))
	require.Equal(t, 1, m.AxisIndex("y"))
	require.Equal(t, -1, m.AxisIndex("z"))
	for x := range 2 {
		for y := range 4 {
			d, err := m.Device(x, y)
			require.NoError(t, err)
			require.Equal(t, devs[4*x+y], d)
			c, err := m.Coords(d)
			require.NoError(t, err)
			require.Equal(t, []int{x, y}, c)
		}
	}
	_, err := m.Device(1)
	require.ErrorContains(t, err, "1 coordinates [1] for 2 axes")
	_, err = m.Device(0, 4)
	require.ErrorContains(t, err, "coordinate 4 of axis y is outside [0, 4)")
	_, err = m.Coords(8)
	require.ErrorContains(t, err, "device 8 is not in mesh[x=2,y=4,devices=[7,6,5,4,3,2,1,0]]")

	// The accessors return copies.
	m.Devices()[0], m.Shape()[0], m.AxisNames()[0] = 99, 99, "q"
	require.Equal(t, devs, m.Devices())
	require.Equal(t, "mesh[x=2,y=4,devices=[7,6,5,4,3,2,1,0]]", m.String())

	// Default devices; NewMesh copies its arguments.
	shape, names := []int{2, 4}, []string{"x", "y"}
	d := mustMesh(t, shape, names)
	shape[0], names[0] = 3, "q"
	require.Equal(t, "mesh[x=2,y=4]", d.String())
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, d.Devices())
	require.True(t, d.Equal(mustMesh(t, []int{2, 4}, []string{"x", "y"}, 0, 1, 2, 3, 4, 5, 6, 7)))
	require.False(t, d.Equal(m))
	require.False(t, d.Equal(mustMesh(t, []int{2, 4}, []string{"x", "z"})))
	require.False(t, d.Equal(mustMesh(t, []int{4, 2}, []string{"x", "y"})))
	require.False(t, d.Equal(mustMesh(t, []int{8}, []string{"x"})))
	require.False(t, d.Equal(nil))
	require.True(t, (*Mesh)(nil).Equal(nil))

	// A mesh without axes has one device.
	one := mustMesh(t, nil, nil)
	require.Equal(t, 1, one.NumDevices())
	require.Equal(t, "mesh[]", one.String())
	dv, err := one.Device()
	require.NoError(t, err)
	require.Equal(t, 0, dv)
	require.Equal(t, "mesh[devices=[5]]", mustMesh(t, nil, nil, 5).String())

	// A zero Mesh (not built by NewMesh) gives errors, not panics.
	var zero Mesh
	_, err = zero.Device()
	require.Error(t, err)
	_, err = zero.Coords(0)
	require.Error(t, err)
	_, err = zero.AxisGroups()
	require.ErrorContains(t, err, "build it with NewMesh")
}

// randMesh returns a mesh of 1 to 3 axes of sizes 1 to 4 over a random
// permutation of devices (or the default devices).
func randMesh(t testing.TB, rng *rand.Rand) *Mesh {
	n := 1 + rng.IntN(3)
	shape := make([]int, n)
	names := make([]string, n)
	total := 1
	for i := range shape {
		shape[i] = 1 + rng.IntN(4)
		names[i] = string(rune('a' + i))
		total *= shape[i]
	}
	var devs []int
	if rng.IntN(2) == 0 {
		devs = rng.Perm(total)
		for i := range devs {
			devs[i] += 10 * rng.IntN(2) * total // sometimes not 0..N-1
		}
	}
	return mustMesh(t, shape, names, devs...)
}

// randSpec assigns each mesh axis to a random dimension of an array of the
// given rank or to none, in random order, and pads the spec to a random length.
func randSpec(rng *rand.Rand, m *Mesh, rank int) PartitionSpec {
	spec := make(PartitionSpec, rank)
	used := 0
	for _, i := range rng.Perm(m.NumAxes()) {
		if rank == 0 || rng.IntN(3) == 0 {
			continue
		}
		d := rng.IntN(rank)
		spec[d] = append(spec[d], m.AxisNames()[i])
		used = max(used, d+1)
	}
	return spec[:used+rng.IntN(rank-used+1)]
}

// nestedBlock computes, independently of ShardBounds, the index range of
// dimension size n that a device at coords holds when the dimension is split
// over axes: split [0, n) into as many parts as the first axis has and take
// the device's, split that by the second axis, and so on (major to minor).
func nestedBlock(m *Mesh, coords []int, axes []string, n int) (lo, hi int) {
	lo, hi = 0, n
	for _, a := range axes {
		k := m.AxisIndex(a)
		part := (hi - lo) / m.Shape()[k]
		lo += coords[k] * part
		hi = lo + part
	}
	return lo, hi
}

// TestShardBoundsBruteForce checks ShardShape, ShardBounds, NumShards,
// ReplicaGroups and IsFullyReplicated on random meshes and specs against an
// element-by-element enumeration: which devices hold each element.
func TestShardBoundsBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Uint64(t), testseed.Uint64(t)))
	for iter := range 300 {
		c := newShardCase(t, rng, iter)
		c.checkBounds()
		if c.shape.Size() > 0 {
			c.checkCoverage()
		}
		c.checkReplicaGroups()
		if c.shape.Size() > 0 {
			c.checkEquivalent(rng)
		}
	}
}

// shardBlock is a block of an array, its start and limit printed.
type shardBlock struct{ start, limit string }

// shardCase is one random sharding of TestShardBoundsBruteForce, a shape
// it splits, and the blocks its devices hold.
type shardCase struct {
	t     *testing.T
	desc  string
	m     *Mesh
	spec  PartitionSpec
	s     *NamedSharding
	rank  int
	shape Shape
	// local is the shard shape, replicas the number of devices holding
	// each element.
	local    Shape
	replicas int
	// bounds holds each device's block, byBlock the devices of each.
	bounds  map[int][2][]int
	byBlock map[shardBlock][]int
}

// newShardCase draws a mesh, a spec of a random rank and a shape each
// split dimension divides (its ways times 0..3, rarely 0), and checks the
// sharding's shard shape and counts.
func newShardCase(t *testing.T, rng *rand.Rand, iter int) *shardCase {
	m := randMesh(t, rng)
	rank := rng.IntN(4)
	spec := randSpec(rng, m, rank)
	s := mustSharding(t, m, spec)
	shape := make(Shape, rank)
	for d := range shape {
		ways := 1
		if d < len(spec) {
			for _, a := range spec[d] {
				ways *= m.AxisSize(a)
			}
		}
		k := 1 + rng.IntN(3)
		if rng.IntN(10) == 0 {
			k = 0
		}
		shape[d] = ways * k
	}
	c := &shardCase{t: t, desc: fmt.Sprintf("iter %d: %v on %v", iter, s, shape), m: m, spec: spec, s: s, rank: rank, shape: shape}
	require.NoError(t, s.Validate(shape), c.desc)

	var err error
	c.local, err = s.ShardShape(shape)
	require.NoError(t, err, c.desc)
	c.replicas = 1 // product of the sizes of the axes the spec does not name
	for _, a := range m.AxisNames() {
		if !slices.ContainsFunc(spec, func(axes []string) bool { return slices.Contains(axes, a) }) {
			c.replicas *= m.AxisSize(a)
		}
	}
	require.Equal(t, m.NumDevices()/c.replicas, s.NumShards(), c.desc)
	require.Equal(t, s.NumShards() == 1, s.IsFullyReplicated(), c.desc)
	return c
}

// checkBounds checks every device's block against nestedBlock's, and
// against Type.ShardBounds, and records it.
func (c *shardCase) checkBounds() {
	t, m, s, shape := c.t, c.m, c.s, c.shape
	c.byBlock = map[shardBlock][]int{}
	c.bounds = map[int][2][]int{}
	for _, dev := range m.Devices() {
		start, limit, err := s.ShardBounds(shape, dev)
		require.NoError(t, err, c.desc)
		coords, err := m.Coords(dev)
		require.NoError(t, err)
		for d := range shape {
			var axes []string
			if d < len(c.spec) {
				axes = c.spec[d]
			}
			lo, hi := nestedBlock(m, coords, axes, shape[d])
			require.Equal(t, [2]int{lo, hi}, [2]int{start[d], limit[d]}, "%s: device %d dim %d", c.desc, dev, d)
			require.Equal(t, c.local[d], limit[d]-start[d], c.desc)
		}
		tst, tlim, err := Type{DType: Float32, Shape: shape, Sharding: s}.ShardBounds(dev)
		require.NoError(t, err)
		require.Equal(t, start, tst)
		require.Equal(t, limit, tlim)
		c.bounds[dev] = [2][]int{start, limit}
		k := shardBlock{fmt.Sprint(start), fmt.Sprint(limit)}
		c.byBlock[k] = append(c.byBlock[k], dev)
	}
}

// checkCoverage checks that every element is held by exactly `replicas`
// devices and that the shards tile the array.
func (c *shardCase) checkCoverage() {
	t, shape := c.t, c.shape
	idx := make([]int, c.rank)
	for range shape.Size() {
		holders := 0
		for _, dev := range c.m.Devices() {
			b := c.bounds[dev]
			in := true
			for d := range idx {
				in = in && b[0][d] <= idx[d] && idx[d] < b[1][d]
			}
			if in {
				holders++
			}
		}
		require.Equal(t, c.replicas, holders, "%s: element %v", c.desc, idx)
		for d := c.rank - 1; d >= 0; d-- {
			if idx[d]++; idx[d] < shape[d] {
				break
			}
			idx[d] = 0
		}
	}
	// The shards tile the array: NumShards distinct blocks, each the shard shape.
	require.Len(t, c.byBlock, c.s.NumShards(), c.desc)
	require.Equal(t, shape.Size(), c.s.NumShards()*c.local.Size(), c.desc)
	allWhole := true
	for _, b := range c.bounds {
		allWhole = allWhole && fmt.Sprint(b[1]) == fmt.Sprint([]int(shape))
	}
	require.Equal(t, allWhole, c.s.IsFullyReplicated(), c.desc)
}

// checkReplicaGroups checks ReplicaGroups: the devices holding the same
// block, in mesh order.
func (c *shardCase) checkReplicaGroups() {
	t, m, desc := c.t, c.m, c.desc
	groups, err := c.s.ReplicaGroups()
	require.NoError(t, err)
	require.Len(t, groups, c.s.NumShards(), desc)
	pos := map[int]int{}
	for i, d := range m.Devices() {
		pos[d] = i
	}
	seen := map[int]bool{}
	for gi, g := range groups {
		require.Len(t, g, c.replicas, desc)
		require.True(t, sort.SliceIsSorted(g, func(i, j int) bool { return pos[g[i]] < pos[g[j]] }), "%s: group %v not in mesh order", desc, g)
		if gi > 0 {
			require.Less(t, pos[groups[gi-1][0]], pos[g[0]], desc)
		}
		for _, d := range g {
			require.False(t, seen[d], desc)
			seen[d] = true
			if c.shape.Size() > 0 {
				require.Equal(t, c.bounds[g[0]], c.bounds[d], "%s: group %v", desc, g)
			}
		}
		if c.shape.Size() > 0 {
			k := shardBlock{fmt.Sprint(c.bounds[g[0]][0]), fmt.Sprint(c.bounds[g[0]][1])}
			require.ElementsMatch(t, c.byBlock[k], g, desc)
		}
	}
	require.Len(t, seen, m.NumDevices())
}

// checkEquivalent checks that EquivalentTo agrees with comparing every
// device's block, for a random other spec and for variants of the same
// placement.
func (c *shardCase) checkEquivalent(rng *rand.Rand) {
	t, m := c.t, c.m
	others := []PartitionSpec{randSpec(rng, m, c.rank), padAndInsertUnit(rng, m, c.spec, c.rank)}
	for _, o := range others {
		os := mustSharding(t, m, o)
		if os.Validate(c.shape) != nil {
			continue
		}
		same := true
		for _, dev := range m.Devices() {
			st, li, err := os.ShardBounds(c.shape, dev)
			require.NoError(t, err)
			same = same && fmt.Sprint(st, li) == fmt.Sprint(c.bounds[dev][0], c.bounds[dev][1])
		}
		require.Equal(t, same, c.s.EquivalentTo(os, c.rank), "%s vs %v", c.desc, o)
		require.Equal(t, same, os.EquivalentTo(c.s, c.rank), "%s vs %v", c.desc, o)
	}
}

// padAndInsertUnit returns spec with the unused size-1 axes added to random
// dimensions and trailing replicated entries added up to a random length:
// the same placement written differently.
func padAndInsertUnit(rng *rand.Rand, m *Mesh, spec PartitionSpec, rank int) PartitionSpec {
	out := spec.Clone()
	out = append(out, make(PartitionSpec, rng.IntN(rank-len(spec)+1))...)
	for _, a := range m.AxisNames() {
		if m.AxisSize(a) != 1 || len(out) == 0 || slices.ContainsFunc(out, func(axes []string) bool { return slices.Contains(axes, a) }) {
			continue
		}
		d := rng.IntN(len(out))
		at := rng.IntN(len(out[d]) + 1)
		out[d] = slices.Insert(out[d], at, a)
	}
	return out
}

func TestAxisGroups(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Uint64(t), testseed.Uint64(t)))
	for range 200 {
		m := randMesh(t, rng)
		names := m.AxisNames()
		perm := rng.Perm(len(names))
		axes := make([]string, rng.IntN(len(names)+1))
		for i := range axes {
			axes[i] = names[perm[i]]
		}
		desc := fmt.Sprintf("%v over %v", m, axes)
		groups, err := m.AxisGroups(axes...)
		require.NoError(t, err, desc)
		size := 1
		for _, a := range axes {
			size *= m.AxisSize(a)
		}
		require.Len(t, groups, m.NumDevices()/size, desc)
		pos := map[int]int{}
		for i, d := range m.Devices() {
			pos[d] = i
		}
		seen := 0
		for gi, g := range groups {
			require.Len(t, g, size, desc)
			first, _ := m.Coords(g[0])
			for r, d := range g {
				c, _ := m.Coords(d)
				// Same coordinates off the named axes; rank r is the named
				// coordinates read as a number, first axis major.
				want := 0
				for k, name := range names {
					if !slices.Contains(axes, name) {
						require.Equal(t, first[k], c[k], desc)
					}
				}
				for _, a := range axes {
					k := m.AxisIndex(a)
					want = want*m.AxisSize(a) + c[k]
				}
				require.Equal(t, r, want, desc)
				seen++
			}
			if gi > 0 {
				prev := groups[gi-1]
				require.Less(t, slices.Min(posOf(pos, prev)), slices.Min(posOf(pos, g)), desc)
			}
		}
		require.Equal(t, m.NumDevices(), seen)
	}
	m := mustMesh(t, []int{2, 4}, []string{"x", "y"})
	g, err := m.AxisGroups("y")
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, g)
	g, err = m.AxisGroups("x")
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}}, g)
	g, err = m.AxisGroups("y", "x")
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 4, 1, 5, 2, 6, 3, 7}}, g)
	_, err = m.AxisGroups("z")
	require.ErrorContains(t, err, `mesh[x=2,y=4] has no axis "z"`)
	_, err = m.AxisGroups("x", "x")
	require.ErrorContains(t, err, `axis "x" is named twice in [x x]`)
}

func posOf(pos map[int]int, devs []int) []int {
	out := make([]int, len(devs))
	for i, d := range devs {
		out[i] = pos[d]
	}
	return out
}

func TestNamedShardingErrors(t *testing.T) {
	m := mustMesh(t, []int{2, 4}, []string{"x", "y"})
	for _, tc := range []struct {
		name  string
		mesh  *Mesh
		spec  PartitionSpec
		shape Shape // nil: NewNamedSharding must fail
		want  string
	}{
		{"unknown axis", m, PartitionSpec{{"x"}, {"z"}}, nil, `partition spec [x,z]: dimension 1 names mesh axis "z", which mesh[x=2,y=4] does not have`},
		{"empty axis", m, PartitionSpec{{""}}, nil, `dimension 0 names mesh axis "", which mesh[x=2,y=4] does not have`},
		{"axis twice in a dim", m, PartitionSpec{{"x", "x"}}, nil, `partition spec [{x,x}]: mesh axis "x" is used twice in dimension 0`},
		{"axis in two dims", m, P("y", "y"), nil, `partition spec [y,y]: mesh axis "y" is used by dimensions 0 and 1; an axis may split one dimension only`},
		{"nil mesh", nil, P("x"), nil, "sharding [x] has no mesh"},
		{"zero mesh", &Mesh{}, P(), nil, "mesh is not initialised (build it with NewMesh)"},
		{"too many entries", m, P("x", "", "y"), Shape{8, 4}, "partition spec [x,{},y] has 3 entries, more than the 2 dimensions of shape [8,4]"},
		{"scalar", m, P(""), Shape{}, "partition spec [{}] has 1 entries, more than the 0 dimensions of shape []"},
		{"not divisible", m, P("x", "y"), Shape{8, 6}, "partition spec [x,y]: dimension 1 of shape [8,6] has size 6, which mesh axis y (size 4) does not divide"},
		{"not divisible, several axes", m, PartitionSpec{{"y", "x"}}, Shape{12}, "partition spec [{y,x}]: dimension 0 of shape [12] has size 12, which mesh axes {y,x} (4×2 = 8 devices) does not divide"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewNamedSharding(tc.mesh, tc.spec)
			if tc.shape == nil {
				require.Nil(t, s)
				require.ErrorContains(t, err, tc.want)
				// The same checks run on a struct built by hand.
				require.ErrorContains(t, (&NamedSharding{Mesh: tc.mesh, Spec: tc.spec}).Validate(Shape{8, 8, 8}), tc.want)
				return
			}
			require.NoError(t, err)
			require.ErrorContains(t, s.Validate(tc.shape), tc.want)
			_, err = s.ShardShape(tc.shape)
			require.ErrorContains(t, err, tc.want)
			_, _, err = s.ShardBounds(tc.shape, 0)
			require.ErrorContains(t, err, tc.want)
			typ := Type{DType: Float32, Shape: tc.shape, Sharding: s}
			require.ErrorContains(t, checkType(typ), tc.want)
			_, err = typ.ShardShape()
			require.ErrorContains(t, err, tc.want)
		})
	}
	s := mustSharding(t, m, P("x"))
	_, _, err := s.ShardBounds(Shape{4}, 9)
	require.ErrorContains(t, err, "device 9 is not in mesh[x=2,y=4]")
	var nilS *NamedSharding
	require.ErrorContains(t, nilS.Validate(Shape{2}), "nil sharding")
	_, err = nilS.ReplicaGroups()
	require.ErrorContains(t, err, "nil sharding")
}

func TestPartitionSpecHelpers(t *testing.T) {
	require.Equal(t, PartitionSpec{{"x"}, nil, {"y"}}, P("x", "", "y"))
	require.Equal(t, PartitionSpec{}, P())
	spec := PartitionSpec{{"x", "y"}, {}, {"z"}}
	require.Equal(t, "[{x,y},{},z]", spec.String())
	c := spec.Clone()
	c[0][0] = "q"
	require.Equal(t, "x", spec[0][0])
	require.True(t, spec.Equal(PartitionSpec{{"x", "y"}, nil, {"z"}}))
	require.False(t, spec.Equal(PartitionSpec{{"y", "x"}, nil, {"z"}}))
	require.False(t, spec.Equal(PartitionSpec{{"x", "y"}, nil}))
	require.False(t, spec.Equal(PartitionSpec{{"x", "y"}, {"w"}, {"z"}}))
	require.Nil(t, PartitionSpec(nil).Clone())

	// NewNamedSharding copies the spec.
	m := mustMesh(t, []int{2, 4}, []string{"x", "y"})
	in := P("x", "y")
	s := mustSharding(t, m, in)
	in[0][0] = "y"
	require.Equal(t, "sharding<mesh[x=2,y=4], [x,y]>", s.String())
}

func TestShardingEqualAndEquivalent(t *testing.T) {
	m := mustMesh(t, []int{2, 4, 1}, []string{"x", "y", "u"})
	m2 := mustMesh(t, []int{2, 4, 1}, []string{"x", "y", "u"})
	rev := mustMesh(t, []int{2, 4, 1}, []string{"x", "y", "u"}, 7, 6, 5, 4, 3, 2, 1, 0)
	a := mustSharding(t, m, P("x", ""))
	require.True(t, a.Equal(mustSharding(t, m2, P("x", ""))))
	require.False(t, a.Equal(mustSharding(t, m, P("x"))))
	require.True(t, a.EquivalentTo(mustSharding(t, m, P("x")), 2))
	require.True(t, a.EquivalentTo(mustSharding(t, m, PartitionSpec{{"x", "u"}, {}}), 2))
	require.True(t, a.EquivalentTo(mustSharding(t, m, PartitionSpec{{"u", "x"}}), 2))
	require.False(t, a.EquivalentTo(mustSharding(t, m, P("x")), 0), "spec longer than the rank")
	require.False(t, a.Equal(mustSharding(t, rev, P("x", ""))))
	require.False(t, a.EquivalentTo(mustSharding(t, rev, P("x", "")), 2))
	require.False(t, a.EquivalentTo(mustSharding(t, m, P("", "x")), 2))
	require.False(t, mustSharding(t, m, PartitionSpec{{"x", "y"}}).EquivalentTo(mustSharding(t, m, PartitionSpec{{"y", "x"}}), 1))
	require.False(t, a.Equal(nil))
	require.False(t, a.EquivalentTo(nil, 2))
	require.True(t, (*NamedSharding)(nil).Equal(nil))
	require.True(t, (*NamedSharding)(nil).EquivalentTo(nil, 3))

	// Replication: nothing named, or only size-1 axes.
	require.True(t, mustSharding(t, m, P()).IsFullyReplicated())
	require.True(t, mustSharding(t, m, P("u", "")).IsFullyReplicated())
	require.False(t, a.IsFullyReplicated())
	g, err := mustSharding(t, m, P()).ReplicaGroups()
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, g)
	g, err = mustSharding(t, m, P("y")).ReplicaGroups()
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}}, g)
}

func TestTypeSharding(t *testing.T) {
	m := mustMesh(t, []int{2, 4}, []string{"x", "y"})
	s := mustSharding(t, m, P("x", "y"))
	base := TypeOf(Float32, 8, 4)
	ty := base.WithSharding(s)
	require.Nil(t, base.Sharding, "WithSharding changed its receiver")
	require.Same(t, s, ty.Sharding)

	// Equal: structural, nil only equals nil.
	require.False(t, ty.Equal(base))
	require.False(t, base.Equal(ty))
	require.True(t, ty.EqualUnsharded(base))
	require.True(t, ty.Equal(base.WithSharding(mustSharding(t, mustMesh(t, []int{2, 4}, []string{"x", "y"}), P("x", "y")))))
	require.False(t, ty.Equal(base.WithSharding(mustSharding(t, m, P("y", "x")))))
	require.False(t, ty.Equal(base.WithSharding(mustSharding(t, m, P("x", "")))))
	require.False(t, ty.Equal(ty.WithSpace(PinnedHost)))
	require.False(t, ty.Equal(ty.WithDType(Float16)))

	// WithDType, WithSpace and Clone keep it; WithShape drops it.
	require.Same(t, s, ty.WithDType(BFloat16).Sharding)
	require.Same(t, s, ty.WithSpace(PinnedHost).Sharding)
	require.Same(t, s, ty.Clone().Sharding)
	require.Nil(t, ty.WithShape(Shape{8, 4}).Sharding)
	require.Nil(t, ty.WithSharding(nil).Sharding)
	c := ty.Clone()
	c.Shape[0] = 99
	require.Equal(t, 8, ty.Shape[0], "Clone shares the shape")

	// Shard shape and bounds.
	local, err := ty.ShardShape()
	require.NoError(t, err)
	require.Equal(t, Shape{4, 1}, local)
	start, limit, err := ty.ShardBounds(6) // device 6 is at (1, 2)
	require.NoError(t, err)
	require.Equal(t, []int{4, 2}, start)
	require.Equal(t, []int{8, 3}, limit)
	local, err = base.ShardShape()
	require.NoError(t, err)
	require.Equal(t, Shape{8, 4}, local)
	start, limit, err = base.ShardBounds(3)
	require.NoError(t, err)
	require.Equal(t, []int{0, 0}, start)
	require.Equal(t, []int{8, 4}, limit)

	// Printing.
	require.Equal(t, "f32[8,4]{sharding<mesh[x=2,y=4], [x,y]>}", ty.String())
	require.Equal(t, "f32[8,4]{pinned_host, sharding<mesh[x=2,y=4], [x,y]>}", ty.WithSpace(PinnedHost).String())
	require.Equal(t, ty.String(), ty.Key())
	require.Equal(t, "xx"+ty.String(), string(ty.AppendText([]byte("xx"))))
	buf := make([]byte, 0, 256)
	require.Zero(t, testing.AllocsPerRun(100, func() { buf = ty.AppendText(buf[:0]) }))
}

func TestParseTypeSharding(t *testing.T) {
	m := mustMesh(t, []int{2, 4}, []string{"x", "y"})
	rev := mustMesh(t, []int{2, 2}, []string{"data", "devices"}, 3, 1, 2, 0)
	for _, ty := range []Type{
		TypeOf(Float32, 8, 4).WithSharding(mustSharding(t, m, P("x", ""))),
		TypeOf(Float32, 8, 8).WithSharding(mustSharding(t, m, PartitionSpec{nil, {"y", "x"}})),
		TypeOf(Int32, 8, 4).WithSharding(mustSharding(t, m, P())).WithSpace(PinnedHost),
		TypeOf(Bool, 6, 0).WithSharding(mustSharding(t, rev, PartitionSpec{{"devices"}, {"data"}})),
		TypeOf(Float64).WithSharding(mustSharding(t, mustMesh(t, nil, nil, 4), P())),
	} {
		got, err := ParseType(ty.String())
		require.NoError(t, err, ty.String())
		require.True(t, got.Equal(ty), "%v parsed as %v", ty, got)
		require.Equal(t, ty.String(), got.String())
	}
	// Loose text: spaces, the space after the sharding, {x} for x.
	got, err := ParseType(" f32[8, 4]{ sharding < mesh[ x = 2 , y = 4 ] , [ {x} , {} ] > , pinned_host }")
	require.NoError(t, err)
	require.Equal(t, "f32[8,4]{pinned_host, sharding<mesh[x=2,y=4], [x,{}]>}", got.String())

	for _, tc := range []struct{ src, want string }{
		{"f32[8,6]{sharding<mesh[x=2,y=4], [x,y]>}", "1:1: type f32[8,6]{sharding<mesh[x=2,y=4], [x,y]>}: partition spec [x,y]: dimension 1 of shape [8,6] has size 6, which mesh axis y (size 4) does not divide"},
		{"f32[8]{sharding<mesh[x=2], [z]>}", `1:8: partition spec [z]: dimension 0 names mesh axis "z", which mesh[x=2] does not have`},
		{"f32[8,8]{sharding<mesh[x=2], [x,x]>}", `1:10: partition spec [x,x]: mesh axis "x" is used by dimensions 0 and 1`},
		{"f32[8]{sharding<mesh[x=2], [x,{}]>}", "1:1: type f32[8]{sharding<mesh[x=2], [x,{}]>}: partition spec [x,{}] has 2 entries, more than the 1 dimensions of shape [8]"},
		{"f32[8]{sharding<mesh[x=2,x=2], [x]>}", `1:17: mesh: axis name "x" is used twice`},
		{"f32[8]{sharding<mesh[x=0], [x]>}", "1:17: mesh: axis x has size 0"},
		{"f32[8]{sharding<mesh[x=2,devices=[0,0]], [x]>}", "1:17: mesh: device 0 appears twice"},
		{"f32[8]{sharding<mesh[x=2,devices=[0]], [x]>}", "1:17: mesh: axis sizes [2] need 2 devices, got 1"},
		{"f32[8]{sharding<mesh[devices=[0],x=2], [x]>}", "1:34: the device list must come last in a mesh"},
		{"f32[8]{sharding<mesh[x=2,devices=[]], [x]>}", "1:26: empty device list"},
		{"f32[8]{sharding<mesh[x=2,y=[1]], [x]>}", `1:28: expected mesh axis size (an integer), found "["`},
		{"f32[8]{sharding<mesh[x=2], [x]>, sharding<mesh[x=2], [x]>}", "1:34: the type has two shardings"},
		{"f32[8]{pinned_host, device}", "1:21: the type has two memory spaces"},
		{"f32[8]{sharding<[x=2], [x]>}", `1:17: expected 'mesh', found "["`},
		{"f32[8]{sharding<mesh[x=2] [x]>}", `1:27: expected ',', found "["`},
		{"f32[8]{sharding<mesh[x=2], [(x)]>}", `1:29: expected mesh axis name or '{', found "("`},
		{"f32[8]{sharding<mesh[x=2], [x]>", "1:32: expected ',' or '}', found end of input"},
		{"f32[8]{moon}", `1:8: unknown memory space "moon"`},
		{"f32[8] x", `1:8: expected end of input, found "x"`},
	} {
		_, err := ParseType(tc.src)
		require.Error(t, err, tc.src)
		require.Contains(t, err.Error(), tc.want, tc.src)
		var pe *ParseError
		require.ErrorAs(t, err, &pe)
	}

	s, err := ParseSharding("sharding<mesh[x=2,y=4], [{x,y}]>")
	require.NoError(t, err)
	require.True(t, s.Equal(mustSharding(t, m, PartitionSpec{{"x", "y"}})))
	_, err = ParseSharding("sharding<mesh[x=2], [y]>")
	require.ErrorContains(t, err, `names mesh axis "y"`)
	_, err = ParseSharding("mesh[x=2]")
	require.ErrorContains(t, err, `1:1: expected 'sharding', found "mesh"`)
}

// TestShardingInFunctions checks that the verifier checks shardings, that
// shape rules ignore them, and that Parse keeps the written ones.
func TestShardingInFunctions(t *testing.T) {
	m := mustMesh(t, []int{2, 4}, []string{"x", "y"})
	sx := mustSharding(t, m, P("x", ""))
	f := NewFunc("s")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 8, 4).WithSharding(sx))
	require.Same(t, sx, x.Type.Sharding, "AddParam dropped the sharding")
	e := b.op(Exp, vs(x), nil)
	require.Nil(t, e.Type.Sharding, "shape rules give unsharded types")
	e.Type = e.Type.WithSharding(mustSharding(t, m, P("", "y")))
	f.Body.Results = vs(e)
	require.NoError(t, Verify(f))
	g := Clone(f)
	require.True(t, g.Body.Params[0].Type.Equal(x.Type), "Clone dropped the sharding")
	require.True(t, g.Body.Results[0].Type.Equal(e.Type), "Clone dropped the sharding")
	nv := f.NewValueWithID(50, x.Type, nil, 0)
	require.Same(t, sx, nv.Type.Sharding, "NewValueWithID dropped the sharding")

	text := f.String()
	require.Equal(t, `func @s(%0: f32[8,4]{sharding<mesh[x=2,y=4], [x,{}]>}) -> (f32[8,4]{sharding<mesh[x=2,y=4], [{},y]>}) {
  %1 = exp(%0) : f32[8,4]{sharding<mesh[x=2,y=4], [{},y]>}
  return %1
}
`, text)
	p, err := Parse(text)
	require.NoError(t, err)
	require.Equal(t, text, p.String())

	// An invalid sharding set by hand fails Verify and Print's parse.
	e.Type = e.Type.WithSharding(&NamedSharding{Mesh: m, Spec: P("", "z")})
	require.ErrorContains(t, Verify(f), `op exp: result 0: value %1: type f32[8,4]{sharding<mesh[x=2,y=4], [{},z]>}: partition spec [{},z]: dimension 1 names mesh axis "z"`)
	_, err = Parse(f.String())
	require.Error(t, err)
	e.Type = e.Type.WithSharding(mustSharding(t, mustMesh(t, []int{3}, []string{"x"}), P("x")))
	require.ErrorContains(t, Verify(f), "dimension 0 of shape [8,4] has size 8, which mesh axis x (size 3) does not divide")
	_, err = Parse(f.String())
	require.ErrorContains(t, err, "1:60: type f32[8,4]{sharding<mesh[x=3], [x]>}: partition spec [x]")

	// Result types differing from the rule in more than the sharding fail.
	e.Type = TypeOf(Float32, 8, 5).WithSharding(sx)
	require.ErrorContains(t, Verify(f), "has type f32[8,5]")

	// A declared function result must match the returned value, sharding included.
	_, err = Parse(strings.Replace(text, "-> (f32[8,4]{sharding<mesh[x=2,y=4], [{},y]>})", "-> (f32[8,4])", 1))
	require.ErrorContains(t, err, "function result 0 is declared f32[8,4], but returns %1 of type f32[8,4]{sharding<mesh[x=2,y=4], [{},y]>}")

	// Literals carry no sharding.
	_, err = Parse("func @f() -> () {\n  %0 = constant() {value=dense<f32[2]{sharding<mesh[x=2], [x]>}, [1, 2]>} : f32[2]\n  return\n}")
	require.ErrorContains(t, err, "2:32: a literal's type has no sharding")
	l := NewLiteral(TypeOf(Float32, 2).WithSharding(mustSharding(t, mustMesh(t, []int{2}, []string{"x"}), P("x"))))
	require.Nil(t, l.Type.Sharding, "NewLiteral keeps no sharding")
	l.Type.Sharding = mustSharding(t, mustMesh(t, []int{2}, []string{"x"}), P("x"))
	h := NewFunc("lit")
	c, err := h.Body.AddOp(Constant, nil, Attrs{"value": l})
	require.NoError(t, err)
	require.Nil(t, c.Result().Type.Sharding)
	require.ErrorContains(t, Verify(h), "a literal's type has no sharding")
	require.ErrorContains(t, Print(&strings.Builder{}, h), "a literal's type has no sharding")
}

// TestShapeRulesIgnoreShardings: region contracts compare types without
// their shardings, so region parameters may be sharded unlike the operands.
func TestShapeRulesIgnoreShardings(t *testing.T) {
	m := mustMesh(t, []int{2}, []string{"x"})
	f := NewFunc("w")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 4).WithSharding(mustSharding(t, m, P("x"))))
	p := f.Body.AddParam(TypeOf(Bool))
	r0, r1 := f.NewRegion(), f.NewRegion()
	a := r0.AddParam(TypeOf(Float32, 4))
	r0.Results = vs(txtBuilder{t, r0}.op(Neg, vs(a), nil))
	c := r1.AddParam(TypeOf(Float32, 4).WithSharding(mustSharding(t, m, P(""))))
	r1.Results = vs(c)
	out := b.op(Cond, vs(p, x), nil, r0, r1)
	require.Nil(t, out.Type.Sharding)
	f.Body.Results = vs(out)
	require.NoError(t, Verify(f))
	txtRoundTrip(t, f)
	ts, err := InferTypes(Neg, []Type{x.Type}, nil, nil)
	require.NoError(t, err)
	require.Nil(t, ts[0].Sharding)
	require.Same(t, x.Type.Sharding, f.Body.Params[0].Type.Sharding, "InferTypes changed its operand")
}

// TestShardingNilSafe: methods on nil and hand-built values give errors or
// zero values, never panics.
func TestShardingNilSafe(t *testing.T) {
	var m *Mesh
	require.Equal(t, 0, m.NumAxes())
	require.Equal(t, 0, m.NumDevices())
	require.Equal(t, -1, m.AxisIndex("x"))
	require.Equal(t, 0, m.AxisSize("x"))
	require.Empty(t, m.Devices())
	require.Empty(t, m.Shape())
	require.Empty(t, m.AxisNames())
	require.Equal(t, "mesh<nil>", m.String())
	_, err := m.Device()
	require.ErrorContains(t, err, "nil mesh")
	_, err = m.Coords(0)
	require.ErrorContains(t, err, "nil mesh")
	_, err = m.AxisGroups()
	require.ErrorContains(t, err, "nil mesh")

	var s *NamedSharding
	require.Equal(t, 1, s.NumShards())
	require.True(t, s.IsFullyReplicated())
	require.Equal(t, "sharding<nil>", s.String())
	_, err = s.ShardShape(Shape{2})
	require.ErrorContains(t, err, "nil sharding")
	for _, bad := range []*NamedSharding{{Spec: P("x")}, {Mesh: &Mesh{}, Spec: P("x")}} {
		require.NotPanics(t, func() {
			_ = bad.String()
			_ = bad.NumShards()
			_ = bad.EquivalentTo(bad, 1)
			_, _, err := bad.ShardBounds(Shape{4}, 0)
			require.Error(t, err)
			_, err = bad.ReplicaGroups()
			require.Error(t, err)
			require.Error(t, Verify(func() *Func {
				f := NewFunc("bad")
				f.Body.Results = vs(f.Body.AddParam(TypeOf(Float32, 4).WithSharding(bad)))
				return f
			}()))
		})
	}
}

// TestTypeSize: the sharding pointer fits in the padding-free layout, so a
// Type stays 40 bytes on 64-bit machines (see the Type doc).
func TestTypeSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("64-bit layout")
	}
	require.Equal(t, uintptr(40), unsafe.Sizeof(Type{}))
}
