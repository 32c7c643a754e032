package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/runtime/distributed"
)

// Distributed start-up is package runtime/distributed; this file keeps the
// job this process joined and gives the rest of the runtime its answers.

// DistributedConfig configures InitDistributed. The zero value takes the
// job from mpirun, else from the environment (see InitDistributed).
type DistributedConfig = distributed.Config

// dist is the job of several processes this process joined
// (InitDistributed); job is nil in a job of one.
var dist struct {
	mu  sync.Mutex
	job *distributed.Job
}

// currentJob returns the job this process joined, nil in a job of one.
func currentJob() *distributed.Job {
	dist.mu.Lock()
	defer dist.mu.Unlock()
	return dist.job
}

// InitDistributed joins this process to a job of several processes that run
// one sharded program over all their devices, like
// jax.distributed.initialize. Every process of the job calls it once, before
// making arrays, with the same number of local devices (for the CPU backend:
// FERRY_CPU_DEVICES or SetCPUDeviceCount; the processes check that they
// agree). Launched by mpirun it needs no configuration:
//
//	FERRY_CPU_DEVICES=2 mpirun -np 4 ./prog   # 8 devices, 2 per process
//
// Without MPI, each process is started with the coordinator's address (a
// port on process 0's machine), the process count and its own id, in the
// environment or in cfg's CoordinatorAddress, NumProcesses and ProcessID:
//
//	FERRY_COORDINATOR_ADDRESS=node0:29500 FERRY_NUM_PROCESSES=2 FERRY_PROCESS_ID=0 ./prog   # on node0
//	FERRY_COORDINATOR_ADDRESS=node0:29500 FERRY_NUM_PROCESSES=2 FERRY_PROCESS_ID=1 ./prog   # on node1
//
// The processes then meet through a TCP rendezvous (package
// collective/rendezvous), which carries only barriers and small ids (the
// device counts, NCCL unique ids), never array data: ProcessIndex,
// ProcessCount, Devices, LocalDevices and ProcessBarrier work, and so do
// programs whose collectives stay within one process's devices, but on the
// CPU backend a sharded program with collectives between processes, or
// reading whole an array over other processes' devices, fails with an error
// wrapping rendezvous.ErrDataCollective — such jobs need mpirun (or NCCL on
// GPUs).
//
// Where the job comes from, first match wins: cfg.Processes; cfg's
// CoordinatorAddress, NumProcesses and ProcessID (when any is set); mpirun
// (mpi.InMPIJob: the runtime initializes MPI and uses its world, package
// collective/mpi); FERRY_COORDINATOR_ADDRESS, FERRY_NUM_PROCESSES and
// FERRY_PROCESS_ID (all three, or none); else the process is a job of one
// and InitDistributed changes nothing.
//
// Afterwards, with P processes of k devices each, device d of process p is
// the global device p·k+d: Devices lists all P·k devices (Device.Process
// says whose), LocalDevices this process's, and meshes name global devices.
// A sharded array holds only the blocks of this process's devices (JAX's
// addressable shards; Shards lists them); DevicePut(x, s) with the same
// host array x in every process puts this process's blocks. A jitted
// function on sharded arrays runs its per-device program on this process's
// devices of the mesh, whose collectives reach the other processes'
// devices: every process calls the same jitted functions on the same
// shapes and shardings in the same order (single program, multiple data).
// Reading a sharded array whole (Literal, Float32s, ToDevice) gathers the
// other processes' blocks: it is a collective, which every process calls
// (like jax's process_allgather). Unsharded arrays and one-device computations stay
// local to their process.
//
// Without InitDistributed, or with none of the sources above, the process
// is a job of one and nothing changes. ShutdownDistributed ends the job.
func InitDistributed(cfg DistributedConfig) error {
	dist.mu.Lock()
	defer dist.mu.Unlock()
	if dist.job != nil {
		return errors.New("rt.InitDistributed: already initialized")
	}
	job, err := distributed.Join(cfg, func() (int, error) {
		be := DefaultBackend()
		k := len(be.Devices())
		if _, ok := be.(backend.Placer); !ok && k > 1 {
			return 0, fmt.Errorf("the %s backend cannot place arrays on several devices", be.Name())
		}
		return k, nil
	})
	if err != nil {
		return fmt.Errorf("rt.InitDistributed: %w", err)
	}
	dist.job = job
	return nil
}

// ShutdownDistributed ends the job InitDistributed joined: it closes the
// communicators and finalizes MPI if InitDistributed initialized it. Every
// process calls it after its last computation on sharded arrays over the
// job's devices (such arrays and the jitted functions run on them must not
// be used afterwards); the process is then a job of one again (MPI cannot
// be initialized twice, though).
func ShutdownDistributed() error {
	dist.mu.Lock()
	defer dist.mu.Unlock()
	job := dist.job
	dist.job = nil
	return job.Close()
}

// ProcessIndex returns this process's index in the job (0 in a job of one),
// like jax.process_index.
func ProcessIndex() int { return currentJob().Process() }

