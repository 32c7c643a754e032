package settings

import (
	"math"
	"time"
)

// The table: every environment variable Ferry reads, by name. Each is a
// *Setting whose Get, Lookup and Raw read it.

// Memory and allocators.
var (
	// Allocator is FERRY_ALLOCATOR.
	Allocator = newEnum(&Var{Name: "FERRY_ALLOCATOR", Type: "`bfc` or `platform`", Want: "bfc or platform", Default: "`bfc`",
		Doc:     "Device-pool allocator: best fit with coalescing over a slab, or allocate and free on demand (limit = capacity). `rt.MemoryConfig.Allocator`. See [memory](memory.md#allocators-and-settings).",
		Readers: []string{"backend"}}, "bfc", "bfc", "platform", "default")
	// DeviceMemory is FERRY_DEVICE_MEMORY (0: unlimited).
	DeviceMemory = newSize(&Var{Name: "FERRY_DEVICE_MEMORY", Type: "size, or `unlimited`", Want: "a size such as 64MiB, 1.5GiB, 512MB or 1e9, or unlimited", Default: "unlimited",
		Doc:     "Capacity of each device pool. `rt.MemoryConfig.Capacity`.",
		Readers: []string{"backend"}}, map[string]int64{"unlimited": 0})
	// HostMemory is FERRY_HOST_MEMORY (0: unlimited).
	HostMemory = newSize(&Var{Name: "FERRY_HOST_MEMORY", Type: "size, or `unlimited`", Want: "a size such as 64MiB, 1.5GiB, 512MB or 1e9, or unlimited", Default: "unlimited",
		Doc:     "Capacity of each pinned_host pool. `rt.MemoryConfig.HostCapacity`.",
		Readers: []string{"backend"}}, map[string]int64{"unlimited": 0})
	// MemFraction is FERRY_MEM_FRACTION.
	MemFraction = newFloat(&Var{Name: "FERRY_MEM_FRACTION", Type: "number in (0, 1]", Want: "a number in (0, 1]", Default: "`0.75`",
		Doc:     "Part of the device capacity the bfc allocator may use (`XLA_PYTHON_CLIENT_MEM_FRACTION`). `rt.MemoryConfig.Fraction`.",
		Readers: []string{"backend"}}, 0.75, func(f float64) bool { return f > 0 && f <= 1 })
	// Preallocate is FERRY_PREALLOCATE.
	Preallocate = newBool(&Var{Name: "FERRY_PREALLOCATE", Type: "`true` or `false`", Want: "true or false (1/0, on/off, yes/no)", Default: "`true`",
		Doc:     "bfc: reserve the whole slab at first use (`XLA_PYTHON_CLIENT_PREALLOCATE`). `rt.MemoryConfig.Preallocate`.",
		Readers: []string{"backend"}}, true)
	// CPUDevices is FERRY_CPU_DEVICES.
	CPUDevices = newInt(&Var{Name: "FERRY_CPU_DEVICES", Type: "integer in [1, 1024]", Want: "a number of devices in [1, 1024]", Default: "`1`",
		Doc:     "Number of virtual CPU devices `cpu:0`…`cpu:N-1`, each with its own pools. `rt.SetCPUDeviceCount`, `rt.MemoryConfig.Devices`.",
		Readers: []string{"backend"}}, 1, 1, 1024)
	// MemoryBudget is FERRY_MEMORY_BUDGET (BudgetDevice: "device").
	MemoryBudget = newSetting(&Var{Name: "FERRY_MEMORY_BUDGET", Kind: Size, Type: "size, or `device`", Want: "a positive number of bytes like 3000000, 512M, 64MiB or 1.5GB, or \"device\"", Default: "unset",
		Doc:     "A memory budget for every jitted function (`device`: the allocator's limit). `rt.MemoryBudget`. See [memory](memory.md#out-of-memory-give-the-compiler-a-budget).",
		Readers: []string{"runtime"}}, int64(0), parseBudget)
	// BudgetRates is FERRY_BUDGET_RATES: matmul FLOP/s, elementwise FLOP/s,
	// bytes/s.
	BudgetRates = newSetting(&Var{Name: "FERRY_BUDGET_RATES", Kind: List, Type: "`matmul,elementwise,bandwidth` (three numbers)", Want: "three positive numbers, matmul FLOP/s, elementwise FLOP/s and device↔host bytes/s, separated by commas", Default: "measured once per process",
		Doc:     "Fixes the memory-budget planner's rates (FLOP/s, FLOP/s, bytes/s), e.g. `1e11,2e9,5e9`, to reproduce a plan.",
		Readers: []string{"runtime"}}, []float64(nil), func(s string) ([]float64, error) {
		return parseFloats(s, 3, func(f float64) bool { return f > 0 && !math.IsInf(f, 0) })
	})
	// PoisonUninit is FERRY_POISON_UNINIT.
	PoisonUninit = newBool(&Var{Name: "FERRY_POISON_UNINIT", Type: "`1`", Default: "off",
		Doc:     "Fills memory handed out uninitialised (outputs, arenas) with 0xff, NaN in every float type, to catch reads of unwritten memory. Read at start.",
		Readers: []string{"cpu"}}, false)
	// MemoryReport is FERRY_MEMORY_REPORT.
	MemoryReport = newString(&Var{Name: "FERRY_MEMORY_REPORT", Type: "directory", Default: "unset",
		Doc:     "Writes each compiled program's memory viewer page (`NNN-<func>.memory.html`).",
		Readers: []string{"runtime"}}, Path)
)

