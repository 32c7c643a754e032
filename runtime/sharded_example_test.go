package runtime_test

import (
	"fmt"
	"strings"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Eight virtual CPU devices (FERRY_CPU_DEVICES=8 does the same) in a 2×4
// mesh: a f32[4,8] matrix with rows split over x and columns over y puts a
// 2×2 block on each device, in that device's pool only. The shards can be
// read one by one, and the whole array gathered back onto one device.
func ExampleDevicePut() {
	if err := rt.SetCPUDeviceCount(8); err != nil {
		panic(err)
	}
	defer rt.ConfigureMemory(rt.MemoryConfig{})
	data := make([]float32, 32)
	for i := range data {
		data[i] = float32(i)
	}
	l, err := ir.LiteralOf(ir.Shape{4, 8}, data)
	if err != nil {
		panic(err)
	}
	x := trace.FromLiteral(l) // on cpu:0

	mesh, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	if err != nil {
		panic(err)
	}
	s, err := ir.NewNamedSharding(mesh, ir.P("x", "y"))
	if err != nil {
		panic(err)
	}
	y, err := rt.DevicePut(x, s) // jax.device_put(x, NamedSharding(mesh, P('x', 'y')))
	if err != nil {
		panic(err)
	}
	x.Delete()
	fmt.Println(y.Type())
	shards, err := rt.Shards(y)
	if err != nil {
		panic(err)
	}
	for _, sh := range shards {
		st, _ := rt.DeviceMemoryStats(sh.Device, ir.Device)
		fmt.Printf("cpu:%d %v:%v %v (%d bytes in use)\n", sh.Device.ID, sh.Start, sh.Limit, sh.Array.Float32s(), st.BytesInUse)
	}

	// A jitted function of a sharded array runs partitioned: each device
	// negates its block, and the result has y's layout.
	n, err := rt.Jit(func(a *trace.Array) (*trace.Array, error) { return trace.Neg(a), nil })(y)
	if err != nil {
		panic(err)
	}
	fmt.Println(n.Type(), n.Float32s()[8:12])
	n.Delete()
	// ToDevice gathers it on one device.
	g, err := rt.ToDevice(y, rt.Devices()[0])
	if err != nil {
		panic(err)
	}
	fmt.Println(g.Type(), g.Float32s()[8:16])
	y.Delete()
	g.Delete()
	// Output:
	// f32[4,8]{sharding<mesh[x=2,y=4], [x,y]>}
	// cpu:0 [0 0]:[2 2] [0 1 8 9] (64 bytes in use)
	// cpu:1 [0 2]:[2 4] [2 3 10 11] (64 bytes in use)
	// cpu:2 [0 4]:[2 6] [4 5 12 13] (64 bytes in use)
	// cpu:3 [0 6]:[2 8] [6 7 14 15] (64 bytes in use)
	// cpu:4 [2 0]:[4 2] [16 17 24 25] (64 bytes in use)
	// cpu:5 [2 2]:[4 4] [18 19 26 27] (64 bytes in use)
	// cpu:6 [2 4]:[4 6] [20 21 28 29] (64 bytes in use)
	// cpu:7 [2 6]:[4 8] [22 23 30 31] (64 bytes in use)
	// f32[4,8]{sharding<mesh[x=2,y=4], [x,y]>} [-8 -9 -10 -11]
	// f32[4,8] [8 9 10 11 12 13 14 15]
}

// A data-parallel mean over a batch split across 4 devices: each device
// sums its rows, one all-reduce adds the four sums, and the memory analysis
// is each device's.
func ExampleInShardings() {
	if err := rt.SetCPUDeviceCount(4); err != nil {
		panic(err)
	}
	defer rt.ConfigureMemory(rt.MemoryConfig{})
	mesh, err := ir.NewMesh([]int{4}, []string{"data"})
	if err != nil {
		panic(err)
	}
	batch, err := ir.NewNamedSharding(mesh, ir.P("data", ""))
	if err != nil {
		panic(err)
	}
	mean := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Mean(trace.Mul(x, x)) }, rt.InShardings(batch))
	data := make([]float32, 8*1024)
	for i := range data {
		data[i] = 2
	}
	x := trace.Reshape(rt.FromSlice(data), 8, 1024) // 32 KiB, on cpu:0
	fmt.Println(mean.Fn()(x))

	l, err := mean.Lower(x)
	if err != nil {
		panic(err)
	}
	c, err := l.Compile()
	if err != nil {
		panic(err)
	}
	fmt.Println("argument bytes per device:", c.MemoryAnalysis().ArgumentBytes)
	fmt.Println("all-reduces:", strings.Count(c.OptimizedIR(), "all_reduce("))
	// Output:
	// f32[]{sharding<mesh[data=4], []>} 4
	// argument bytes per device: 8192
	// all-reduces: 1
}
