package distributed

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

// Config configures Join (rt.InitDistributed). The zero value takes the
// job from mpirun, else from the environment (see rt.InitDistributed).
type Config struct {
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

// ErrEnded is the error of a collective over a job that has ended
// (rt.ShutdownDistributed).
var ErrEnded = errors.New("the job of several processes has ended (rt.ShutdownDistributed)")

// Job is this process's place in a job of several processes: a nil *Job is
// a job of one. Its methods are safe for concurrent use.
type Job struct {
	mu       sync.Mutex // guards closed
	splitMu  sync.Mutex // serializes the Splits of world (one goroutine per rank at a time)
	gatherMu sync.Mutex // serializes the gathers on gather
	closed   bool
	mpi      bool // MPI was initialized by Join: Finalize it
	idsOnly  bool // procs is a TCP rendezvous, which carries no array data
	p, np    int  // this process, the process count
	k        int  // devices per process
	procs    collective.Communicator
	gather   collective.Communicator // the processes, for Exchange
	world    []*collective.Hybrid    // this process's k ranks of the world of np·k devices
}

// Join joins this process to the job cfg, mpirun or the environment give
// (see rt.InitDistributed for where the job comes from), and returns it;
// nil for a job of one. devices, called once the job is known to have
// several processes, returns this process's device count, or why the
// backend cannot take part.
func Join(cfg Config, devices func() (int, error)) (_ *Job, err error) {
	procs, useMPI, err := jobProcesses(cfg)
	if err != nil || procs == nil {
		return nil, err // an error, or a job of one
	}
	defer func() {
		if err != nil {
			_ = procs.Close()
			if useMPI {
				_ = mpi.Finalize() // the process may exit cleanly
			}
		}
	}()
	k, err := devices()
	if err != nil {
		return nil, err
	}
	j, err := newJob(context.Background(), procs, k)
	if err != nil {
		return nil, err
	}
	j.mpi = useMPI
	return j, nil
}

// New makes the job of the processes procs connects (Rank is this
// process's index, Size the process count), with k devices in each; the
// job owns procs from then on, but does not close it on an error. Every
// process of the job calls it at once: it is collective over procs.
func New(ctx context.Context, procs collective.Communicator, k int) (*Job, error) {
	return newJob(ctx, procs, k)
}

func newJob(ctx context.Context, procs collective.Communicator, k int) (*Job, error) {
	// A duplicate for the gathers of arrays: NewHybrid owns procs.
	gather, err := procs.Split(ctx, 0, procs.Rank())
	if err != nil {
		return nil, fmt.Errorf("duplicating the processes communicator: %w", err)
	}
	world, err := collective.NewHybrid(ctx, procs, k)
	if err != nil {
		_ = gather.Close()
		return nil, fmt.Errorf("%w (set %s the same in every process)", err, backend.EnvCPUDevices)
	}
	_, idsOnly := procs.(*rendezvous.Comm)
	return &Job{idsOnly: idsOnly, p: procs.Rank(), np: procs.Size(), k: k, procs: procs, gather: gather, world: world}, nil
}

// jobProcesses returns the communicator among the job's processes that cfg,
// mpirun or the environment give (see rt.InitDistributed), nil for a job
// of one, and whether it initialized MPI.
func jobProcesses(cfg Config) (procs collective.Communicator, useMPI bool, err error) {
	tcp := cfg.CoordinatorAddress != "" || cfg.NumProcesses != 0 || cfg.ProcessID != 0
	join := func(rc rendezvous.Config) (collective.Communicator, bool, error) {
		rc.ConnectTimeout = cfg.InitializationTimeout
		c, err := rendezvous.Join(context.Background(), rc)
		if err != nil {
			return nil, false, err
		}
		return c, false, nil
	}
	switch {
	case cfg.InitializationTimeout < 0:
		return nil, false, fmt.Errorf("negative InitializationTimeout %v", cfg.InitializationTimeout)
	case cfg.Processes != nil && tcp:
		return nil, false, errors.New("give either Processes or CoordinatorAddress, NumProcesses and ProcessID, not both")
	case cfg.Processes != nil:
		return cfg.Processes, false, nil
	case tcp:
		return join(rendezvous.Config{CoordinatorAddress: cfg.CoordinatorAddress, NumProcesses: cfg.NumProcesses, ProcessID: cfg.ProcessID})
	case mpi.InMPIJob():
		if err := mpi.Init(); err != nil {
			return nil, false, err
		}
		if procs, err = mpi.World(); err != nil {
			_ = mpi.Finalize()
			return nil, false, err
		}
		return procs, true, nil
	}
	rc, ok, err := rendezvous.ConfigFromEnv()
	switch {
	case err != nil:
		return nil, false, err
	case !ok:
		return nil, false, nil // a job of one
	}
	return join(rc)
}

// Close ends the job: it closes the communicators and finalizes MPI if
// Join initialized it. The job's collectives fail afterwards (ErrEnded).
func (j *Job) Close() error {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	j.closed = true
	var errs []error
	for _, c := range j.world {
		errs = append(errs, c.Close())
	}
	errs = append(errs, j.gather.Close(), j.procs.Close())
	if j.mpi {
		errs = append(errs, mpi.Finalize())
	}
	return errors.Join(errs...)
}

// ended reports whether Close has ended the job (a nil job never began).
func (j *Job) ended() bool {
	if j == nil {
		return true
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.closed
}

// Process returns this process's index in the job (0 in a job of one).
func (j *Job) Process() int {
	if j == nil {
		return 0
	}
	return j.p
}

// Processes returns the number of processes of the job (1 for a job of
// one).
func (j *Job) Processes() int {
	if j == nil {
		return 1
	}
	return j.np
}

// DevicesPerProcess returns the number of devices of each process (0 for a job
// of one, which does not know it).
func (j *Job) DevicesPerProcess() int {
	if j == nil {
		return 0
	}
	return j.k
}

// IDsOnly reports whether the job's processes meet through a TCP
// rendezvous, which carries no array data.
func (j *Job) IDsOnly() bool { return j != nil && j.idsOnly }

// Devices returns every device of the job, indexed by global device ID,
// given this process's devices local (in a job of one, local itself):
// device d of process q has global ID q·k+d and Process q.
func (j *Job) Devices(local []backend.Device) []backend.Device {
	if j == nil {
		return local
	}
	out := make([]backend.Device, 0, j.np*j.k)
	for q := range j.np {
		for d := range j.k {
			dev := local[d]
			dev.ID, dev.Process = q*j.k+d, q
			out = append(out, dev)
		}
	}
	return out
}

// LocalID returns the backend's ID of global device g and whether g is a
// device of this process.
func (j *Job) LocalID(g int) (int, bool) {
	if j == nil {
		return g, true
	}
	if g/j.k != j.p {
		return -1, false
	}
	return g - j.p*j.k, true
}

// GlobalID returns the global ID of the backend's device d of this process.
func (j *Job) GlobalID(d int) int {
	if j == nil {
		return d
	}
	return j.p*j.k + d
}

// LocalPositions returns the positions in mesh order of m's devices that
// belong to this process: all of them in a job of one.
func (j *Job) LocalPositions(m *ir.Mesh) []int {
	var out []int
	for r, g := range m.Devices() {
		if _, ok := j.LocalID(g); ok {
			out = append(out, r)
		}
	}
	return out
}

// MeshProcesses returns the processes holding devices of m, ascending
// without repeats ({0} in a job of one).
func (j *Job) MeshProcesses(m *ir.Mesh) []int {
	if j == nil {
		return []int{0}
	}
	seen := map[int]bool{}
	var out []int
	for _, g := range m.Devices() {
		if q := g / j.k; !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	return out
}

// SpansProcesses reports whether m has devices of several processes.
func (j *Job) SpansProcesses(m *ir.Mesh) bool { return len(j.MeshProcesses(m)) > 1 }
