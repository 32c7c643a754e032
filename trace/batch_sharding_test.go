package trace_test

import (
	"slices"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestVmapShardingConstraintEager checks an eager Vmap of
// WithShardingConstraint: the result must really be laid out over the mesh
// (its shards are the blocks of the constrained, batched sharding), not an
// unsharded array whose type only claims the sharding. Such an array once
// poisoned the eager op cache: the next unsharded op of the same signature
// (here the transpose that moves a While's batched state to axis 0) came
// back typed as sharded, and the While failed on a state sharding mismatch
// (TestVmapOps/while with FERRY_TEST_SEED=1795653044895154624).
func TestVmapShardingConstraintEager(t *testing.T) {
	const B, R, C = 3, 4, 10
	mesh, err := ir.NewMesh([]int{2}, []string{"x"})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := ir.NewNamedSharding(mesh, ir.P("x"))
	if err != nil {
		t.Fatal(err)
	}
	// x[b][r][c] = b*100 + r*10 + c: every element tells where it is.
	val := func(b, r, c int) float64 { return float64(b*100 + r*10 + c) }
	data := make([]float64, 0, B*R*C)
	for b := range B {
		for r := range R {
			for c := range C {
				data = append(data, val(b, r, c))
			}
		}
	}
	x := trace.Const(data, B, R, C)

	// Batch axis 0 in, batch axis out of the result out (y[b][r][c] or
	// y[r][b][c] = x[b][r][c]): its rows, dimension 1-out, split in two.
	for out := range 2 {
		y := trace.VmapFlat(func(a []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.WithShardingConstraint(a[0], rows)}
		}, []*trace.Array{x}, trace.OutAxes(out))[0]
		dims := []int{B, R, C}
		dims[0], dims[1] = dims[out], dims[1-out]
		if !y.Shape().Equal(dims) {
			t.Fatalf("out axis %d: shape %v, want %v", out, y.Shape(), dims)
		}
		shards, err := rt.Shards(y)
		if err != nil {
			t.Fatal(err)
		}
		if len(shards) != 2 {
			t.Fatalf("out axis %d: result %v has %d shards, want 2 (one per device of the mesh)", out, y.Type(), len(shards))
		}
		for i, s := range shards {
			start, limit := []int{0, 0, 0}, slices.Clone(dims)
			start[1-out], limit[1-out] = i*R/2, (i+1)*R/2
			if !slices.Equal(s.Start, start) || !slices.Equal(s.Limit, limit) {
				t.Fatalf("out axis %d: shard %d is [%v, %v), want [%v, %v)", out, i, s.Start, s.Limit, start, limit)
			}
			got, k := s.Array.Float64s(), 0
			for i0 := start[0]; i0 < limit[0]; i0++ {
				for i1 := start[1]; i1 < limit[1]; i1++ {
					for c := range C {
						b, r := i0, i1
						if out == 1 {
							b, r = i1, i0
						}
						if got[k] != val(b, r, c) {
							t.Fatalf("out axis %d: shard %d element %d = %v, want x[%d,%d,%d] = %v", out, i, k, got[k], b, r, c, val(b, r, c))
						}
						k++
					}
				}
			}
		}
	}

	// The same transpose on an unsharded array stays unsharded: x mapped on
	// axis 1 into a While moves axis 1 to the front, f64[3,4,10] → [4,3,10].
	var res []*trace.Array
	msg := vtRecover(func() {
		res = trace.VmapFlat(func(a []*trace.Array) []*trace.Array {
			return trace.While(func(st []*trace.Array) *trace.Array { return trace.Less(st[0], trace.ScalarAs(2, ir.Int32)) },
				func(st []*trace.Array) []*trace.Array {
					return []*trace.Array{trace.Add(st[0], trace.ScalarAs(1, ir.Int32)), trace.Add(st[1], st[1])}
				}, trace.ScalarAs(0, ir.Int32), a[0])
		}, []*trace.Array{x}, trace.InAxes(1), trace.OutAxes(trace.NotMapped, 0))
	})
	if msg != "" {
		t.Fatalf("While: %s", msg)
	}
	z := res[1]
	if z.Type().Sharding != nil {
		t.Fatalf("While state %v is sharded, want it unsharded", z.Type())
	}
	if want := (ir.Shape{R, B, C}); !z.Shape().Equal(want) {
		t.Fatalf("While state shape %v, want %v", z.Shape(), want)
	}
	got := z.Float64s()
	for r := range R {
		for b := range B {
			for c := range C {
				if g, w := got[(r*B+b)*C+c], 4*val(b, r, c); g != w {
					t.Fatalf("While state [%d,%d,%d] = %v, want %v", r, b, c, g, w)
				}
			}
		}
	}
}