// Copies between memory spaces.
var (
	// AsyncCopy is FERRY_ASYNC_COPY.
	AsyncCopy = newBool(&Var{Name: "FERRY_ASYNC_COPY", Type: "`0` to turn off", Want: "0 or 1 (true/false, on/off, yes/no)", Default: "on",
		Doc:     "`0`: copies between memory spaces run synchronously instead of on copy workers overlapping compute (bit-identical results).",
		Readers: []string{"cpu/cpuexec"}}, true)
	// HostCopyGBPS is FERRY_HOST_COPY_GBPS (0: full speed).
	HostCopyGBPS = newFloat(&Var{Name: "FERRY_HOST_COPY_GBPS", Type: "number (GB/s)", Want: "a positive number of GB/s", Default: "unset (full speed)",
		Doc:     "Simulates a host link of that bandwidth for copies between memory spaces, to see offload overlap on a CPU.",
		Readers: []string{"cpu/cpuexec"}}, 0, func(f float64) bool { return f > 0 && f <= 1e9 })
	// AsyncCollectives is FERRY_ASYNC_COLLECTIVES.
	AsyncCollectives = newBool(&Var{Name: "FERRY_ASYNC_COLLECTIVES", Type: "`0` to turn off", Want: "0 or 1 (true/false, on/off, yes/no)", Default: "on",
		Doc:     "`0`: the CPU backend runs each collective of a sharded program in turn instead of on a collective worker per device overlapping compute (the next layer's all-gather of a scan beside the current layer); results are bit-identical.",
		Readers: []string{"cpu/cpuexec"}}, true)
	// CollectiveGBPS is FERRY_COLLECTIVE_GBPS (0: full speed).
	CollectiveGBPS = newFloat(&Var{Name: "FERRY_COLLECTIVE_GBPS", Type: "number (GB/s)", Want: "a positive number of GB/s", Default: "unset (full speed)",
		Doc:     "Simulates an interconnect of that bandwidth for the CPU backend's collectives (each takes at least the bytes it receives or sends over that rate), to see collectives overlap compute on a CPU.",
		Readers: []string{"cpu/cpuexec"}}, 0, func(f float64) bool { return f > 0 && f <= 1e9 })
)

