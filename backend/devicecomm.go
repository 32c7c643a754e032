package backend

import (
	"sync"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

// DeviceCommunicator is one rank's handle on a group of devices that run
// collectives on device memory, enqueued on the backend's streams: NCCL's
// ncclComm_t as the CUDA backend consumes it (package cuda/nccl's
// Comm.Collectives adapts an *nccl.Comm). It is the device-memory
// counterpart of collective.Communicator, whose buffers are host bytes.
//
// Buffers are device pointers of the rank's device and stream is a stream
// of that device (a CUstream): a call enqueues the collective on stream and
// returns; it completes on the device, ordered with the stream's other
// work, when every rank of the group has enqueued it. Every rank calls the
// same collectives in the same order. Counts are elements of dt. A call
// that fails to enqueue returns an error; a failure the collective meets
// later on the device (a peer that died, a network error) is reported by
// AsyncError.
//
// As with NCCL, the calls between GroupStart and GroupEnd are launched
// together: Send and Recv pairs must be grouped so that ranks sending to
// each other do not deadlock.
type DeviceCommunicator interface {
	// Rank is this rank's index in the group, in [0, Size()).
	Rank() int
	// Size is the number of ranks in the group.
	Size() int
	// AllReduce reduces count elements of send over the ranks with op into
	// recv (send and recv may be equal: in place).
	AllReduce(send, recv uintptr, count int, dt ir.DType, op collective.Op, stream uintptr) error
	// AllGather gathers sendCount elements from every rank into recv, rank
	// i's at element i·sendCount (a flat gather: along axis 0).
	AllGather(send, recv uintptr, sendCount int, dt ir.DType, stream uintptr) error
	// ReduceScatter reduces Size()·recvCount elements of send over the ranks
	// with op; rank i receives the i-th block of recvCount elements.
	ReduceScatter(send, recv uintptr, recvCount int, dt ir.DType, op collective.Op, stream uintptr) error
	// Broadcast copies count elements of root's send into every rank's recv.
	Broadcast(send, recv uintptr, count int, dt ir.DType, root int, stream uintptr) error
	// Send sends count elements of send to rank peer (matched by its Recv).
	Send(send uintptr, count int, dt ir.DType, peer int, stream uintptr) error
	// Recv receives count elements from rank peer into recv.
	Recv(recv uintptr, count int, dt ir.DType, peer int, stream uintptr) error
	// GroupStart and GroupEnd bracket calls launched together.
	GroupStart() error
	// GroupEnd ends the group GroupStart began, launching its calls.
	GroupEnd() error
	// AsyncError returns nil while the communicator's collectives are
	// healthy (complete or still running), or the error one of them met on
	// the device (ncclCommGetAsyncError).
	AsyncError() error
	// Abort frees the communicator at once, cancelling its pending
	// collectives so that nothing waits for them (ncclCommAbort); it is
	// unusable afterwards. Calling it again does nothing.
	Abort() error
}

// DeviceCollectives is implemented by a backend whose executables run
// collective ops through ExecOptions.DeviceComms (device memory, the
// backend's streams) instead of ExecOptions.Comms: the runtime then gives a
// sharded program's devices communicators of the DeviceCommMaker registered
// for the backend's platform.
type DeviceCollectives interface {
	// DeviceCollectives reports whether the backend's collectives need
	// ExecOptions.DeviceComms.
	DeviceCollectives() bool
}

// DeviceCommMaker makes the device communicators of one platform (NCCL's
// for "cuda", registered by package cuda/nccl). Made communicators are the
// caller's; a failed execution aborts them.
type DeviceCommMaker interface {
	// InitAll makes one group of len(devices) ranks driven by this process,
	// rank i on device ordinal devices[i] (ncclCommInitAll).
	InitAll(devices []int) ([]DeviceCommunicator, error)
	// NewGroupID returns the id of a new group (ncclGetUniqueId), made by
	// one rank and sent to the group's other ranks.
	NewGroupID() ([]byte, error)
	// InitRank joins the group of size ranks that id names as rank, on the
	// backend's device of this process (ncclCommInitRank); it returns once
	// every rank has joined.
	InitRank(id []byte, size, rank int) (DeviceCommunicator, error)
}

var (
	makersMu sync.Mutex
	makers   = map[string]DeviceCommMaker{}
)

// RegisterDeviceCommMaker makes m the maker of device communicators for
// the backends of platform (replacing any earlier one).
func RegisterDeviceCommMaker(platform string, m DeviceCommMaker) {
	makersMu.Lock()
	defer makersMu.Unlock()
	makers[platform] = m
}

// DeviceCommMakerFor returns the maker registered for platform, or nil.
func DeviceCommMakerFor(platform string) DeviceCommMaker {
	makersMu.Lock()
	defer makersMu.Unlock()
	return makers[platform]
}
