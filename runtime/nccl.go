package runtime

import (
	"context"
	"fmt"

	"github.com/ferryml/ferry/backend"
)

// Device communicators (NCCL on the CUDA backend): a backend whose
// collectives run on device memory, on its own streams
// (backend.DeviceCollectives: the CUDA backend), gets the communicators of
// a sharded program's devices from the DeviceCommMaker registered for its
// platform (package cuda/nccl registers NCCL's for "cuda"; importing it is
// what makes collectives run there), instead of package collective's
// host-memory engines. distributed.Job.DeviceComms makes them (across the
// processes of a job too).
//
// The maker loads its library on first use, so NCCL is loaded only when a
// sharded program with collectives first runs. Communicators are made at
// the first call of a sharded executable and reused by its later calls;
// a failed call aborts them (the executor does, so that no rank waits for
// the failed one) and the next call makes new ones.

// usesDeviceComms reports whether be runs collectives through
// ExecOptions.DeviceComms.
func usesDeviceComms(be Backend) bool {
	d, ok := be.(backend.DeviceCollectives)
	return ok && d.DeviceCollectives()
}

// deviceComms returns a set of device communicators, one map per device of
// this process (in mesh order, as comms) from each axis string of the
// program to the device's communicator of its group: an idle set of an
// earlier call, or a new one.
func (e *shardedExecutable) deviceComms(ctx context.Context) ([]map[string]backend.DeviceCommunicator, error) {
	m := e.part.Mesh
	if len(e.part.Axes) == 0 {
		return make([]map[string]backend.DeviceCommunicator, len(localPositions(m))), nil
	}
	if set, ok := takeIdle(&e.mu, &e.freeDev); ok {
		return set, nil
	}
	maker := backend.DeviceCommMakerFor(e.be.Name())
	if maker == nil {
		return nil, fmt.Errorf("the %s backend runs collectives on device memory, and no maker of its communicators is registered: import github.com/ferryml/ferry/cuda/nccl (NCCL)", e.be.Name())
	}
	return currentJob().DeviceComms(ctx, maker, m, e.part.Axes)
}
