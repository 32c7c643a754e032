package mpi

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ferryml/ferry/internal/dynlib"
	table "github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// LibEnv names the environment variable holding the path of libmpi, tried
// before the system loader.
const LibEnv = "FERRY_MPI_LIB"

// Constants of Open MPI's mpi.h (4.x; the ABI of libmpi.so.40).
const (
	mpiSuccess        = 0
	mpiUndefined      = -32766
	mpiThreadMultiple = 3
	mpiAnySource      = -1
	mpiInPlace        = 1 // MPI_IN_PLACE is (void *) 1
	mpiMaxErrorString = 256
)

// Attempt is one place libmpi was looked for, and why it did not load.
type Attempt = dynlib.Attempt

// LoadError reports that libmpi could not be loaded, with every attempt, or
// that it loaded but was unusable (Detail).
type LoadError = dynlib.LoadError

// candidates are the paths tried, in order: $FERRY_MPI_LIB, then the system
// loader's libmpi.so.40 and libmpi.so.
func candidates() []string {
	var c []string
	if p := table.MPILib.Get(); p != "" {
		c = append(c, p)
	}
	return append(c, "libmpi.so.40", "libmpi.so")
}

// lib is the loaded libmpi: its entry points and predefined handles (in Open
// MPI a predefined handle is the address of a global object).
type lib struct {
	path string

	initThread, initialized, finalized, finalize, queryThread uintptr
	commRank, commSize, commIdup, commSplit, commFree         uintptr
	commSetErrhandler, errorString                            uintptr
	iallreduce, iallgather, ireduceScatterBlock, ialltoall    uintptr
	iallgatherv, ialltoallv                                   uintptr
	ibcast, isend, irecv, test, testall, cancel, wait         uintptr
	requestFree                                               uintptr

	commWorld, errorsReturn uintptr
	byteType                uintptr
	moveTypes               [9]uintptr  // by element size: uint8, uint16, uint32, uint64
	types                   [16]uintptr // by ir.DType, 0 where MPI lacks it
	ops                     [5]uintptr  // by collective.Op
}

// open dlopens the first of paths that loads and resolves every symbol.
func open(paths []string) (*lib, error) {
	dl, err := dynlib.Open(dynlib.Spec{Prefix: "mpi", Name: "Open MPI's libmpi", Paths: paths,
		Hint: " (install openmpi-bin and libopenmpi-dev, or set " + LibEnv + ")"})
	if err != nil {
		return nil, err
	}
	l := &lib{path: dl.Path}
	syms := []struct {
		p    *uintptr
		name string
	}{
		{&l.initThread, "MPI_Init_thread"}, {&l.initialized, "MPI_Initialized"},
		{&l.finalized, "MPI_Finalized"}, {&l.finalize, "MPI_Finalize"},
		{&l.queryThread, "MPI_Query_thread"},
		{&l.commRank, "MPI_Comm_rank"}, {&l.commSize, "MPI_Comm_size"},
		{&l.commIdup, "MPI_Comm_idup"}, {&l.commSplit, "MPI_Comm_split"},
		{&l.commFree, "MPI_Comm_free"}, {&l.commSetErrhandler, "MPI_Comm_set_errhandler"},
		{&l.errorString, "MPI_Error_string"},
		{&l.iallreduce, "MPI_Iallreduce"}, {&l.iallgather, "MPI_Iallgather"},
		{&l.ireduceScatterBlock, "MPI_Ireduce_scatter_block"}, {&l.ialltoall, "MPI_Ialltoall"},
		{&l.iallgatherv, "MPI_Iallgatherv"}, {&l.ialltoallv, "MPI_Ialltoallv"},
		{&l.ibcast, "MPI_Ibcast"}, {&l.isend, "MPI_Isend"}, {&l.irecv, "MPI_Irecv"},
		{&l.test, "MPI_Test"}, {&l.testall, "MPI_Testall"}, {&l.cancel, "MPI_Cancel"},
		{&l.wait, "MPI_Wait"}, {&l.requestFree, "MPI_Request_free"},
		{&l.commWorld, "ompi_mpi_comm_world"}, {&l.errorsReturn, "ompi_mpi_errors_return"},
		{&l.byteType, "ompi_mpi_byte"},
		{&l.moveTypes[1], "ompi_mpi_uint8_t"}, {&l.moveTypes[2], "ompi_mpi_uint16_t"},
		{&l.moveTypes[4], "ompi_mpi_uint32_t"}, {&l.moveTypes[8], "ompi_mpi_uint64_t"},
		{&l.types[ir.Int32], "ompi_mpi_int32_t"}, {&l.types[ir.Int64], "ompi_mpi_int64_t"},
		{&l.types[ir.Float32], "ompi_mpi_float"}, {&l.types[ir.Float64], "ompi_mpi_double"},
		{&l.ops[1], "ompi_mpi_op_sum"}, // collective.Sum
		{&l.ops[2], "ompi_mpi_op_prod"}, {&l.ops[3], "ompi_mpi_op_max"}, {&l.ops[4], "ompi_mpi_op_min"},
	}
	names := make([]string, len(syms))
	for i, s := range syms {
		names[i] = s.name
	}
	tab, err := dl.Resolve(dynlib.Names(names...))
	if le, ok := err.(*LoadError); ok {
		le.Detail += " (is it Open MPI 4 or later?)"
	}
	if err != nil {
		return nil, err
	}
	for _, s := range syms {
		*s.p = tab.Proc(s.name)
	}
	l.types[ir.Uint8] = l.moveTypes[1]
	l.types[ir.Uint32] = l.moveTypes[4]
	return l, nil
}

