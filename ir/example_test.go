package ir_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// Build a function, print it, parse the text back and verify the result.
func ExampleParse() {
	f := ir.NewFunc("main")
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 2, 3))
	b := f.Body.AddParam(ir.TypeOf(ir.Float32, 3))
	bc, _ := f.Body.AddOp(ir.BroadcastInDim, []*ir.Value{b}, ir.Attrs{"shape": []int{2, 3}, "dims": []int{1}})
	bc.Loc = "quick.go:12"
	sum, _ := f.Body.AddOp(ir.Add, []*ir.Value{x, bc.Result()}, nil)
	half, _ := f.Body.AddOp(ir.Constant, nil, ir.Attrs{"value": ir.Scalar[float32](0.5)})
	hb, _ := f.Body.AddOp(ir.BroadcastInDim, []*ir.Value{half.Result()}, ir.Attrs{"shape": []int{2, 3}, "dims": []int{}})
	out, _ := f.Body.AddOp(ir.Mul, []*ir.Value{sum.Result(), hb.Result()}, nil)
	f.Body.Results = []*ir.Value{out.Result()}

	text := f.String()
	fmt.Print(text)

	g, err := ir.Parse(text)
	if err != nil {
		panic(err)
	}
	fmt.Println(ir.Verify(g) == nil, g.String() == text)

	_, err = ir.Parse("func @f(%0: f32[2]) -> (f32[2]) {\n  %1 = exp(%0) : f32[3]\n  return %1\n}")
	fmt.Println(err)
	// Output:
	// func @main(%0: f32[2,3], %1: f32[3]) -> (f32[2,3]) {
	//   %2 = broadcast_in_dim(%1) {dims=[1], shape=[2,3]} : f32[2,3] loc("quick.go:12")
	//   %3 = add(%0, %2) : f32[2,3]
	//   %4 = constant() {value=dense<f32[], 0.5>} : f32[]
	//   %5 = broadcast_in_dim(%4) {dims=[], shape=[2,3]} : f32[2,3]
	//   %6 = mul(%3, %5) : f32[2,3]
	//   return %6
	// }
	// true true
	// 2:18: result 0 of exp is written f32[3], but its shape rule gives f32[2]
}

// Shard an f32[8,4] array over a 2×4 mesh: rows split over axis x, columns
// over y, and read which block one device holds.
func ExampleNamedSharding() {
	mesh, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"}) // devices 0..7, row-major
	if err != nil {
		panic(err)
	}
	s, err := ir.NewNamedSharding(mesh, ir.P("x", "y")) // JAX: NamedSharding(mesh, P('x', 'y'))
	if err != nil {
		panic(err)
	}
	t := ir.TypeOf(ir.Float32, 8, 4).WithSharding(s)
	fmt.Println(t)

	local, _ := t.ShardShape()
	coords, _ := mesh.Coords(6)
	start, limit, _ := t.ShardBounds(6)
	fmt.Println("shard shape", local, "; device 6 at", coords, "holds rows", start[0], "to", limit[0], "and columns", start[1], "to", limit[1])

	// Rows over both axes (x major), columns whole: each device holds one row.
	rows, _ := ir.NewNamedSharding(mesh, ir.PartitionSpec{{"x", "y"}, nil})
	fmt.Println(t.WithSharding(rows), rows.NumShards(), "shards")

	// Split over y only: the devices of a column of the mesh hold the same block.
	cols, _ := ir.NewNamedSharding(mesh, ir.P("", "y"))
	groups, _ := cols.ReplicaGroups()
	fmt.Println("replica groups", groups)

	_, err = ir.ParseType("f32[8,6]{sharding<mesh[x=2,y=4], [x,y]>}")
	fmt.Println(err)
	// Output:
	// f32[8,4]{sharding<mesh[x=2,y=4], [x,y]>}
	// shard shape [4,1] ; device 6 at [1 2] holds rows 4 to 8 and columns 2 to 3
	// f32[8,4]{sharding<mesh[x=2,y=4], [{x,y},{}]>} 8 shards
	// replica groups [[0 4] [1 5] [2 6] [3 7]]
	// 1:1: type f32[8,6]{sharding<mesh[x=2,y=4], [x,y]>}: partition spec [x,y]: dimension 1 of shape [8,6] has size 6, which mesh axis y (size 4) does not divide
}
