package mpi

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/ferryml/ferry/collective"
	table "github.com/ferryml/ferry/internal/settings"
)

// TimeoutEnv names the environment variable bounding every collective's wait
// for the other ranks, shared with the other engines: see
// [collective.TimeoutEnv]. It is read by World.
const TimeoutEnv = collective.TimeoutEnv

// DefaultTimeout is the collective timeout when $FERRY_COLLECTIVE_TIMEOUT is
// unset: 5 minutes. A dead process is named long before it by the liveness
// connections (see LivenessEnv).
const DefaultTimeout = collective.DefaultTimeout

// ReduceEnv names the environment variable choosing how AllReduce and
// ReduceScatter reduce the dtypes MPI has: "native" (the default) uses
// MPI's reduction; "ordered" gathers the ranks' buffers and reduces them in
// rank order like collective.Local, for Local's bits on every dtype. It is
// read by World.
const ReduceEnv = "FERRY_MPI_REDUCE"

// ErrTimeout is wrapped by the error of a collective that did not complete
// within the timeout (see TimeoutEnv).
var ErrTimeout = errors.New("mpi: collective timed out")

// ctrlBytes is the length of an abort message.
const ctrlBytes = 512

// ctrlTag tags abort messages on a world's control communicator.
const ctrlTag = 7

// world is the abort state shared by a communicator from World and every
// communicator split from it. A receive is kept posted on a private duplicate
// of MPI_COMM_WORLD (ctrl): Abort sends its reason to every other process,
// and the ranks waiting in collectives poll the receive, so that an abort
// anywhere fails every rank's pending and later calls.
type world struct {
	l          *lib
	rank, size int // in MPI_COMM_WORLD

	once  sync.Once
	done  chan struct{}
	cause error

	mu      sync.Mutex // guards the control receive
	ctrl    uintptr    // the control communicator
	ctrlReq uintptr    // the posted receive; 0 when none
	ctrlBuf []byte
	sent    [][]byte // abort messages, alive until sent
	pins    runtime.Pinner
}

var (
	worldsMu sync.Mutex
	worlds   []*world
	stuckMu  sync.Mutex
	stuck    []*runtime.Pinner // buffers of abandoned collectives, kept alive
)

func (w *world) failed() error {
	select {
	case <-w.done:
		return fmt.Errorf("%w: %w", collective.ErrAborted, w.cause)
	default:
		return nil
	}
}

// abort marks the world failed; with tell, the reason is sent to every other
// process of the world.
func (w *world) abort(err error, tell bool) {
	w.once.Do(func() {
		if err == nil {
			err = errors.New("Abort called")
		}
		w.cause = err
		close(w.done)
		if !tell {
			return
		}
		msg := []byte(fmt.Sprintf("mpi: process %d of %d aborted: %v", w.rank, w.size, err))
		if errors.Is(err, ErrProcessLost) {
			msg = []byte(string(lostMark) + err.Error()) // the loss, as found here
		}
		if len(msg) > ctrlBytes {
			msg = msg[:ctrlBytes]
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.ctrl == 0 {
			return
		}
		buf := alloc(ctrlBytes)
		copy(buf, msg)
		w.pins.Pin(&buf[0])
		w.sent = append(w.sent, buf)
		for r := range w.size {
			if r == w.rank {
				continue
			}
			var req uintptr
			if w.l.call(w.l.isend, addr(buf), uintptr(len(msg)), w.l.byteType, uintptr(r), ctrlTag, w.ctrl, uintptr(unsafe.Pointer(&req))) == mpiSuccess {
				w.l.call(w.l.requestFree, uintptr(unsafe.Pointer(&req)))
			}
		}
	})
}

// poll checks the control receive for an abort message from another process
// (skipped while another goroutine checks it).
func (w *world) poll() {
	if !w.mu.TryLock() {
		return
	}
	if w.ctrlReq == 0 {
		w.mu.Unlock()
		return
	}
	var flag int32
	code := w.l.call(w.l.test, uintptr(unsafe.Pointer(&w.ctrlReq)), uintptr(unsafe.Pointer(&flag)), 0)
	var msg string
	if code == mpiSuccess && flag != 0 {
		w.ctrlReq = 0
		n := 0
		for n < len(w.ctrlBuf) && w.ctrlBuf[n] != 0 {
			n++
		}
		msg = string(w.ctrlBuf[:n])
	}
	w.mu.Unlock()
	if msg != "" {
		e := &remoteAbort{msg: msg}
		if msg[0] == lostMark {
			e.msg, e.lost = msg[1:], true
		}
		w.abort(e, false)
	}
}

// close cancels the control receive and frees the control communicator.
func (w *world) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctrlReq != 0 {
		w.l.call(w.l.cancel, uintptr(unsafe.Pointer(&w.ctrlReq)))
		w.l.call(w.l.wait, uintptr(unsafe.Pointer(&w.ctrlReq)), 0)
		w.ctrlReq = 0
	}
	if w.ctrl != 0 {
		w.l.call(w.l.commFree, uintptr(unsafe.Pointer(&w.ctrl)))
		w.ctrl = 0
	}
	w.pins.Unpin()
}

