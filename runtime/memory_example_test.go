package runtime_test

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/google/pprof/profile"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
)

// A 1 MiB device whose bfc allocator may use all of it (the default fraction
// is 0.75, as in JAX). Allocations are rounded up to 64 bytes.
func ExampleMemoryStats() {
	if err := rt.ConfigureMemory(rt.MemoryConfig{Capacity: 1 << 20, Fraction: 1}); err != nil {
		panic(err)
	}
	defer rt.ConfigureMemory(rt.MemoryConfig{})

	x := rt.FromSlice(make([]float32, 1000)) // 4000 bytes
	y := rt.FromSlice(make([]float32, 1000))
	s := rt.MemoryStats(ir.Device)
	fmt.Println(s.Allocator, s.Capacity, s.Limit, s.BytesInUse, s.LiveAllocs)

	x.Delete() // a hole before y: free memory in two blocks
	s = rt.MemoryStats(ir.Device)
	fmt.Printf("in use %d, peak %d, largest free %d, fragmentation %.4f\n", s.BytesInUse, s.PeakBytesInUse, s.LargestFreeBlock, s.Fragmentation)

	// More than the capacity: an error, not a crash.
	_, _, err := rt.MemoryPools().Alloc(ir.Device, 2<<20, "temp arena")
	var oom *rt.OutOfMemoryError
	fmt.Println(errors.As(err, &oom), oom.Requested, oom.Largest[0].Type)

	y.Delete()
	s = rt.MemoryStats(ir.Device)
	fmt.Println(s.BytesInUse, s.LargestFreeBlock, s.Fragmentation)
	// Output:
	// bfc 1048576 1048576 8064 2
	// in use 4032, peak 8064, largest free 1040512, fragmentation 0.0039
	// true 2097152 f32[1000]
	// 0 1048576 0
}

// The profile has one sample per live buffer, labelled with its dtype, shape
// and memory space; `go tool pprof -top profile.pb.gz` lists them by the Go
// lines that made them.
func ExampleSaveDeviceMemoryProfile() {
	if err := rt.ConfigureMemory(rt.MemoryConfig{}); err != nil {
		panic(err)
	}
	x := rt.FromSlice([]float32{1, 2, 3, 4}, 2, 2)
	y := rt.FromSlice(make([]int32, 100))

	var buf bytes.Buffer
	if err := rt.SaveDeviceMemoryProfile(&buf); err != nil {
		panic(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.SampleType[0].Type, p.SampleType[1].Type, p.SampleType[1].Unit)
	for _, s := range p.Sample {
		fmt.Println(s.Value, s.Label["dtype"], s.Label["shape"], s.Label["space"])
	}
	x.Delete()
	y.Delete()
	// Output:
	// allocations space bytes
	// [1 400] [i32] [[100]] [device]
	// [1 16] [f32] [[2,2]] [device]
}