// ProcessCount returns the number of processes of the job (1 without
// InitDistributed), like jax.process_count.
func ProcessCount() int { return currentJob().Processes() }

// LocalDevices returns this process's devices (jax.local_devices): all of
// Devices() in a job of one.
func LocalDevices() []Device {
	p, _, k, on := distInfo()
	all := Devices()
	if !on {
		return all
	}
	return all[p*k : (p+1)*k]
}

// ProcessBarrier returns when every process of the job has called it, and
// tells each of them which processes passed ok = false (ascending; none
// when all succeeded), so that the processes of a collective step such as
// writing a checkpoint (checkpoint.SaveSharded) agree on its outcome. In a
// job of one it returns at once. The error is the processes
// communicator's.
func ProcessBarrier(ok bool) (failed []int, err error) {
	failed, err = currentJob().Barrier(ok)
	if err != nil {
		return nil, fmt.Errorf("rt.ProcessBarrier: %w", err)
	}
	return failed, nil
}

// distInfo returns this process's index, the process count, the devices per
// process and whether the process is part of a job of several.
func distInfo() (p, np, k int, on bool) {
	j := currentJob()
	return j.Process(), j.Processes(), j.DevicesPerProcess(), j != nil
}

// globalDevices returns every device of the job, indexed by global device
// ID: be's own devices in a job of one.
func globalDevices(be Backend) []Device { return currentJob().Devices(be.Devices()) }

// localID returns the backend's ID of global device g and whether g is a
// device of this process.
func localID(g int) (int, bool) { return currentJob().LocalID(g) }

// globalID returns the global ID of the backend's device d of this process.
func globalID(d int) int { return currentJob().GlobalID(d) }

// localPositions returns the positions in mesh order of m's devices that
// belong to this process: all of them in a job of one.
func localPositions(m *ir.Mesh) []int { return currentJob().LocalPositions(m) }

// readsFromProcesses reports whether reading an array over mesh m whole
// gathers blocks from the job's processes (processAllGather; see
// distributed.Job.ReadsFromProcesses).
func readsFromProcesses(m *ir.Mesh) (bool, error) { return currentJob().ReadsFromProcesses(m) }

// processAllGather returns the whole host value of a sharded array of a job
// of several processes, gathering the blocks held by other processes through
// the processes communicator, like
// jax.experimental.multihost_utils.process_allgather. It is a collective:
// every process calls it for the same array. Literal (so Float32s, ToDevice
// and the other readers) of an array over several processes calls it.
func processAllGather(b *shardedBuffer) (*ir.Literal, error) {
	typ := b.typ
	m := typ.Sharding.Mesh
	devs := m.Devices()
	job := currentJob()
	p, np, k := job.Process(), job.Processes(), job.DevicesPerProcess()
	es := typ.DType.Size()
	size := es
	for _, d := range typ.Shape {
		size *= d
	}
	// The owner of each block: the process of its first replica in mesh order.
	owner := map[string]int{}
	for _, g := range devs {
		start, _, err := typ.Sharding.ShardBounds(typ.Shape, g)
		if err != nil {
			return nil, err
		}
		if _, ok := owner[fmt.Sprint(start)]; !ok {
			owner[fmt.Sprint(start)] = g / k
		}
	}
	stride := (size + 7) &^ 7
	mine := make([]byte, stride)
	for _, s := range b.shards {
		if owner[fmt.Sprint(s.Start)] != p {
			continue
		}
		l, err := s.Array.Buffer().Literal()
		if err != nil {
			return nil, fmt.Errorf("shard on %s: %w", backend.DeviceName(s.Device.Platform, s.Device.ID), err)
		}
		copyBlock(mine, typ.Shape, l.Data, s.Start, s.Limit, es, false)
	}
	all, err := job.Exchange(context.Background(), mine)
	switch {
	case errors.Is(err, distributed.ErrEnded):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("gathering %v from the processes: %w", typ, err)
	case len(all) != stride*np:
		return nil, fmt.Errorf("gathering %v from the processes: %d bytes, want %d", typ, len(all), stride*np)
	}
	out := ir.NewLiteral(typ)
	done := map[string]bool{}
	for _, g := range devs {
		start, limit, err := typ.Sharding.ShardBounds(typ.Shape, g)
		if err != nil {
			return nil, err
		}
		key := fmt.Sprint(start)
		if done[key] {
			continue
		}
		done[key] = true
		q := owner[key]
		src := all[q*stride : q*stride+size]
		// Cut the block out of q's buffer, then put it in place.
		local, err := typ.Sharding.ShardShape(typ.Shape)
		if err != nil {
			return nil, err
		}
		n := es
		for _, d := range local {
			n *= d
		}
		blk := make([]byte, n)
		copyBlock(src, typ.Shape, blk, start, limit, es, true)
		copyBlock(out.Data, typ.Shape, blk, start, limit, es, false)
	}
	return out, nil
}
