// Package cuda is Ferry's CUDA backend. It runs compiled programs (the
// pass pipeline's passes.Program) on every GPU of its host from one
// process, and it builds and tests without one: the CUDA driver, NVRTC and cuBLASLt are loaded at run time
// through purego (load.go, libs.go), so the module builds with
// CGO_ENABLED=0 on machines with no CUDA at all, and the host-side tests run
// against a fake driver made of Go functions (fakedriver_test.go).
//
// What it does:
//
//   - Kernels. Every step becomes generated CUDA C, rendered from the
//     executable plan (passes.Lower): a fused group from the plan's
//     expression tree (GenerateKernel, kernel.go: loop and input fusions,
//     one parallel reduction per reduce, output fusions as the product into
//     its result's buffer and the epilogue over it), and so is a lone op the
//     plan describes as a group of one op (passes.LowerOp); scatter_add,
//     whose atomic adds the plan's kernels do not express, has a kernel of
//     its own (GenerateOp, codegen.go). NVRTC compiles them for
//     the device's architecture; Cache keeps the images in memory and on
//     disk ($FERRY_CACHE_DIR).
//   - Matrix products go to cuBLASLt (matmul.go), an output fusion's
//     straight into the result buffer its epilogue reads. cuBLASLt is
//     optional: when it does not load or initialise, every product runs as
//     a generated kernel.
//   - Control flow runs on the device: scan, while and cond steps launch
//     their nested regions' compiled steps once per iteration from a host
//     loop (region.go, through backend/blockrun and backend/loopexec, the
//     runners of a block's schedule and a loop's bindings that the CPU
//     backend uses too). Sort, and a fused group the plan does not describe
//     (passes.KernelUnsupported), have no device kernel: they are host
//     steps run by the reference executor (internal/eval), listed by
//     HostSteps.
//   - Devices: Devices lists every GPU the driver sees (cuDeviceGetCount;
//     CUDA_VISIBLE_DEVICES, which the driver applies, chooses and orders
//     them), each with its primary context, streams, slab, statistics and
//     out-of-memory report. A buffer is on one of them (FromLiteralOn;
//     Buffer.CopyToDevice copies peer to peer, or through the host without
//     peer access); a program is compiled once and runs on the GPU that
//     ExecOptions.Device names, so the runtime's SPMD runner runs a sharded
//     program on all of them at once, with communicators from
//     ncclCommInitAll.
//   - Memory: device buffers come from a best-fit allocator over one
//     pre-allocated slab per GPU (or cuMemAlloc per buffer with
//     FERRY_ALLOCATOR=platform), pinned_host buffers from cuMemHostAlloc;
//     each device keeps its live allocations, peaks and out-of-memory
//     report in a backend/ledger, as the CPU's pools do (memstats.go).
//     Kernels run on a compute stream, host↔device copies on two copy
//     streams and collectives on a stream of their own, ordered by events
//     from the plan's schedule (passes.Schedule), so copies of offloaded
//     values and collectives overlap compute.
//   - Collectives: a per-device program of a sharded computation runs its
//     collective ops (all_reduce, all_gather, reduce_scatter, all_to_all,
//     collective_permute, axis_index) through the device communicators of
//     ExecOptions.DeviceComms, NCCL's in practice (package cuda/nccl), each
//     a step on the collective stream (collective.go): in a scan over
//     layers the next layer's all_gather starts during the previous
//     iteration and a layer's reduce_scatter runs on into the next.
//   - Threads: the backend uses each device's primary context and makes it
//     current on the calling OS thread at every entry (Compile, Execute,
//     FromLiteral, ...), as XLA's GPU runtime does, so any goroutine may
//     call it, for any of its devices.
//
// New makes a backend; Register adds it to the runtime when a driver and a
// device are present (FERRY_BACKEND=cuda makes it the default). Compile
// verifies the IR after every pass when $FERRY_VERIFY_IR is set, like the
// CPU backend.
package cuda
