package distributed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/rendezvous"
	"github.com/ferryml/ferry/ir"
)

// WorldComms returns the communicators of this process's devices of mesh
// m, in the order of LocalPositions, made from the job's world of devices:
// each of this process's devices splits the world (devices outside m join
// no group), ranked by mesh position, then takes collective.MeshAxes of
// each axis string of axes (parseAxes gives an axis string's mesh axes).
// Every process calls it for the same mesh and axes at the same point (it
// is collective over the world).
func (j *Job) WorldComms(ctx context.Context, m *ir.Mesh, axes []string, parseAxes func(string) []int) ([]map[string]collective.Communicator, error) {
	if j.IDsOnly() { // every process fails here alike: none waits for another
		return nil, fmt.Errorf("the program over %v has collectives between processes: %w", m, rendezvous.ErrDataCollective)
	}
	if j == nil {
		return nil, ErrEnded
	}
	j.splitMu.Lock()
	defer j.splitMu.Unlock()
	if j.ended() {
		return nil, ErrEnded
	}
	p, k := j.p, j.k
	pos := map[int]int{} // global device -> mesh position
	for r, g := range m.Devices() {
		pos[g] = r
	}
	sets := make([]map[string]collective.Communicator, k) // by local device
	errs := OnEachDevice(k, func(d int) error {
		g := p*k + d
		color, key := collective.Undefined, 0
		if r, ok := pos[g]; ok {
			color, key = 0, r
		}
		c, err := j.world[d].Split(ctx, color, key)
		if err != nil {
			err = fmt.Errorf("communicator over %v: %w", m, err)
			j.world[d].Abort(err)
			return err
		}
		if c == nil {
			return nil
		}
		sets[d] = map[string]collective.Communicator{}
		for _, ax := range axes {
			sub, err := collective.MeshAxes(ctx, c, m.Shape(), parseAxes(ax)...)
			if err != nil {
				err = fmt.Errorf("communicator over %s: %w", ax, err)
				c.Abort(err)
				return err
			}
			sets[d][ax] = sub
		}
		return nil // c stays open: the groups split from it share its state
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var out []map[string]collective.Communicator
	for _, g := range m.Devices() {
		if g/k == p {
			out = append(out, sets[g-p*k])
		}
	}
	return out, nil
}

// OnEachDevice runs fn(r) for r in [0, n) at once, one goroutine each (one
// per device or process: they may wait on each other in collectives), and
// returns their errors.
func OnEachDevice(n int, fn func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

// ReadsFromProcesses reports whether reading an array over mesh m whole
// gathers blocks from the job's processes (Exchange): always in a job of
// several processes, except when they meet through a TCP rendezvous, which
// carries no array data: then an array over this process's devices only is
// read locally, and one over other processes' devices is an error.
func (j *Job) ReadsFromProcesses(m *ir.Mesh) (bool, error) {
	switch {
	case j == nil:
		return false, nil
	case !j.IDsOnly():
		return true, nil
	}
	if ps := j.MeshProcesses(m); len(ps) == 1 && ps[0] == j.p {
		return false, nil
	}
	return false, fmt.Errorf("reading whole an array over %v, whose devices are other processes': %w", m, rendezvous.ErrDataCollective)
}

// Exchange gathers every process's mine (all the same length), in process
// order, over the processes: a collective every process of the job calls
// (rt.ProcessBarrier, reading a sharded array whole, the ids of device
// communicators).
func (j *Job) Exchange(ctx context.Context, mine []byte) ([]byte, error) {
	if j == nil {
		return nil, ErrEnded
	}
	j.gatherMu.Lock()
	defer j.gatherMu.Unlock()
	if j.ended() {
		return nil, ErrEnded
	}
	all := make([]byte, len(mine)*j.np)
	if err := j.gather.AllGather(ctx, ir.Uint8, nil, 0, mine, all); err != nil {
		return nil, err
	}
	return all, nil
}

// Barrier returns when every process of the job has called it, and tells
// each of them which processes passed ok = false (ascending; none when all
// succeeded). In a job of one it returns at once.
func (j *Job) Barrier(ok bool) (failed []int, err error) {
	mine := []byte{1}
	if ok {
		mine[0] = 0
	}
	if j == nil {
		if !ok {
			return []int{0}, nil
		}
		return nil, nil
	}
	all, err := j.Exchange(context.Background(), mine)
	if err != nil {
		return nil, err
	}
	for q, b := range all {
		if b != 0 {
			failed = append(failed, q)
		}
	}
	return failed, nil
}

// Device communicators (NCCL on the CUDA backend).
//
// A backend whose collectives run on device memory, on its own streams
// (backend.DeviceCollectives: the CUDA backend), gets the communicators of
// a sharded program's devices from the DeviceCommMaker registered for its
// platform (package cuda/nccl registers NCCL's for "cuda"), instead of
// package collective's host-memory engines:
//
//   - in one process (or for a mesh of this process's devices only), each
//     group of the mesh along each axis string of the program is one
//     InitAll (ncclCommInitAll) over the group's device ordinals: for the
//     CUDA backend, which drives one GPU, a one-device communicator;
//   - for a mesh over several processes, one device per process, each
//     group along each axis string is one InitRank (ncclCommInitRank): the
//     group's first device (its rank 0) makes the group's id with
//     NewGroupID, and the ids travel in one Exchange over the processes per
//     axis string (each process contributing the ids of the groups its
//     device leads), which every process of the job makes at the same call,
//     as it makes WorldComms' splits.

// GroupIDBytes is the size of a group id in the exchange (NCCL's
// ncclUniqueId).
const GroupIDBytes = 128

// DeviceComms makes the device communicators of this process's devices of
// mesh m with maker: one map per device (in the order of LocalPositions)
// from each axis string of axes to the device's communicator of its group
// along those axes. For a mesh of another process's devices it returns nil.
// For a mesh over several processes it is collective over the job.
func (j *Job) DeviceComms(ctx context.Context, maker backend.DeviceCommMaker, m *ir.Mesh, axes []string) ([]map[string]backend.DeviceCommunicator, error) {
	pos := j.LocalPositions(m)
	multi := j != nil && j.SpansProcesses(m)
	if j != nil && !multi && !slices.Contains(j.MeshProcesses(m), j.p) {
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
		AbortDeviceComms(set)
		return nil, err
	}
	for _, ax := range axes {
		groups, err := m.AxisGroups(strings.Split(ax, ",")...)
		if err != nil {
			return fail(err)
		}
		if multi {
			if err := j.joinDeviceGroups(ctx, maker, groups, ax, set, local); err != nil {
				return fail(err)
			}
			continue
		}
		for _, g := range groups {
			devs := make([]int, len(g))
			for i, d := range g {
				devs[i], _ = j.LocalID(d)
			}
			cs, err := maker.InitAll(devs)
			if err != nil {
				return fail(fmt.Errorf("device communicator over %s (devices %v): %w", ax, devs, err))
			}
			for i, d := range g {
				set[local[d]][ax] = cs[i]
			}
		}
	}
	return set, nil
}

// joinDeviceGroups makes this process's device communicators of groups
// (the groups of the mesh along axis string ax) with InitRank, exchanging
// the groups' ids over the processes (see DeviceComms).
func (j *Job) joinDeviceGroups(ctx context.Context, maker backend.DeviceCommMaker, groups [][]int, ax string, set []map[string]backend.DeviceCommunicator, local map[int]int) error {
	p, k := j.p, j.k
	if k != 1 {
		return fmt.Errorf("device communicators across processes need one device per process (this one has %d)", k)
	}
	mine := make([]byte, GroupIDBytes)
	for _, g := range groups {
		if _, ok := local[g[0]]; !ok {
			continue
		}
		id, err := maker.NewGroupID()
		if err == nil && len(id) > GroupIDBytes {
			err = fmt.Errorf("a group id of %d bytes (at most %d)", len(id), GroupIDBytes)
		}
		if err != nil {
			// Still take part in the exchange, so no process waits for this one.
			_, xerr := j.Exchange(ctx, mine)
			return errors.Join(fmt.Errorf("device communicator over %s: %w", ax, err), xerr)
		}
		copy(mine, id)
	}
	all, err := j.Exchange(ctx, mine)
	if err != nil {
		return fmt.Errorf("exchanging the ids of the device communicators over %s: %w", ax, err)
	}
	for _, g := range groups {
		for r, d := range g {
			i, ok := local[d]
			if !ok {
				continue
			}
			lead := g[0] / k // the process of the group's rank 0
			c, err := maker.InitRank(all[lead*GroupIDBytes:(lead+1)*GroupIDBytes], len(g), r)
			if err != nil {
				return fmt.Errorf("device communicator over %s: process %d, rank %d of %d: %w", ax, p, r, len(g), err)
			}
			set[i][ax] = c
		}
	}
	return nil
}

// AbortDeviceComms aborts every communicator of set.
func AbortDeviceComms(set []map[string]backend.DeviceCommunicator) {
	for _, m := range set {
		for _, c := range m {
			_ = c.Abort()
		}
	}
}