// call calls an MPI function and returns its int result. As for
// purego.SyscallN, pointers converted to uintptr in the argument list of a
// call escape to the heap, so that a stack move during the call cannot leave
// MPI writing to a stale address; pointers handed over otherwise must point
// into the heap already.
//
//go:uintptrescapes
func (l *lib) call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// errorText is MPI_Error_string of code.
func (l *lib) errorText(code int32) string {
	var buf [mpiMaxErrorString + 1]byte
	var n int32
	if l.call(l.errorString, uintptr(code), uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n))) != mpiSuccess || n <= 0 || int(n) > len(buf) {
		return fmt.Sprintf("MPI error %d", code)
	}
	return string(buf[:n])
}

// check turns an MPI return code into an error naming the function.
func (l *lib) check(name string, code int32) error {
	if code == mpiSuccess {
		return nil
	}
	return fmt.Errorf("mpi: %s failed: %s (error %d)", name, l.errorText(code), code)
}

var (
	loadOnce sync.Once
	loaded   *lib
	loadErr  error

	initMu   sync.Mutex
	initDone bool
	initErr  error
	mainReq  chan func() // runs functions on the thread that initialized MPI
)

// Load loads libmpi with purego: the path in $FERRY_MPI_LIB, then the system
// loader's libmpi.so.40 and libmpi.so. The error is a *LoadError listing every
// attempt. Loading does not initialize MPI (see Init).
func Load() error {
	loadOnce.Do(func() { loaded, loadErr = open(candidates()) })
	return loadErr
}

// LibraryPath is the path (or soname) libmpi was loaded from, or "" before a
// successful Load.
func LibraryPath() string {
	if Load() != nil {
		return ""
	}
	return loaded.path
}

// InMPIJob reports whether the process was started by mpirun (or another
// launcher that sets Open MPI's or PMIx's rank variables), the condition for
// Init to join a job of several processes rather than start a singleton.
func InMPIJob() bool {
	for _, v := range []string{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"} {
		if os.Getenv(v) != "" {
			return true
		}
	}
	return false
}