// Backends and CPU kernels.
var (
	// Backend is FERRY_BACKEND.
	Backend = newString(&Var{Name: "FERRY_BACKEND", Type: "`cpu` or `cuda`", Want: "a backend name (cpu, cuda)", Default: "the registered accelerator, else `cpu`",
		Doc:     "The default backend. `cuda` also registers the CUDA backend when package `cuda` is imported. See [cuda](cuda.md).",
		Readers: []string{"backend", "cuda"}}, String)
	// CPU is FERRY_CPU.
	CPU = newEnum(&Var{Name: "FERRY_CPU", Default: "the best the host has",
		Doc:     "Forces a lower CPU kernel path (gemm, fused chains, vmath). Read at start. See [performance](performance.md#cpu-paths-avx-512-avx2-go).",
		Readers: []string{"cpu/cpufeat"}}, "", "avx512", "avx2", "go")
	// CPUFMA is FERRY_CPU_FMA.
	CPUFMA = newBool(&Var{Name: "FERRY_CPU_FMA", Type: "`0` to turn off", Default: "on",
		Doc:     "`0`: no fused multiply-add contraction in compiled chains; results bit-identical to the reference executor. Read at start.",
		Readers: []string{"cpu/vmath"}}, true)
	// CPUJIT is FERRY_CPU_JIT.
	CPUJIT = newBool(&Var{Name: "FERRY_CPU_JIT", Type: "`0` to turn off", Default: "on",
		Doc:     "`0`: no run-time machine code; fused chains and vmath kernels run as Go. Read at start.",
		Readers: []string{"cpu/vmath"}}, true)
	// GemmKernel is FERRY_GEMM_KERNEL.
	GemmKernel = newEnum(&Var{Name: "FERRY_GEMM_KERNEL", Default: "the fastest supported",
		Doc:     "Forces the matrix-product micro-kernel. Read at start.",
		Readers: []string{"cpu/gemm"}}, "", "avx512", "avx2", "go")
	// GemmPackCache is FERRY_GEMM_PACK_CACHE (0: off).
	GemmPackCache = newSize(&Var{Name: "FERRY_GEMM_PACK_CACHE", Type: "size, or `off`", Want: "a size such as 64MiB, 1.5GiB, 512MB or 1e9, or off", Default: "`256MiB`",
		Doc:     "Limit of the CPU's packed-weight cache: matrix products keep the packed panels of weights that are call arguments (not donated) between calls; `off` turns it off. `gemm.SetPackCacheLimit`. See [performance](performance.md#packed-weights).",
		Readers: []string{"cpu/gemm"}}, map[string]int64{"off": 0})
	// VMath is FERRY_VMATH.
	VMath = newEnum(&Var{Name: "FERRY_VMATH", Default: "unset",
		Doc:     "`go`: the pure-Go vmath kernels, no run-time code. Read at start.",
		Readers: []string{"cpu/vmath"}}, "", "go")
	// CUDAAllowTF32 is FERRY_CUDA_ALLOW_TF32.
	CUDAAllowTF32 = newBool(&Var{Name: "FERRY_CUDA_ALLOW_TF32", Type: "`1`", Default: "off",
		Doc:     "Lets cuBLASLt compute f32 matrix products in TF32 (default: exact f32).",
		Readers: []string{"cuda"}}, false)
	// CUDALibDir is FERRY_CUDA_LIB_DIR (a list of directories).
	CUDALibDir = newString(&Var{Name: "FERRY_CUDA_LIB_DIR", Type: "directory", Default: "unset",
		Doc:     "Searched first for `libcuda`, NVRTC, cuBLASLt and NCCL (several directories separated by the path list separator).",
		Readers: []string{"cuda"}}, Path)
	// CacheDir is FERRY_CACHE_DIR.
	CacheDir = newString(&Var{Name: "FERRY_CACHE_DIR", Type: "directory", Default: "`os.UserCacheDir()/ferry/cuda`",
		Doc:     "Where the CUDA backend caches compiled kernels.",
		Readers: []string{"cuda"}}, Path)
	// NCCLLib is FERRY_NCCL_LIB.
	NCCLLib = newString(&Var{Name: "FERRY_NCCL_LIB", Type: "path", Default: "`libnccl.so.2` from the CUDA search path",
		Doc:     "The NCCL library `cuda/nccl` loads.",
		Readers: []string{"cuda/nccl"}}, Path)
)

