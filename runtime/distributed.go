package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/mpi"
	"github.com/ferryml/ferry/collective/rendezvous"
	"github.com/ferryml/ferry/ir"
)

// DistributedConfig configures InitDistributed. The zero value takes the
// job from mpirun, else from the environment (see InitDistributed).
type DistributedConfig struct {
	// Processes is a communicator among the job's processes (Rank = this
	// process's index, Size = the process count), owned by the runtime from
	// then on.
	Processes collective.Communicator

	// CoordinatorAddress, NumProcesses and ProcessID join a job without
	// MPI through a TCP rendezvous (package collective/rendezvous), like
	// jax.distributed.initialize's coordinator_address, num_processes and
	// process_id: the coordinator's host:port (process 0 runs it), the
	// number of processes (at least 1) and this process's id, in
	// [0, NumProcesses).
	CoordinatorAddress string
	NumProcesses       int
	ProcessID          int
	// InitializationTimeout bounds the TCP rendezvous's join: how long the
	// processes wait for each other (jax's initialization_timeout).
	// 0: 5 minutes.
	InitializationTimeout time.Duration
}

// dist is the state of a job of several processes (InitDistributed).
var dist struct {
	mu       sync.Mutex // guards the fields
	splitMu  sync.Mutex // serializes the Splits of world (one goroutine per rank at a time)
	gatherMu sync.Mutex // serializes the gathers on gather
	on       bool
	mpi      bool // MPI was initialized by InitDistributed: Finalize it
	idsOnly  bool // procs is a TCP rendezvous, which carries no array data
	p, np    int  // this process, the process count
	k        int  // devices per process
	procs    collective.Communicator
	gather   collective.Communicator // the processes, for ProcessAllGather and Literal
	world    []*collective.Hybrid    // this process's k ranks of the world of np·k devices
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
func InitDistributed(cfg DistributedConfig) (err error) {
	dist.mu.Lock()
	defer dist.mu.Unlock()
	if dist.on {
		return errors.New("rt.InitDistributed: already initialized")
	}
	procs, useMPI, err := jobProcesses(cfg)
	if err != nil || procs == nil {
		return err // an error, or a job of one
	}
	defer func() {
		if err != nil {
			_ = procs.Close()
			if useMPI {
				_ = mpi.Finalize() // the process may exit cleanly
			}
		}
	}()
	ctx := context.Background()
	be := DefaultBackend()
	k := len(be.Devices())
	if _, ok := be.(backend.Placer); !ok && k > 1 {
		return fmt.Errorf("rt.InitDistributed: the %s backend cannot place arrays on several devices", be.Name())
	}
	// A duplicate for the gathers of arrays: NewHybrid owns procs.
	gather, err := procs.Split(ctx, 0, procs.Rank())
	if err != nil {
		return fmt.Errorf("rt.InitDistributed: duplicating the processes communicator: %w", err)
	}
	world, err := collective.NewHybrid(ctx, procs, k)
	if err != nil {
		_ = gather.Close()
		return fmt.Errorf("rt.InitDistributed: %w (set %s the same in every process)", err, EnvCPUDevices)
	}
	_, idsOnly := procs.(*rendezvous.Comm)
	dist.on, dist.mpi, dist.idsOnly = true, useMPI, idsOnly
	dist.p, dist.np, dist.k = procs.Rank(), procs.Size(), k
	dist.procs, dist.gather, dist.world = procs, gather, world
	return nil
}

// jobProcesses returns the communicator among the job's processes that cfg,
// mpirun or the environment give (see InitDistributed), nil for a job of
// one, and whether it initialized MPI.
func jobProcesses(cfg DistributedConfig) (procs collective.Communicator, useMPI bool, err error) {
	tcp := cfg.CoordinatorAddress != "" || cfg.NumProcesses != 0 || cfg.ProcessID != 0
	join := func(rc rendezvous.Config) (collective.Communicator, bool, error) {
		rc.ConnectTimeout = cfg.InitializationTimeout
		c, err := rendezvous.Join(context.Background(), rc)
		if err != nil {
			return nil, false, fmt.Errorf("rt.InitDistributed: %w", err)
		}
		return c, false, nil
	}
	switch {
	case cfg.InitializationTimeout < 0:
		return nil, false, fmt.Errorf("rt.InitDistributed: negative InitializationTimeout %v", cfg.InitializationTimeout)
	case cfg.Processes != nil && tcp:
		return nil, false, errors.New("rt.InitDistributed: give either Processes or CoordinatorAddress, NumProcesses and ProcessID, not both")
	case cfg.Processes != nil:
		return cfg.Processes, false, nil
	case tcp:
		return join(rendezvous.Config{CoordinatorAddress: cfg.CoordinatorAddress, NumProcesses: cfg.NumProcesses, ProcessID: cfg.ProcessID})
	case mpi.InMPIJob():
		if err := mpi.Init(); err != nil {
			return nil, false, fmt.Errorf("rt.InitDistributed: %w", err)
		}
		if procs, err = mpi.World(); err != nil {
			_ = mpi.Finalize()
			return nil, false, fmt.Errorf("rt.InitDistributed: %w", err)
		}
		return procs, true, nil
	}
	rc, ok, err := rendezvous.ConfigFromEnv()
	switch {
	case err != nil:
		return nil, false, fmt.Errorf("rt.InitDistributed: %w", err)
	case !ok:
		return nil, false, nil // a job of one
	}
	return join(rc)
}

// idsOnlyJob reports whether the job's processes meet through a TCP
// rendezvous, which carries no array data.
func idsOnlyJob() bool {
	dist.mu.Lock()
	defer dist.mu.Unlock()
	return dist.on && dist.idsOnly
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
	if !dist.on {
		return nil
	}
	var errs []error
	for _, c := range dist.world {
		errs = append(errs, c.Close())
	}
	errs = append(errs, dist.gather.Close(), dist.procs.Close())
	if dist.mpi {
		errs = append(errs, mpi.Finalize())
	}
	dist.on, dist.mpi, dist.idsOnly = false, false, false
	dist.procs, dist.gather, dist.world = nil, nil, nil
	return errors.Join(errs...)
}

// ProcessIndex returns this process's index in the job (0 in a job of one),
// like jax.process_index.
func ProcessIndex() int {
	p, _, _, _ := distInfo()
	return p
}

// ProcessCount returns the number of processes of the job (1 without
// InitDistributed), like jax.process_count.
func ProcessCount() int {
	_, np, _, _ := distInfo()
	return np
}

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

// distInfo returns this process's index, the process count, the devices per
// process and whether the process is part of a job of several.
func distInfo() (p, np, k int, on bool) {
	dist.mu.Lock()
	defer dist.mu.Unlock()
	if !dist.on {
		return 0, 1, 0, false
	}
	return dist.p, dist.np, dist.k, true
}

// globalDevices returns every device of the job, indexed by global device
// ID: be's own devices in a job of one.
func globalDevices(be Backend) []Device {
	devs := be.Devices()
	_, np, k, on := distInfo()
	if !on {
		return devs
	}
	out := make([]Device, 0, np*k)
	for q := range np {
		for d := range k {
			dev := devs[d]
			dev.ID, dev.Process = q*k+d, q
			out = append(out, dev)
		}
	}
	return out
}

// localID returns the backend's ID of global device g and whether g is a
// device of this process.
func localID(g int) (int, bool) {
	p, _, k, on := distInfo()
	if !on {
		return g, true
	}
	if g/k != p {
		return -1, false
	}
	return g - p*k, true
}

// globalID returns the global ID of the backend's device d of this process.
func globalID(d int) int {
	p, _, k, on := distInfo()
	if !on {
		return d
	}
	return p*k + d
}

// localPositions returns the positions in mesh order of m's devices that
// belong to this process: all of them in a job of one.
func localPositions(m *ir.Mesh) []int {
	var out []int
	for r, g := range m.Devices() {
		if _, ok := localID(g); ok {
			out = append(out, r)
		}
	}
	return out
}

// meshProcesses returns the processes holding devices of m, ascending
// without repeats ({0} in a job of one).
func meshProcesses(m *ir.Mesh) []int {
	_, _, k, on := distInfo()
	if !on {
		return []int{0}
	}
	seen := map[int]bool{}
	var out []int
	for _, g := range m.Devices() {
		if q := g / k; !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	return out
}

// spansProcesses reports whether m has devices of several processes.
func spansProcesses(m *ir.Mesh) bool { return len(meshProcesses(m)) > 1 }

// worldComms returns the communicators of this process's devices of mesh m,
// in the order of localPositions, made from the job's world of devices: each
// of this process's devices splits the world (devices outside m join no
// group), ranked by mesh position, then takes MeshAxes of each axis string.
// Every process calls it for the same mesh and axes at the same point (it is
// collective over the world).
func worldComms(ctx context.Context, m *ir.Mesh, axes []string, parseAxes func(string) []int) ([]map[string]collective.Communicator, error) {
	if idsOnlyJob() { // every process fails here alike: none waits for another
		return nil, fmt.Errorf("the program over %v has collectives between processes: %w", m, rendezvous.ErrDataCollective)
	}
	dist.splitMu.Lock()
	defer dist.splitMu.Unlock()
	dist.mu.Lock()
	on, p, k, world := dist.on, dist.p, dist.k, dist.world
	dist.mu.Unlock()
	if !on {
		return nil, errors.New("the job of several processes has ended (rt.ShutdownDistributed)")
	}
	pos := map[int]int{} // global device -> mesh position
	for r, g := range m.Devices() {
		pos[g] = r
	}
	sets := make([]map[string]collective.Communicator, k) // by local device
	errs := onEachDevice(k, func(d int) error {
		g := p*k + d
		color, key := collective.Undefined, 0
		if r, ok := pos[g]; ok {
			color, key = 0, r
		}
		c, err := world[d].Split(ctx, color, key)
		if err != nil {
			err = fmt.Errorf("communicator over %v: %w", m, err)
			world[d].Abort(err)
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

// readsFromProcesses reports whether reading an array over mesh m whole
// gathers blocks from the job's processes (processAllGather): always in a
// job of several processes, except when they meet through a TCP
// rendezvous, which carries no array data: then an array over this
// process's devices only is read locally, and one over other processes'
// devices is an error.
func readsFromProcesses(m *ir.Mesh) (bool, error) {
	p, _, _, on := distInfo()
	switch {
	case !on:
		return false, nil
	case !idsOnlyJob():
		return true, nil
	}
	if ps := meshProcesses(m); len(ps) == 1 && ps[0] == p {
		return false, nil
	}
	return false, fmt.Errorf("reading whole an array over %v, whose devices are other processes': %w", m, rendezvous.ErrDataCollective)
}

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
	p, np, k, _ := distInfo()
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
	all := make([]byte, stride*np)
	dist.gatherMu.Lock()
	defer dist.gatherMu.Unlock()
	dist.mu.Lock()
	c := dist.gather
	dist.mu.Unlock()
	if c == nil {
		return nil, errors.New("the job of several processes has ended (rt.ShutdownDistributed)")
	}
	if err := c.AllGather(context.Background(), ir.Uint8, nil, 0, mine, all); err != nil {
		return nil, fmt.Errorf("gathering %v from the processes: %w", typ, err)
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

// exchangeProcesses gathers every process's mine (all the same length), in
// process order, over the processes communicator: a collective every
// process of the job calls (ProcessBarrier, the NCCL ids).
func exchangeProcesses(ctx context.Context, mine []byte) ([]byte, error) {
	dist.gatherMu.Lock()
	defer dist.gatherMu.Unlock()
	dist.mu.Lock()
	c, np := dist.gather, dist.np
	dist.mu.Unlock()
	if c == nil {
		return nil, errors.New("the job of several processes has ended (rt.ShutdownDistributed)")
	}
	all := make([]byte, len(mine)*np)
	if err := c.AllGather(ctx, ir.Uint8, nil, 0, mine, all); err != nil {
		return nil, err
	}
	return all, nil
}

// ProcessBarrier returns when every process of the job has called it, and
// tells each of them which processes passed ok = false (ascending; none
// when all succeeded), so that the processes of a collective step such as
// writing a checkpoint (checkpoint.SaveSharded) agree on its outcome. In a
// job of one it returns at once. The error is the processes
// communicator's.
func ProcessBarrier(ok bool) (failed []int, err error) {
	mine := []byte{1}
	if ok {
		mine[0] = 0
	}
	if _, _, _, on := distInfo(); !on {
		if !ok {
			return []int{0}, nil
		}
		return nil, nil
	}
	all, err := exchangeProcesses(context.Background(), mine)
	if err != nil {
		return nil, fmt.Errorf("rt.ProcessBarrier: %w", err)
	}
	for q, b := range all {
		if b != 0 {
			failed = append(failed, q)
		}
	}
	return failed, nil
}
