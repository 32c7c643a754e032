package runtime_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Four virtual CPU devices (FERRY_CPU_DEVICES=4 does the same), each with
// its own 1 MiB device pool: an array put on cpu:2 is computed on there,
// and each device reports its own memory.
func ExampleToDevice() {
	cfg := rt.MemoryConfig{Devices: 4, Capacity: 1 << 20, Allocator: rt.AllocatorPlatform}
	if err := rt.ConfigureMemory(cfg); err != nil {
		panic(err)
	}
	defer rt.ConfigureMemory(rt.MemoryConfig{})
	for _, d := range rt.Devices() {
		fmt.Println(d)
	}

	h := rt.FromSlice([]float32{1, 2, 3, 4}) // on cpu:0, the default device
	x, err := rt.ToDevice(h, rt.Devices()[2])
	if err != nil {
		panic(err)
	}
	h.Delete()
	square := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Mul(x, x) })
	y := square(x) // runs on cpu:2, where x is
	d, _ := rt.DeviceOf(y)
	fmt.Println(y, "on", d.Platform, d.ID)

	for _, d := range rt.Devices() {
		s, err := rt.DeviceMemoryStats(d, ir.Device)
		if err != nil {
			panic(err)
		}
		fmt.Printf("cpu:%d: in use %d, peak %d, capacity %d\n", s.Device, s.BytesInUse, s.PeakBytesInUse, s.Capacity)
	}
	x.Delete()
	y.Delete()
	// Output:
	// cpu:0(cpu)
	// cpu:1(cpu)
	// cpu:2(cpu)
	// cpu:3(cpu)
	// f32[4] [1 4 9 16] on cpu 2
	// cpu:0: in use 0, peak 16, capacity 1048576
	// cpu:1: in use 0, peak 0, capacity 1048576
	// cpu:2: in use 32, peak 32, capacity 1048576
	// cpu:3: in use 0, peak 0, capacity 1048576
}