// Debugging.
var (
	// DebugInfs is FERRY_DEBUG_INFS.
	DebugInfs = newBool(&Var{Name: "FERRY_DEBUG_INFS", Type: "`1`", Default: "off",
		Doc:     "An op that makes ±Inf from finite operands is an error naming the op and line. Read at start. `rt.SetDebugInfs`.",
		Readers: []string{"runtime"}}, false)
	// DebugNans is FERRY_DEBUG_NANS.
	DebugNans = newBool(&Var{Name: "FERRY_DEBUG_NANS", Type: "`1`", Default: "off",
		Doc:     "An op that makes a NaN from operands without NaN is an error naming the op and line, like `jax_debug_nans`. Read at start. `rt.SetDebugNans`.",
		Readers: []string{"runtime"}}, false)
	// DumpIR is FERRY_DUMP_IR.
	DumpIR = newString(&Var{Name: "FERRY_DUMP_IR", Type: "directory", Default: "unset",
		Doc:     "Writes the IR before and after every pass (`NNN-<func>-PP-<pass>.ir`, buffer plan as comments; sharded programs also `*-propagated.ir`, `*-partitioned.ir`).",
		Readers: []string{"passes", "runtime"}}, Path)
	// VerifyIR is FERRY_VERIFY_IR.
	VerifyIR = newFlag(&Var{Name: "FERRY_VERIFY_IR", Default: "unset (always on in tests)",
		Doc:     "Runs the IR verifier after every pass.",
		Readers: []string{"passes"}})
	// Progress is FERRY_PROGRESS.
	Progress = newBool(&Var{Name: "FERRY_PROGRESS", Type: "`0` to silence", Default: "on",
		Doc:     "`0`: no progress lines from the examples and long-running tools.",
		Readers: []string{"internal/progress"}}, true)
	// ThreefryPartitionable is FERRY_THREEFRY_PARTITIONABLE.
	ThreefryPartitionable = newBool(&Var{Name: "FERRY_THREEFRY_PARTITIONABLE", Type: "`0` or `1`", Default: "`1`",
		Doc:     "`0`: JAX's older random bit layout. Read at start. `random.SetPartitionable`.",
		Readers: []string{"random"}}, true)
)

// Distributed jobs and collectives.
var (
	// CollectiveTimeout is FERRY_COLLECTIVE_TIMEOUT (0: none).
	CollectiveTimeout = newDuration(&Var{Name: "FERRY_COLLECTIVE_TIMEOUT", Type: "Go duration, or `off`", Want: "a duration such as 30s or 5m, or 0 or off for none", Default: "`5m`",
		Doc:     "How long a collective (MPI, TCP rendezvous, NCCL) waits before failing on every process, naming the collective and who never joined.",
		Readers: []string{"collective", "cuda"}}, 5*time.Minute, 0, "off")
	// CoordinatorAddress is FERRY_COORDINATOR_ADDRESS.
	CoordinatorAddress = newString(&Var{Name: "FERRY_COORDINATOR_ADDRESS", Type: "`host:port`", Default: "unset",
		Doc:     "The TCP rendezvous coordinator (process 0 runs it), for `rt.InitDistributed` without MPI. `rt.DistributedConfig.CoordinatorAddress`. See [distributed](distributed.md#without-mpi-a-tcp-rendezvous).",
		Readers: []string{"collective/rendezvous"}}, String)
	// NumProcesses is FERRY_NUM_PROCESSES.
	NumProcesses = newInt(&Var{Name: "FERRY_NUM_PROCESSES", Type: "integer ≥ 1", Want: "the number of processes", Default: "unset",
		Doc:     "The process count of a TCP-rendezvous job. `rt.DistributedConfig.NumProcesses`.",
		Readers: []string{"collective/rendezvous"}}, 0, math.MinInt64, math.MaxInt64)
	// ProcessID is FERRY_PROCESS_ID.
	ProcessID = newInt(&Var{Name: "FERRY_PROCESS_ID", Type: "integer", Want: "this process's id, 0 to FERRY_NUM_PROCESSES-1", Default: "unset",
		Doc:     "This process's id in a TCP-rendezvous job, in [0, `FERRY_NUM_PROCESSES`). `rt.DistributedConfig.ProcessID`.",
		Readers: []string{"collective/rendezvous"}}, 0, math.MinInt64, math.MaxInt64)
	// MPILib is FERRY_MPI_LIB.
	MPILib = newString(&Var{Name: "FERRY_MPI_LIB", Type: "path", Default: "the system's `libmpi.so`",
		Doc:     "The Open MPI library `collective/mpi` loads.",
		Readers: []string{"collective/mpi"}}, Path)
	// MPILiveness is FERRY_MPI_LIVENESS (0: off).
	MPILiveness = newDuration(&Var{Name: "FERRY_MPI_LIVENESS", Type: "`off`, or a Go duration", Want: "a positive duration such as 20s (the silence after which a process is lost), or off", Default: "on",
		Doc:     "How MPI processes watch each other for death: `off` leaves it to the collective timeout; a duration sets the silence bound.",
		Readers: []string{"collective/mpi"}}, 0, time.Nanosecond, "off", "0")
	// MPIMaxSleep is FERRY_MPI_MAX_SLEEP.
	MPIMaxSleep = newDuration(&Var{Name: "FERRY_MPI_MAX_SLEEP", Type: "Go duration", Want: "a non-negative duration such as 1ms", Default: "`1ms`",
		Doc:     "The longest sleep between polls of a waiting MPI rank. Read at start.",
		Readers: []string{"collective/mpi"}}, time.Millisecond, 0)
	// MPIReduce is FERRY_MPI_REDUCE.
	MPIReduce = newEnum(&Var{Name: "FERRY_MPI_REDUCE", Default: "`native`",
		Doc:     "`ordered`: MPI reductions in rank order for the in-process engine's bits on every dtype.",
		Readers: []string{"collective/mpi"}}, "native", "native", "ordered")
	// MPISpin is FERRY_MPI_SPIN.
	MPISpin = newDuration(&Var{Name: "FERRY_MPI_SPIN", Type: "Go duration", Want: "a non-negative duration such as 1ms", Default: "`1ms`",
		Doc:     "How long a waiting MPI rank polls while yielding before it sleeps. Read at start.",
		Readers: []string{"collective/mpi"}}, time.Millisecond, 0)
)

