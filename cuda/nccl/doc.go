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
// Collective steps are enqueued on the compute stream of the backend's
// stream plan, so they are ordered with the kernels around them without host
// synchronisation. One process driving all of a machine's GPUs makes one
// communicator with CommInitAll (rank i on devices[i]) and issues the ranks'
// calls between GroupStart and GroupEnd, as NCCL requires when one thread
// drives several ranks; each rank's buffers and stream belong to its
// device (Comm.Device). With one process per GPU, process 0 calls
// GetUniqueID and the id is broadcast to the others (collective/mpi's
// Broadcast under mpirun, or the coordinator's TCP exchange), and each calls
// CommInitRank. A rank that sees a peer fail or a collective time out polls
// AsyncError and calls Abort, which NCCL documents as the way to release a
// communicator whose peers may be gone (Destroy would wait for them).
//
// # What is tested where
//
// Without a GPU (go test ./cuda/nccl, gcc needed, skipped otherwise): a
// fake libnccl.so.2 written in C with the real signatures and compiled by
// gcc is loaded through $FERRY_NCCL_LIB; the tests check that every wrapper
// hands the C side exactly its arguments (the 128 id bytes and the int after
// them, counts, data type and reduction enums, root and peer, communicator
// and stream pointers), that errors carry ncclGetErrorString's text, that
// bad arguments are refused before reaching NCCL, and the load errors.
// With a GPU and NCCL, TestSmokeRealNCCL makes a one-device communicator
// with CommInitAll and all-reduces a device buffer on a CUDA stream. The
// multi-GPU and multi-process behaviour (ring and tree algorithms,
// CommInitRank blocking until all ranks join, the group semantics) is
// NCCL's, argued from its documentation, not tested here.
package nccl
