// Package cuda is Ferry's CUDA backend. It runs a compiled program (the
// pass pipeline's passes.Program) on one GPU, and it builds and tests
// without one: the CUDA driver, NVRTC and cuBLASLt are loaded at run time
// through purego (load.go, libs.go), so the module builds with
// CGO_ENABLED=0 on machines with no CUDA at all, and the host-side tests run
// against a fake driver made of Go functions (fakedriver_test.go).
//
// What it does:
//
//   - Kernels. Every step of the program becomes generated CUDA C
//     (GenerateOp, codegen.go): loop fusions, input fusions (one parallel
//     reduction per reduce), output fusions (a dot_general with its
//     epilogue) and single ops. NVRTC compiles them for the device's
//     architecture; Cache keeps the images in memory and on disk
//     ($FERRY_CACHE_DIR).
//   - Matrix products go to cuBLASLt, with the fusion's epilogue where it
//     fits (matmul.go). cuBLASLt is optional: when it does not load or
//     initialise, every dot_general runs as a generated kernel.
//   - Control flow runs on the device: scan, while and cond steps launch
//     their nested regions' compiled steps once per iteration from a host
//     loop (region.go). Only sort has no device kernel; it is a host step
//     run by the reference executor (internal/eval), listed by HostSteps.
//   - Memory: device buffers come from a best-fit allocator over one
//     pre-allocated slab (or cuMemAlloc per buffer with
//     FERRY_ALLOCATOR=platform), pinned_host buffers from cuMemHostAlloc.
//     Kernels run on a compute stream and host↔device copies on two copy
//     streams, ordered by the program's stream plan (streams.go), so copies
//     of offloaded values overlap compute.
//   - Collectives: a per-device program of a sharded computation runs its
//     collective ops (all_reduce, all_gather, reduce_scatter, all_to_all,
//     collective_permute, axis_index) through the device communicators of
//     ExecOptions.DeviceComms, NCCL's in practice (package cuda/nccl), each
//     a step on the compute stream of the stream plan (collective.go).
//   - Threads: the backend uses the device's primary context and makes it
//     current on the calling OS thread at every entry (Compile, Execute,
//     FromLiteral, ...), as XLA's GPU runtime does, so any goroutine may
//     call it.
//
// New makes a backend; Register adds it to the runtime when a driver and a
// device are present (FERRY_BACKEND=cuda makes it the default). Compile
// verifies the IR after every pass when $FERRY_VERIFY_IR is set, like the
// CPU backend.
package cuda
