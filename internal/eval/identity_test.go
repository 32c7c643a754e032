package eval

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
)

func testCheckpointName(t *testing.T) {
	r := newRand(t)
	for _, dt := range ir.AllDTypes {
		for _, shape := range elemShapes {
			for _, sp := range ir.AllSpaces {
				v := randLit(r, dt, shape, nil)
				v.Type.Space = sp
				res := runOp(t, ir.CheckpointName, []*ir.Literal{v}, ir.Attrs{"name": "x"})[0]
				require.Equal(t, v.Type, res.Type)
				require.Equal(t, v.Data, res.Data)
			}
		}
	}
}

func testOptimizationBarrier(t *testing.T) {
	r := newRand(t)
	for _, shape := range elemShapes {
		a := randLit(r, ir.Float32, shape, nil)
		b := randLit(r, ir.Int32, shape, nil)
		b.Type.Space = ir.PinnedHost
		res := runOp(t, ir.OptimizationBarrier, []*ir.Literal{a, b}, nil)
		require.Len(t, res, 2)
		require.Equal(t, a.Type, res[0].Type)
		require.Equal(t, b.Type, res[1].Type)
		require.Equal(t, a.Data, res[0].Data)
		require.Equal(t, b.Data, res[1].Data)
	}
}

// testShardingConstraint runs sharding_constraint, an identity whose result
// type carries the sharding (as trace.WithShardingConstraint sets it): eval
// runs on one device and ignores the sharding, so the result is the operand,
// with its dtype, shape and memory space. The meshes have one device or
// several, the specs random ones that fit the shape.
func testShardingConstraint(t *testing.T) {
	r := newRand(t)
	meshes := []*ir.Mesh{mustMesh(t, []int{1}, []string{"x"}), mustMesh(t, []int{2, 3}, []string{"x", "y"}), mustMesh(t, []int{1, 1}, []string{"x", "y"})}
	shapes := append(slices.Clone(elemShapes), ir.Shape{6, 4}, ir.Shape{2, 3, 6})
	for _, dt := range ir.AllDTypes {
		for _, shape := range shapes {
			for _, sp := range ir.AllSpaces {
				m := meshes[r.IntN(len(meshes))]
				s := randFittingSharding(t, r, m, shape)
				v := randLit(r, dt, shape, nil)
				v.Type.Space = sp
				f := ir.NewFunc("sharding_constraint")
				p := f.Body.AddParam(v.Type)
				op, err := f.Body.AddOp(ir.ShardingConstraint, []*ir.Value{p}, ir.Attrs{"sharding": s.String()})
				require.NoError(t, err)
				op.Results[0].Type = op.Results[0].Type.WithSharding(s)
				require.NoError(t, ir.Verify(f))
				f.Body.Results = op.Results
				res := runFunc(t, f, []*ir.Literal{v})[0]
				require.Equal(t, dt, res.Type.DType)
				require.Equal(t, shape, res.Type.Shape)
				require.Equal(t, sp, res.Type.Space)
				require.Equal(t, v.Data, res.Data, "%v under %v", v.Type, s)
			}
		}
	}
}

func mustMesh(t *testing.T, shape []int, names []string) *ir.Mesh {
	t.Helper()
	m, err := ir.NewMesh(shape, names)
	require.NoError(t, err)
	return m
}

// randFittingSharding returns a random sharding over m valid for shape:
// each dimension split over some of the mesh axes not used yet whose sizes
// multiply to a divisor of the dimension.
func randFittingSharding(t *testing.T, r *rand.Rand, m *ir.Mesh, shape ir.Shape) *ir.NamedSharding {
	t.Helper()
	spec := make(ir.PartitionSpec, r.IntN(len(shape)+1))
	used := map[string]bool{}
	for d := range spec {
		ways := 1
		for _, a := range r.Perm(m.NumAxes()) {
			name := m.AxisNames()[a]
			n := ways * m.AxisSize(name)
			if !used[name] && shape[d]%n == 0 && r.IntN(2) == 0 {
				spec[d] = append(spec[d], name)
				used[name] = true
				ways = n
			}
		}
	}
	s, err := ir.NewNamedSharding(m, spec)
	require.NoError(t, err)
	require.NoError(t, s.Validate(shape))
	return s
}
