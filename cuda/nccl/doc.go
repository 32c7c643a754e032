// Package nccl binds NVIDIA's NCCL (libnccl.so.2), loaded at run time
// through purego like the CUDA driver (package cuda): no cgo and no CUDA
// toolkit at build time, so the module builds with CGO_ENABLED=0 anywhere.
//
// Load finds the library ($FERRY_NCCL_LIB, else libnccl.so.2 in
// cuda.SearchDirs — $FERRY_CUDA_LIB_DIR, /usr/local/cuda*/lib64,
// $LD_LIBRARY_PATH, the nvidia/nccl/lib folder of the nvidia-nccl-cu12 pip
// wheel — then the system loader) and resolves ncclGetVersion,
// ncclGetUniqueId, ncclCommInitRank, ncclCommInitAll, ncclGroupStart/End,
// ncclAllReduce, ncclAllGather, ncclReduceScatter, ncclBroadcast,
// ncclSend/Recv, ncclCommDestroy, ncclCommAbort, ncclCommGetAsyncError and
// ncclGetErrorString; a failure is a *cuda.LoadError listing every attempt.
// Buffers are device pointers (CUdeviceptr) and streams CUstreams, as the
// CUDA backend holds them; element types map from ir.DType (DataTypeOf; bool
// has no NCCL type) and reductions from collective.Op (RedOpOf). Failed calls
// return *Error with the ncclResult_t and ncclGetErrorString's text.
//
// It lives under cuda because it is a CUDA library used by the CUDA backend
// alone: it reuses cuda's search path and LoadError, and works on device
// memory and CUDA streams, not on the host buffers of the collective
// package's Communicator interface. It does not import runtime.
//
// # The ncclUniqueId argument
//
// ncclCommInitRank(ncclComm_t*, int nranks, ncclUniqueId id, int rank) takes
// a 128-byte struct by value. On amd64 (System V) an aggregate over 16 bytes
// is class MEMORY: the caller copies it into the stack argument area and it
// uses no register, so nranks and rank still go in %rsi and %rdx. purego's
// SyscallN puts its first six arguments in the integer registers and the
// rest on the stack in order; the binding therefore passes comm, nranks,
// rank, three unused register slots, then the id's 16 eightbytes. (Sixteen
// words right after nranks would be wrong: four of them would land in
// registers; the test sees exactly that failure.) On arm64 (AAPCS64) an
// aggregate over 16 bytes is passed as a pointer to a caller-made copy, and
// the binding does that. purego v0.11.3's RegisterFunc also handles the
// struct on linux/amd64 (placeStack for structs over 64 bytes) and a test
// checks it agrees; the binding keeps SyscallN, like package cuda.
//
// # How the CUDA backend uses it
//
// Comm.Collectives adapts a communicator to backend.DeviceCommunicator, the
// interface the CUDA backend consumes (backend.ExecOptions.DeviceComms, one
// per collective axis of a per-device program); importing this package also
// registers, for "cuda", the backend.DeviceCommMaker with which the runtime
// makes them (NCCL is loaded when a sharded program with collectives first
// runs). The backend enqueues each collective on the compute stream of its
// stream plan, after the events its producers' steps recorded on other
// streams and before its consumers: NCCL documents that a collective call
// returns once the operation is enqueued on the given stream and that it
// then runs asynchronously on the device, ordered like any stream work
// ("CUDA Stream Semantics"), so no host synchronisation is needed around
// it. Where the op's dimension is not leading, generated transpose kernels
// on the same stream move the rank axis to or from the front of NCCL's flat
// buffers; all_to_all and collective_permute are ncclSend/ncclRecv pairs
// between GroupStart and GroupEnd, as NCCL requires for point-to-point
// calls that would otherwise deadlock. While the backend waits for the
// compute stream it polls it (cuStreamQuery) and AsyncError, and on an
// error or a done context calls Abort: NCCL's documented way to stop
// operations that wait for a peer that failed (Destroy would wait for
// them).
//
// # Several GPUs
//
// One process per GPU (what works today): the CUDA backend drives one GPU,
// so a job over several GPUs is one process per GPU (rt.InitDistributed,
// under mpirun or a coordinator). For each group of the mesh along each
// collective axis, the group's rank 0 calls GetUniqueID, the ids travel
// over the processes' communicator (one AllGather per axis), and every
// member calls CommInitRank(group size, id, rank in group); NCCL documents
// that the id may travel over any CPU channel (MPI, sockets) and that
// CommInitRank blocks until every rank has joined. Each process then
// enqueues its GPU's collectives from one thread, the execution's. A 2-node
// × 8-GPU job is 16 processes (mpirun -np 16 --hostfile hosts), each
// running its GPU's per-device program.
//
// One process driving all of a machine's GPUs: CommInitAll makes one
// communicator over them in one call (NCCL documents it as equivalent to
// GetUniqueID and a CommInitRank per device, and limited to one process).
// NCCL allows the ranks to be driven either from one thread, with every
// rank's call of a collective between GroupStart and GroupEnd (a call may
// block waiting for the other ranks before enqueuing, so a plain loop over
// the ranks would deadlock on the first), or from one thread per rank.
// Ferry's runtime runs each device's program on its own goroutine, which is
// the one-thread-per-rank pattern, with the calls of a grouped
// Send/Recv of one rank in their own group. But the CUDA backend drives one
// GPU (Devices lists device 0), so this mode needs a multi-device CUDA
// backend, which does not exist yet: today the runtime calls CommInitAll
// with the one device of a one-device mesh (where the partitioner emits no
// collectives over axes of size 1 anyway).
//
// # What is tested where
//
// Without a GPU (go test ./cuda/nccl, gcc needed, skipped otherwise): a
// fake libnccl.so.2 written in C with the real signatures and compiled by
// gcc is loaded through $FERRY_NCCL_LIB; the tests check that every wrapper
// hands the C side exactly its arguments (the 128 id bytes and the int after
// them, counts, data type and reduction enums, root and peer, communicator
// and stream pointers), that errors carry ncclGetErrorString's text, that
// bad arguments are refused before reaching NCCL, the load errors, and the
// adapter and maker (reductions mapped, async errors, idempotent Abort). The
// CUDA backend's collective steps are tested in package cuda against a
// fake group of device communicators over the fake driver's memory (two
// ranks, real results, calls on the compute stream, no unordered stream
// operations, errors). With a GPU and NCCL, TestSmokeRealNCCL makes a
// one-device communicator with CommInitAll and all-reduces a device buffer
// on a CUDA stream, and TestBackendCollectivesRealNCCL runs every
// collective op through the CUDA backend with it. The multi-GPU and
// multi-process behaviour (ring and tree algorithms, CommInitRank blocking
// until all ranks join, the group semantics) is NCCL's, argued from its
// documentation above, not tested here.
package nccl
