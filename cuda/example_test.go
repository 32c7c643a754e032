package cuda_test

import (
	"fmt"

	"github.com/ferryml/ferry/cuda"
	_ "github.com/ferryml/ferry/cuda/nccl" // collectives of sharded programs through NCCL
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Every GPU of the host from one process: the runtime's devices are the
// GPUs, an array is put on one of them, moved to another peer to peer, and
// a jitted call runs where its argument is; a mesh over all of them runs a
// sharded program on each at once.
func ExampleBackend_Devices() {
	b, err := cuda.Register()
	if err != nil {
		fmt.Println("no GPU:", err != nil)
		return
	}
	devs := rt.Devices() // cuda:0 … cuda:n-1 (CUDA_VISIBLE_DEVICES chooses them)
	fmt.Println(len(devs) == len(b.Devices()))
	x, err := rt.ToDevice(rt.FromSlice([]float32{1, 2, 3}, 3), devs[0])
	if err != nil {
		fmt.Println(err)
		return
	}
	last := devs[len(devs)-1]
	y, err := rt.ToDevice(x, last) // cuMemcpyPeerAsync when the GPUs have peer access
	if err != nil {
		fmt.Println(err)
		return
	}
	z := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Mul(a, a) })(y)
	d, _ := rt.DeviceOf(z)
	fmt.Println(d.ID == last.ID, z.Float32s())

	m, _ := ir.NewMesh([]int{len(devs)}, []string{"data"})
	batch, _ := ir.NewNamedSharding(m, ir.P("data"))
	xs, err := rt.DevicePut(rt.FromSlice(make([]float32, 8*len(devs))), batch) // one block per GPU
	if err != nil {
		fmt.Println(err)
		return
	}
	mean := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Mean(a) })
	fmt.Println(mean(xs).Float32s()) // each GPU sums its block; NCCL all-reduces the sums
}