// ErrThreadLevel is wrapped by Init's error when the MPI library cannot give
// MPI_THREAD_MULTIPLE.
var ErrThreadLevel = errors.New("mpi: MPI_THREAD_MULTIPLE is not supported")

// Init loads libmpi (see Load) and initializes MPI with MPI_Init_thread,
// requesting MPI_THREAD_MULTIPLE: the goroutines of a process (one per local
// device) call MPI concurrently, each on its own communicator. Init fails with
// an error wrapping ErrThreadLevel when the library provides less. MPI is
// initialized once per process, on an OS thread kept for it that later runs
// Finalize; Init after a successful Init does nothing. If MPI was already
// initialized by other code in the process, Init only checks the thread
// level.
func Init() error {
	initMu.Lock()
	defer initMu.Unlock()
	if initDone {
		return initErr
	}
	if err := Load(); err != nil {
		return err
	}
	l := loaded
	var finalized int32
	if err := l.check("MPI_Finalized", l.call(l.finalized, uintptr(unsafe.Pointer(&finalized)))); err != nil {
		return err
	}
	if finalized != 0 {
		return errors.New("mpi: Init after Finalize: MPI cannot be initialized twice in one process")
	}
	initDone = true
	var already int32
	if initErr = l.check("MPI_Initialized", l.call(l.initialized, uintptr(unsafe.Pointer(&already)))); initErr != nil {
		return initErr
	}
	var provided int32
	if already != 0 {
		initErr = l.check("MPI_Query_thread", l.call(l.queryThread, uintptr(unsafe.Pointer(&provided))))
	} else {
		mainReq = make(chan func())
		done := make(chan error)
		go func() {
			// MPI's "main thread" initializes and finalizes MPI: keep one OS
			// thread for both.
			runtime.LockOSThread()
			done <- l.check("MPI_Init_thread", l.call(l.initThread, 0, 0, mpiThreadMultiple, uintptr(unsafe.Pointer(&provided))))
			for f := range mainReq {
				f()
			}
		}()
		initErr = <-done
	}
	if initErr == nil {
		// MPI calls not tied to one of this package's communicators (on
		// requests, say) report errors through MPI_COMM_WORLD's handler:
		// return them as errors rather than end the job.
		initErr = l.check("MPI_Comm_set_errhandler", l.call(l.commSetErrhandler, l.commWorld, l.errorsReturn))
	}
	if initErr == nil && provided < mpiThreadMultiple {
		initErr = fmt.Errorf("%w: %s provides thread level %d (MPI_THREAD_MULTIPLE is %d); build Open MPI with thread support", ErrThreadLevel, l.path, provided, mpiThreadMultiple)
	}
	return initErr
}

// Finalize ends MPI (MPI_Finalize) after saying goodbye on the liveness
// connections (see LivenessEnv) and cancelling the receives this package
// keeps posted for abort messages. Call it once, after the last collective,
// before the process exits; communicators must not be used afterwards. MPI
// cannot be initialized again in the same process.
func Finalize() error {
	initMu.Lock()
	defer initMu.Unlock()
	if !initDone || initErr != nil {
		return errors.New("mpi: Finalize without a successful Init")
	}
	closeLiveness()
	closeWorlds()
	l := loaded
	var err error
	run := func() { err = l.check("MPI_Finalize", l.call(l.finalize)) }
	if mainReq != nil {
		done := make(chan struct{})
		mainReq <- func() { run(); close(done) }
		<-done
		close(mainReq)
		mainReq = nil
	} else {
		run()
	}
	initErr = errors.New("mpi: MPI was finalized")
	return err
}

// initialized returns the library once Init succeeded.
func initialized() (*lib, error) {
	initMu.Lock()
	defer initMu.Unlock()
	if !initDone {
		return nil, errors.New("mpi: call mpi.Init before using MPI")
	}
	if initErr != nil {
		return nil, initErr
	}
	return loaded, nil
}
