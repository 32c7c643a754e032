// Package cpu is Ferry's CPU backend: it compiles IR through the pass
// pipeline (passes), runs it with the CPU executor (cpu/cpuexec), and
// keeps every concrete array in the memory pool of its memory space
// (device, pinned_host), ordinary Go memory with a capacity and an
// allocator (bfc or platform, see backend.MemoryConfig) so that
// out-of-memory, fragmentation and allocator settings behave as on a GPU.
//
// With MemoryConfig.Devices = N (FERRY_CPU_DEVICES=N) the backend has N
// virtual devices, cpu:0 to cpu:N-1, each with its own pools: a buffer
// knows its device (backend.DeviceBuffer), FromLiteralOn makes one on a
// given device (backend.Placer), and an executable runs on the device
// ExecOptions.Device names, where its arguments must be and its results,
// temporaries and host copies are allocated.
//
// A per-device program of a sharded computation holds collective ops
// (all_reduce, all_gather, ...) over named axes: compiled with
// CompileOptions.BoundAxes listing them, one executable is run by every
// device of the mesh at the same time, each call on its own goroutine with
// ExecOptions.Comms mapping each axis string to that device's
// communicator (package collective; collective.NewLocal and
// collective.MeshAxes for virtual devices). An execution that fails aborts
// its communicators, so that the other devices' calls fail too instead of
// waiting forever; ExecOptions.Context bounds the waits.
//
// The package registers its backend under the name "cpu" when it is
// initialised; package runtime imports it, so the CPU backend is always
// available, and forwards its memory functions (ConfigureMemory,
// MemoryStats, LiveArrays, SaveDeviceMemoryProfile, ...).
package cpu
