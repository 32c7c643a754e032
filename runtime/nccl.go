package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ferryml/ferry/backend"
)

// Device communicators (NCCL on the CUDA backend).
//
// A backend whose collectives run on device memory, on its own streams
// (backend.DeviceCollectives: the CUDA backend), gets the communicators of
// a sharded program's devices from the DeviceCommMaker registered for its
// platform (package cuda/nccl registers NCCL's for "cuda"; importing it is
// what makes collectives run there), instead of package collective's
// host-memory engines:
//
//   - in one process (or for a mesh of this process's devices only), each
//     group of the mesh along each axis string of the program is one
//     InitAll (ncclCommInitAll) over the group's device ordinals: for the
//     CUDA backend, which drives one GPU, a one-device communicator;
//   - for a mesh over several processes (InitDistributed), one device per
//     process, each group along each axis string is one InitRank
//     (ncclCommInitRank): the group's first device (its rank 0) makes the
//     group's id with NewGroupID, and the ids travel in one AllGather over
//     the processes per axis string (each process contributing the ids of
//     the groups its device leads), which every process of the job makes at
//     the same call, as it makes worldComms' splits.
//
// The maker loads its library on first use, so NCCL is loaded only when a
// sharded program with collectives first runs. Communicators are made at
// the first call of a sharded executable and reused by its later calls;
// a failed call aborts them (the executor does, so that no rank waits for
// the failed one) and the next call makes new ones.

// groupIDBytes is the size of a group id in the exchange (NCCL's
// ncclUniqueId).
const groupIDBytes = 128

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
	pos := localPositions(m)
	if len(e.part.Axes) == 0 {
		return make([]map[string]backend.DeviceCommunicator, len(pos)), nil
	}
	if set, ok := takeIdle(&e.mu, &e.freeDev); ok {
		return set, nil
	}
	maker := backend.DeviceCommMakerFor(e.be.Name())
	if maker == nil {
		return nil, fmt.Errorf("the %s backend runs collectives on device memory, and no maker of its communicators is registered: import github.com/ferryml/ferry/cuda/nccl (NCCL)", e.be.Name())
	}
	_, _, _, on := distInfo()
	multi := on && spansProcesses(m)
	if on && !multi && !slices.Contains(meshProcesses(m), ProcessIndex()) {
		return nil, nil // another process's mesh: nothing runs here
	}
	all := m.Devices()
	local := map[int]int{} // global device → index among this process's
	for i, r := range pos {
		local[all[r]] = i
	}
	set := make([]map[string]backend.DeviceCommunicator, len(pos))
	for i := range set {
		set[i] = map[string]backend.DeviceCommunicator{}
	}
	fail := func(err error) ([]map[string]backend.DeviceCommunicator, error) {
		abortDeviceComms(set)
		return nil, err
	}
	for _, ax := range e.part.Axes {
		groups, err := m.AxisGroups(strings.Split(ax, ",")...)
		if err != nil {
			return fail(err)
		}
		if multi {
			if err := joinDeviceGroups(ctx, maker, groups, ax, set, local); err != nil {
				return fail(err)
			}
			continue
		}
		for _, g := range groups {
			devs := make([]int, len(g))
			for j, d := range g {
				devs[j], _ = localID(d)
			}
			cs, err := maker.InitAll(devs)
			if err != nil {
				return fail(fmt.Errorf("device communicator over %s (devices %v): %w", ax, devs, err))
			}
			for j, d := range g {
				set[local[d]][ax] = cs[j]
			}
		}
	}
	return set, nil
}

// joinDeviceGroups makes this process's device communicators of groups
// (the groups of the mesh along axis string ax) with InitRank, exchanging
// the groups' ids over the processes (see the comment at the top).
func joinDeviceGroups(ctx context.Context, maker backend.DeviceCommMaker, groups [][]int, ax string, set []map[string]backend.DeviceCommunicator, local map[int]int) error {
	p, _, k, _ := distInfo()
	if k != 1 {
		return fmt.Errorf("device communicators across processes need one device per process (this one has %d)", k)
	}
	mine := make([]byte, groupIDBytes)
	for _, g := range groups {
		if _, ok := local[g[0]]; !ok {
			continue
		}
		id, err := maker.NewGroupID()
		if err == nil && len(id) > groupIDBytes {
			err = fmt.Errorf("a group id of %d bytes (at most %d)", len(id), groupIDBytes)
		}
		if err != nil {
			// Still take part in the exchange, so no process waits for this one.
			_, xerr := exchangeProcesses(ctx, mine)
			return errors.Join(fmt.Errorf("device communicator over %s: %w", ax, err), xerr)
		}
		copy(mine, id)
	}
	all, err := exchangeProcesses(ctx, mine)
	if err != nil {
		return fmt.Errorf("exchanging the ids of the device communicators over %s: %w", ax, err)
	}
	for _, g := range groups {
		for j, d := range g {
			i, ok := local[d]
			if !ok {
				continue
			}
			lead := g[0] / k // the process of the group's rank 0
			c, err := maker.InitRank(all[lead*groupIDBytes:(lead+1)*groupIDBytes], len(g), j)
			if err != nil {
				return fmt.Errorf("device communicator over %s: process %d, rank %d of %d: %w", ax, p, j, len(g), err)
			}
			set[i][ax] = c
		}
	}
	return nil
}

// abortDeviceComms aborts every communicator of set.
func abortDeviceComms(set []map[string]backend.DeviceCommunicator) {
	for _, m := range set {
		for _, c := range m {
			_ = c.Abort()
		}
	}
}