func closeWorlds() {
	worldsMu.Lock()
	defer worldsMu.Unlock()
	for _, w := range worlds {
		w.close()
	}
	worlds = nil
}

// settings reads TimeoutEnv and ReduceEnv.
func settings() (timeout time.Duration, ordered bool, err error) {
	if timeout, err = collective.TimeoutFromEnv(); err != nil {
		return 0, false, fmt.Errorf("mpi: %w", err)
	}
	reduce, _, err := table.MPIReduce.Lookup()
	if err != nil {
		return 0, false, fmt.Errorf("mpi: %w", err)
	}
	return timeout, reduce == "ordered", nil
}

// World returns a communicator over every process of the MPI job (a
// duplicate of MPI_COMM_WORLD, ranked like it), after Init. Every process
// calls it, the same number of times. Each call makes a new abort domain: the
// communicator and those split from it fail together. It reads TimeoutEnv
// and ReduceEnv; the duplication itself is bounded by the timeout. The
// first World of a process also opens its liveness connection (see
// LivenessEnv), and fails when a process cannot open one.
func World() (collective.Communicator, error) {
	c, err := newWorld()
	if err != nil {
		return nil, err
	}
	return c, nil
}

func newWorld() (*Comm, error) {
	l, err := initialized()
	if err != nil {
		return nil, err
	}
	timeout, ordered, err := settings()
	if err != nil {
		return nil, err
	}
	w := &world{l: l, done: make(chan struct{}), ctrlBuf: alloc(ctrlBytes)}
	var rank, size int32
	if err := l.check("MPI_Comm_rank", l.call(l.commRank, l.commWorld, uintptr(unsafe.Pointer(&rank)))); err != nil {
		return nil, err
	}
	if err := l.check("MPI_Comm_size", l.call(l.commSize, l.commWorld, uintptr(unsafe.Pointer(&size)))); err != nil {
		return nil, err
	}
	w.rank, w.size = int(rank), int(size)
	// Two duplicates: the communicator's and the control one.
	dup := func() (uintptr, error) {
		h := new(uintptr)
		var req uintptr
		var p runtime.Pinner
		p.Pin(h)
		defer p.Unpin()
		if err := l.check("MPI_Comm_idup", l.call(l.commIdup, l.commWorld, uintptr(unsafe.Pointer(h)), uintptr(unsafe.Pointer(&req)))); err != nil {
			return 0, err
		}
		deadline := time.Now().Add(timeout)
		for sleep := time.Microsecond; ; sleep = min(2*sleep, time.Millisecond) {
			var flag int32
			if err := l.check("MPI_Test", l.call(l.test, uintptr(unsafe.Pointer(&req)), uintptr(unsafe.Pointer(&flag)), 0)); err != nil {
				return 0, err
			}
			if flag != 0 {
				break
			}
			if timeout > 0 && time.Now().After(deadline) {
				p2 := new(runtime.Pinner)
				p2.Pin(h)
				keep(p2)
				return 0, fmt.Errorf("%w: World on process %d of %d: the other processes did not join MPI_Comm_idup within %v (%s)", ErrTimeout, rank, size, timeout, TimeoutEnv)
			}
			time.Sleep(sleep)
		}
		if err := l.check("MPI_Comm_set_errhandler", l.call(l.commSetErrhandler, *h, l.errorsReturn)); err != nil {
			return 0, err
		}
		return *h, nil
	}
	comm, err := dup()
	if err != nil {
		return nil, err
	}
	if w.ctrl, err = dup(); err != nil {
		return nil, err
	}
	w.pins.Pin(&w.ctrlBuf[0])
	if err := l.check("MPI_Irecv", l.call(l.irecv, addr(w.ctrlBuf), ctrlBytes, l.byteType, uintptr(mpiAnySourceArg), ctrlTag, w.ctrl, uintptr(unsafe.Pointer(&w.ctrlReq)))); err != nil {
		return nil, err
	}
	worldsMu.Lock()
	worlds = append(worlds, w)
	worldsMu.Unlock()
	c := newComm(l, w, comm, w.rank, w.size, timeout, ordered)
	if err := startLiveness(c); err != nil {
		return nil, err
	}
	if err := liveLoss(); err != nil {
		w.abort(err, false) // a process was lost before this World
	}
	return c, nil
}

// mpiAnySourceArg is MPI_ANY_SOURCE as a register argument (a C int).
var mpiAnySourceArg = int64(mpiAnySource)

// keep keeps a pinner's objects alive and pinned for good: MPI may still
// write them (an abandoned collective).
func keep(p *runtime.Pinner) {
	stuckMu.Lock()
	stuck = append(stuck, p)
	stuckMu.Unlock()
}
