package random_test

import (
	"bytes"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"os"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestMain gives the CPU backend 8 virtual devices, the meshes of the
// sharded generation tests.
func TestMain(m *testing.M) {
	if err := rt.SetCPUDeviceCount(8); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// sharding returns the NamedSharding of spec on a mesh of the given shape
// whose axes are named x, y, ….
func sharding(t *testing.T, shape []int, spec ir.PartitionSpec) *ir.NamedSharding {
	t.Helper()
	names := []string{"x", "y", "z"}[:len(shape)]
	m, err := ir.NewMesh(shape, names)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ir.NewNamedSharding(m, spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestShardedGenerationIsUnsharded: a generator jitted with its output
// sharded over 8 devices (rt.OutShardings; each device computes the bits of
// its block only, from iota counting from its offset) gives, gathered, the
// bits of the same generator jitted unsharded, for fresh keys, in both bit
// layouts, over 1-, 2- and 3-dimensional shapes split along every dimension
// and over meshes (8), (2, 4) and (4, 2).
func TestShardedGenerationIsUnsharded(t *testing.T) {
	type gen struct {
		name string
		fn   func(k *trace.Array, shape ir.Shape) *trace.Array
		// partitionableOnly: the original layout has at most 2^32 counters.
		partitionableOnly bool
	}
	gens := []gen{
		{"Bits", func(k *trace.Array, s ir.Shape) *trace.Array { return random.Bits(k, s...) }, false},
		{"Uniform f32", func(k *trace.Array, s ir.Shape) *trace.Array { return random.Uniform(k, ir.Float32, s, -2, 3) }, false},
		{"Normal f32", func(k *trace.Array, s ir.Shape) *trace.Array { return random.Normal(k, ir.Float32, s) }, false},
		{"Normal bf16", func(k *trace.Array, s ir.Shape) *trace.Array { return random.Normal(k, ir.BFloat16, s) }, false},
		{"Normal f64", func(k *trace.Array, s ir.Shape) *trace.Array { return random.Normal(k, ir.Float64, s) }, false},
		{"TruncatedNormal", func(k *trace.Array, s ir.Shape) *trace.Array {
			return random.TruncatedNormal(k, ir.Float32, s, -2, 2)
		}, false},
		{"Bernoulli", func(k *trace.Array, s ir.Shape) *trace.Array { return random.Bernoulli(k, 0.3, s) }, false},
		{"Gumbel", func(k *trace.Array, s ir.Shape) *trace.Array { return random.Gumbel(k, ir.Float32, s) }, false},
		// Elements whose flat indices cross 2^32: counters in i64.
		{"BitsAt 2^32", func(k *trace.Array, s ir.Shape) *trace.Array {
			return random.BitsAt(k, 1<<33, 1<<32-s.Size()/2, s...)
		}, true},
	}
	cases := []struct {
		shape ir.Shape
		mesh  []int
		spec  ir.PartitionSpec
	}{
		{ir.Shape{1024}, []int{8}, ir.P("x")},
		{ir.Shape{1024}, []int{2, 4}, ir.PartitionSpec{{"y", "x"}}},
		{ir.Shape{32, 64}, []int{8}, ir.P("x", "")},
		{ir.Shape{32, 64}, []int{8}, ir.P("", "x")},
		{ir.Shape{32, 64}, []int{2, 4}, ir.P("x", "y")},
		{ir.Shape{32, 64}, []int{4, 2}, ir.P("y", "x")},
		{ir.Shape{32, 64}, []int{4, 2}, ir.P("x", "")}, // replicated over y
		{ir.Shape{8, 16, 24}, []int{2, 4}, ir.P("x", "", "y")},
		{ir.Shape{8, 16, 24}, []int{4, 2}, ir.P("", "x", "y")},
	}
	for _, partitionable := range []bool{true, false} {
		prev := random.SetPartitionable(partitionable)
		for _, c := range cases {
			seed := testseed.Uint64(t)
			key := random.NewKey(seed)
			sh := sharding(t, c.mesh, c.spec)
			for _, g := range gens {
				if g.partitionableOnly && !partitionable {
					continue
				}
				what := fmt.Sprintf("%s%v over %v, partitionable %v, seed %d", g.name, c.shape, sh, partitionable, seed)
				fn := func(k *trace.Array) *trace.Array { return g.fn(k, c.shape) }
				checkSharded(t, what, fn, key, sh)
			}
		}
		random.SetPartitionable(prev)
	}
}

// checkSharded checks that fn jitted with its output sharded as sh gives,
// gathered, the bits of fn jitted unsharded, for key.
func checkSharded(t *testing.T, what string, fn func(*trace.Array) *trace.Array, key *trace.Array, sh *ir.NamedSharding) {
	t.Helper()
	lowered, err := rt.NewJitted(fn, rt.OutShardings(sh)).Lower(key)
	var c *rt.Compiled
	if err == nil {
		c, err = lowered.Compile()
	}
	var outs []any
	if err == nil {
		outs, err = c.Call(key)
	}
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	x := outs[0].(*trace.Array)
	shards, err := rt.Shards(x)
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) != sh.Mesh.NumDevices() {
		t.Fatalf("%s: %d blocks, want %d", what, len(shards), sh.Mesh.NumDevices())
	}
	got, err := x.Literal()
	if err != nil {
		t.Fatal(err)
	}
	want, err := rt.Jit(fn)(key).Literal()
	if err != nil {
		t.Fatal(err)
	}
	if !got.Type.EqualUnsharded(want.Type) || !bytes.Equal(got.Data, want.Data) {
		t.Errorf("%s: the sharded values differ from the unsharded ones", what)
	}
}