// Tests, CI scripts and benchmarks.
var (
	// BenchInstr is FERRY_BENCH_INSTR.
	BenchInstr = newFlag(&Var{Name: "FERRY_BENCH_INSTR", Default: "unset", Scope: Test,
		Doc:     "Run the vmath instruction-timing table (`go test ./cpu/vmath -run InstrTable -v`).",
		Readers: []string{"cpu/vmath"}})
	// BenchRatio is FERRY_BENCH_RATIO.
	BenchRatio = newFlag(&Var{Name: "FERRY_BENCH_RATIO", Default: "unset", Scope: Test,
		Doc:     "Run the fused-gelu-against-copy bandwidth benchmark test in `cpu/cpuexec`.",
		Readers: []string{"cpu/cpuexec"}})
	// Chromium is FERRY_CHROMIUM.
	Chromium = newString(&Var{Name: "FERRY_CHROMIUM", Type: "path", Default: "`chromium`, `chromium-browser` or `google-chrome` on the PATH", Scope: Test,
		Doc:     "The browser the memory viewer's browser test and the `bench/memview` scripts use.",
		Readers: []string{"runtime", "bench/memview"}}, Path)
	// CkptDir is FERRY_CKPT_DIR.
	CkptDir = newString(&Var{Name: "FERRY_CKPT_DIR", Type: "directory", Default: "unset", Scope: Test,
		Doc:     "The shared directory of the sharded-checkpoint test under mpirun (`.ci/mpi.sh`).",
		Readers: []string{"checkpoint", ".ci/mpi.sh"}}, Path)
	// CkptMPI is FERRY_CKPT_MPI.
	CkptMPI = newEnum(&Var{Name: "FERRY_CKPT_MPI", Default: "unset", Scope: Test,
		Doc:     "The phase of the sharded-checkpoint test under mpirun.",
		Readers: []string{"checkpoint", ".ci/mpi.sh"}}, "", "save", "load")
	// DistKillTest is FERRY_DIST_KILL_TEST.
	DistKillTest = newBool(&Var{Name: "FERRY_DIST_KILL_TEST", Type: "`1`", Default: "unset", Scope: Test,
		Doc:     "The process-death test of `internal/testkit/disttest` under mpirun.",
		Readers: []string{"internal/testkit/disttest", ".ci/mpi.sh"}}, false)
	// DistTestMismatch is FERRY_DIST_TEST_MISMATCH.
	DistTestMismatch = newBool(&Var{Name: "FERRY_DIST_TEST_MISMATCH", Type: "`1`", Default: "unset", Scope: Test,
		Doc:     "The mismatched-device-count test of `internal/testkit/disttest` under mpirun.",
		Readers: []string{"internal/testkit/disttest", ".ci/mpi.sh"}}, false)
	// HFModels is FERRY_HF_MODELS.
	HFModels = newString(&Var{Name: "FERRY_HF_MODELS", Type: "directory", Default: "unset", Scope: Test,
		Doc:     "Where real Hugging Face model directories are (`all-MiniLM-L6-v2/`, as `.ci/hf.sh` makes it): the tests of `nn/hf` and `examples/embed` that need the real weights run when it is set.",
		Readers: []string{"nn/hf", "examples/embed", ".ci/hf.sh"}}, Path)
	// InitProgramSize is FERRY_INIT_PROGRAM_SIZE.
	InitProgramSize = newFlag(&Var{Name: "FERRY_INIT_PROGRAM_SIZE", Default: "unset", Scope: Test,
		Doc:     "Run the program-size test of `examples/init`.",
		Readers: []string{"examples/init"}})
	// MPIKillTest is FERRY_MPI_KILL_TEST.
	MPIKillTest = newString(&Var{Name: "FERRY_MPI_KILL_TEST", Type: "test-defined", Default: "unset", Scope: Test,
		Doc:     "The rank-death test of `collective/mpi` under mpirun.",
		Readers: []string{"collective/mpi", ".ci/mpi.sh"}}, String)
	// MPITestAllgatherDesc is FERRY_MPI_TEST_ALLGATHER_DESC.
	MPITestAllgatherDesc = newBool(&Var{Name: "FERRY_MPI_TEST_ALLGATHER_DESC", Type: "`1`", Default: "unset", Scope: Test,
		Doc:     "A `collective/mpi` test variant run by `.ci/mpi.sh`.",
		Readers: []string{"collective/mpi", ".ci/mpi.sh"}}, false)
	// Python is FERRY_PYTHON.
	Python = newString(&Var{Name: "FERRY_PYTHON", Type: "path", Default: "`.venv/bin/python`", Scope: Test,
		Doc:     "The Python with JAX that `bench/vsjax` runs.",
		Readers: []string{"bench/vsjax", "bench"}}, Path)
	// RaceAll is FERRY_RACE_ALL.
	RaceAll = newBool(&Var{Name: "FERRY_RACE_ALL", Type: "`1`", Default: "unset", Scope: Test,
		Doc:     "`.ci/race.sh` races every package instead of one group.",
		Readers: []string{".ci/race.sh"}}, false)
	// RaceGroup is FERRY_RACE_GROUP.
	RaceGroup = newInt(&Var{Name: "FERRY_RACE_GROUP", Type: "integer 0–3", Want: "an integer from 0 to 3", Default: "the day of the year modulo 4", Scope: Test,
		Doc:     "Which group of packages `.ci/race.sh` runs under the race detector.",
		Readers: []string{".ci/race.sh"}}, 0, 0, 3)
	// RandomFeatures is FERRY_RANDOM_FEATURES.
	RandomFeatures = newString(&Var{Name: "FERRY_RANDOM_FEATURES", Kind: List, Type: "feature list (`-name`, `+name`, `none`)", Default: "all", Scope: Test,
		Doc:     "Narrows the random programs of `internal/testkit/difftest`.",
		Readers: []string{"internal/testkit/difftest"}}, List)
	// RandomPrograms is FERRY_RANDOM_PROGRAMS (the default is the reader's).
	RandomPrograms = newUint(&Var{Name: "FERRY_RANDOM_PROGRAMS", Type: "integer", Want: "a non-negative integer", Default: "`400` (`internal/testkit/difftest`), `0` extra (`passes`)", Scope: Test,
		Doc:     "Number of random programs the differential tests run.",
		Readers: []string{"internal/testkit/difftest", "passes"}})
	// RandomSeed is FERRY_RANDOM_SEED (the default, 1, is the reader's).
	RandomSeed = newUint(&Var{Name: "FERRY_RANDOM_SEED", Type: "integer", Want: "a non-negative integer", Default: "`1`", Scope: Test,
		Doc:     "The first seed of the random-program tests.",
		Readers: []string{"internal/testkit/difftest", "passes"}})
	// RequireChromium is FERRY_REQUIRE_CHROMIUM.
	RequireChromium = newFlag(&Var{Name: "FERRY_REQUIRE_CHROMIUM", Default: "unset", Scope: Test,
		Doc:     "The browser test of the memory viewer fails instead of skipping without Chromium (CI).",
		Readers: []string{"runtime"}})
	// RequireNVRTC is FERRY_REQUIRE_NVRTC.
	RequireNVRTC = newBool(&Var{Name: "FERRY_REQUIRE_NVRTC", Type: "`1`", Default: "unset", Scope: Test,
		Doc:     "The NVRTC tests fail instead of skipping without NVRTC (CI).",
		Readers: []string{"cuda", ".ci"}}, false)
	// ShardedPrograms is FERRY_SHARDED_PROGRAMS (the default is the reader's).
	ShardedPrograms = newUint(&Var{Name: "FERRY_SHARDED_PROGRAMS", Type: "integer", Want: "a non-negative integer", Default: "`60`", Scope: Test,
		Doc:     "Number of random sharded programs of `internal/testkit/difftest`.",
		Readers: []string{"internal/testkit/difftest"}})
	// TestSeed is FERRY_TEST_SEED.
	TestSeed = newUint(&Var{Name: "FERRY_TEST_SEED", Type: "integer", Want: "an unsigned decimal integer", Default: "a fresh random seed", Scope: Test,
		Doc:     "The seed of every randomised test (printed when a test fails), to replay it.",
		Readers: []string{"internal/testkit/testseed", "checkpoint"}})
	// Venv is FERRY_VENV.
	Venv = newString(&Var{Name: "FERRY_VENV", Type: "directory", Default: "`.venv` in the current directory", Scope: Test,
		Doc:     "Where `scripts/venv` makes the Python environment with JAX.",
		Readers: []string{"scripts/venv"}}, Path)
)

