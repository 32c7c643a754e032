// Package cuda holds the pieces of Ferry's CUDA backend that build and test
// without a GPU: a run-time loader for the CUDA driver, NVRTC and cuBLASLt
// (through purego, so the module still builds with CGO_ENABLED=0 on machines
// with no CUDA at all), and the generator that turns fused elementwise groups
// (`fusion` ops of kind "loop") into CUDA C kernels for NVRTC.
//
// Backend (backend.go) runs compiled programs on the device; Register adds it
// to the runtime when a driver and a device are present.
package cuda
