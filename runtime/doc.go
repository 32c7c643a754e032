// Package runtime (imported as rt) compiles and runs Ferry programs: rt.Jit
// traces a Go function over arrays into IR once per input signature, compiles it
// with the default backend and caches it; rt.Lower traces without running and
// gives the IR (l, err := rt.Lower(f, x, y); l.IR()); rt.FromSlice and
// friends make concrete arrays; the CPU backend is always registered.
//
//	f := rt.Jit(func(x, y *trace.Array) *trace.Array {
//		return trace.Add(trace.Mul(x, y), y)
//	})
//	z := f(rt.FromSlice([]float32{1, 2}), rt.FromSlice([]float32{3, 4}))
//
// rt.Scalar(0.5) is weakly typed like trace.Scalar (a Python float in JAX):
// it takes the dtype of the array it meets. rt.FromScalar(float32(0.5)) and
// rt.FromScalar(int32(0)) are strongly typed scalars of their Go type's dtype.
//
// A jitted function is safe for concurrent use: concurrent first calls with one
// signature compile it once and share the executable.
//
// # What is where
//
// This package holds Jit and the compile cache (jit.go, lower.go), eager
// ops (eager.go, dispatch.go), arrays and devices (array.go, device.go,
// backend.go), donation, sharded arrays and their partitioned execution
// (sharded.go, shardingspec.go, spmd.go), NaN and Inf debugging
// (debugnans.go) and the memory statistics and viewer (memory_api.go,
// memreport.go). Two concerns live in packages of their own, behind narrow
// interfaces, and are used through this package's names:
//
//   - package runtime/budget is the memory budget's planner: it retraces
//     the function under a trace.RematPlanner and compiles each try to read
//     its memory analysis (budget.Function); this package gives it the
//     jitted function and the rates it measures (MemoryBudget,
//     MemoryBudgetError, Compiled.MemoryPlan);
//   - package runtime/distributed starts a job of several processes (MPI,
//     the TCP rendezvous) and makes the communicators of its devices,
//     NCCL's among them; this package keeps the job it joined
//     (InitDistributed, ShutdownDistributed, ProcessIndex, ProcessCount,
//     LocalDevices, ProcessBarrier).
//
// # Memory budget
//
// A program that does not fit in device memory gets a budget rather than a
// hand-picked remat policy: rt.Jit(step, rt.MemoryBudget(bytes)) (or
// MemoryBudgetDeviceCapacity, or FERRY_MEMORY_BUDGET=40MiB for every jitted
// function) makes the compiler decide, for each value the backward pass
// needs, whether to keep it on device, recompute it, or offload it to
// pinned_host, choosing the fastest plan it finds that fits by trying plans
// and reading their memory analysis. When no plan fits with the arguments
// on device, it places in pinned_host the smallest set of arguments it
// finds among the parameters of scanned stacks (arguments read only as
// scans' xs, streamed in one layer at a time) and optimizer state passed in
// (donated, read elementwise, returned updated: copied in where used, its
// new value written to pinned_host).
// (*Compiled).MemoryPlan lists the decisions; a budget too small is a
// *MemoryBudgetError naming the smallest budget that fits. See MemoryBudget;
// the planner itself is package runtime/budget.
//
// # Devices
//
// Devices lists the default backend's devices. FERRY_CPU_DEVICES=N (or
// MemoryConfig.Devices, or SetCPUDeviceCount before making arrays) gives
// the CPU backend N virtual devices cpu:0 to cpu:N-1 in one process, like
// XLA's --xla_force_host_platform_device_count; each has its own device and
// pinned_host pools, sized by the memory settings (FERRY_DEVICE_MEMORY and
// the allocator settings apply per device), with its own statistics, live
// arrays and out-of-memory reports (which name the device).
//
//	x, err := rt.ToDevice(rt.FromSlice(data), rt.Devices()[2]) // committed to cpu:2
//	y := f(x)                                                  // runs on cpu:2
//	d, _ := rt.DeviceOf(y)                                      // cpu:2
//	s, _ := rt.DeviceMemoryStats(d, ir.Device)
//
// Arrays made without naming a device live on cpu:0, the default device,
// and are not committed to it. As in JAX, a jitted call or eager op runs
// on the device of its committed arguments, allocating everything there;
// uncommitted arguments are copied to that device for the call; committed
// arguments on different devices are an error naming them and the
// caller's line, never a silent copy. With no committed argument it runs
// on cpu:0, so programs that never name a device behave as with one.
// MemoryStats(space) describes cpu:0; ResetPeakMemory and LiveArrays cover
// every device (LiveArray.Device).
//
// # Seeing the memory
//
// Compiled.WriteMemoryReport writes a compiled program's memory viewer, one
// self-contained HTML page: every buffer of the buffer plan as a bar over
// the schedule, per memory space, with the peak, the Go line that made each
// value and the memory analysis; WriteMemoryReportCompare puts a baseline's
// picture beside it. FERRY_MEMORY_REPORT=dir writes one such page per
// compiled program (NNN-<func>.memory.html). WriteLiveMemoryReport draws
// the live pools: the largest live arrays and each bfc pool's address map.
//
// # Sharded arrays
//
// DevicePut spreads an array over the devices of a mesh, as
// jax.device_put(x, NamedSharding(mesh, spec)) does: each device gets its
// block (ir.NamedSharding.ShardBounds) in its own pool, replicated blocks a
// full copy on each replica's device. The result's type is the global type
// with the sharding; Shards lists the blocks (jax.Array.addressable_shards);
// Literal and Float32s read the whole array and ToDevice gathers it onto one
// device.
//
//	mesh, _ := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
//	s, _ := ir.NewNamedSharding(mesh, ir.P("x", "y"))
//	y, err := rt.DevicePut(x, s) // f32[4,8]: a 2×2 block on each of cpu:0 … cpu:7
//	shards, _ := rt.Shards(y)    // shards[i].Device, .Start, .Limit, .Array
//	g, err := rt.ToDevice(y, rt.Devices()[0])
//
// Computations on sharded arrays run partitioned over their mesh: a jitted
// function whose arguments are sharded, or that has InShardings,
// OutShardings or a trace.WithShardingConstraint, is split by
// passes.Partition into one program per device (with the collectives it
// needs), compiled once and run on every device of the mesh at once; eager
// ops on sharded arrays too. Results are sharded arrays, and
// Compiled.MemoryAnalysis is per device.
//
//	// one sharding per argument, for every array of it (a tree prefix, as
//	// jax.jit's in_shardings); InShardingsTree mirrors an argument's tree
//	step := rt.Jit(trainStep, rt.InShardings(replicated, replicated, rows, rows), rt.Donate(0, 1))
//	p, s, loss := step(params, state, x, y) // every device computes its blocks
//
// # Several processes
//
// InitDistributed (jax.distributed.initialize) joins the processes of an
// MPI job into one set of devices: with P processes of k devices each,
// Devices lists all P·k (device d of process p has global ID p·k+d and
// Device.Process p), LocalDevices this process's, and a mesh may name any of
// them. Every process runs the same program: DevicePut of the same host
// array puts this process's blocks, a jitted function runs its per-device
// program on this process's devices of the mesh, whose collectives reach
// the other processes (collective.NewHybrid over Open MPI), and reading a
// sharded array whole gathers it from every process (a collective call).
//
//	FERRY_CPU_DEVICES=2 mpirun -np 4 ./prog   // 8 devices; prog calls rt.InitDistributed
//
// The start-up (finding the job, the world of devices, device
// communicators) is package runtime/distributed.
//
// # Debugging NaNs
//
// FERRY_DEBUG_NANS=1 (or rt.SetDebugNans(true)), like jax_debug_nans, makes an
// op that produces a NaN from operands without NaN an error naming the op and
// the Go line that made it:
//
//	model.go:42: log: produced NaN (element 3) from operands without NaN in jitted function loss called at train.go:88 (FERRY_DEBUG_NANS)
//
// FERRY_DEBUG_INFS=1 (rt.SetDebugInfs), like jax_debug_infs, does the same for
// an op that produces +Inf or -Inf from operands without NaN or Inf (log(0),
// 1/0, an overflowing exp).
//
// Eager ops are checked one by one. A jitted call checks its results; when one
// holds a NaN (or Inf) it runs the traced function again op by op with the
// reference executor, unfused (inside scan, while and cond bodies too), to find
// the first op that made it. The error is a *trace.Error wrapping a *NaNError.
// NaN or Inf already in the arguments, constants such as a -inf mask, and what
// an op makes from empty operands are no error; only floating-point values are
// checked. When the checks are off they cost one atomic load per call.
package runtime