// Variables a test sets for a child process it starts.
var (
	// CkptJobKill is FERRY_CKPT_JOB_KILL.
	CkptJobKill = newString(&Var{Name: "FERRY_CKPT_JOB_KILL", Type: "test-defined", Default: "unset", Scope: Internal,
		Doc:     "Marks a child of the checkpoint job-kill test.",
		Readers: []string{"checkpoint"}}, String)
	// CkptKill is FERRY_CKPT_KILL.
	CkptKill = newString(&Var{Name: "FERRY_CKPT_KILL", Type: "test-defined", Default: "unset", Scope: Internal,
		Doc:     "Marks a child of the checkpoint kill test.",
		Readers: []string{"checkpoint"}}, String)
	// CPUFeatChild is FERRY_CPUFEAT_CHILD.
	CPUFeatChild = newBool(&Var{Name: "FERRY_CPUFEAT_CHILD", Type: "`1`", Default: "unset", Scope: Internal,
		Doc:     "Marks a child of the `cpu/cpufeat` test.",
		Readers: []string{"cpu/cpufeat"}}, false)
	// CPUFeatWant is FERRY_CPUFEAT_WANT.
	CPUFeatWant = newEnum(&Var{Name: "FERRY_CPUFEAT_WANT", Default: "unset", Scope: Internal,
		Doc:     "The path a `cpu/cpufeat` test child must see.",
		Readers: []string{"cpu/cpufeat"}}, "", "avx512", "avx2", "go")
	// RendezvousTestChild is FERRY_RENDEZVOUS_TEST_CHILD.
	RendezvousTestChild = newString(&Var{Name: "FERRY_RENDEZVOUS_TEST_CHILD", Type: "test-defined", Default: "unset", Scope: Internal,
		Doc:     "Marks a child of the `collective/rendezvous` tests.",
		Readers: []string{"collective/rendezvous"}}, String)
	// RTTestTCPChild is FERRY_RT_TEST_TCP_CHILD.
	RTTestTCPChild = newString(&Var{Name: "FERRY_RT_TEST_TCP_CHILD", Type: "test-defined", Default: "unset", Scope: Internal,
		Doc:     "Marks a child of the runtime's TCP-job test.",
		Readers: []string{"runtime"}}, String)
	// TestDebugNansChild is FERRY_TEST_DEBUG_NANS_CHILD.
	TestDebugNansChild = newFlag(&Var{Name: "FERRY_TEST_DEBUG_NANS_CHILD", Type: "`1`", Default: "unset", Scope: Internal,
		Doc:     "Marks a child of the runtime's NaN-check test.",
		Readers: []string{"runtime"}})
	// TestEfenceChild is FERRY_TEST_EFENCE_CHILD.
	TestEfenceChild = newFlag(&Var{Name: "FERRY_TEST_EFENCE_CHILD", Type: "test-defined", Default: "unset", Scope: Internal,
		Doc:     "Marks a child of the CUDA backend's moved-stack test.",
		Readers: []string{"cuda"}})
)
