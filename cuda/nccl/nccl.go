package nccl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/cuda"
	"github.com/ferryml/ferry/internal/dynlib"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// LibEnv names the environment variable holding the path of the NCCL library
// to load. When it is set, Load tries that file only.
const LibEnv = "FERRY_NCCL_LIB"

// Soname is the NCCL library's file name (NCCL 2.x).
const Soname = "libnccl.so.2"

// UniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId (struct { char internal[128]; }): made by one
// rank with GetUniqueID and handed to every rank (over MPI, TCP, ...) before
// CommInitRank.
type UniqueID [UniqueIDBytes]byte

// Result is an ncclResult_t.
type Result int32

// The ncclResult_t values (nccl.h).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
)

var resultNames = [...]string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
	"ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"}

// String returns the enumerator's name (ncclInvalidArgument).
func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult_t(%d)", int32(r))
}

// DataType is an ncclDataType_t.
type DataType int32

// The ncclDataType_t values (nccl.h).
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	Bfloat16 DataType = 9
)

// DataTypeOf maps an element type to its ncclDataType_t. Bool has none:
// NCCL's reductions would add bytes, so the caller converts (to uint8 for
// copies, or reduces with max/min over uint8 with values 0 and 1).
func DataTypeOf(d ir.DType) (DataType, error) {
	switch d {
	case ir.Uint8:
		return Uint8, nil
	case ir.Int32:
		return Int32, nil
	case ir.Uint32:
		return Uint32, nil
	case ir.Int64:
		return Int64, nil
	case ir.Float16:
		return Float16, nil
	case ir.BFloat16:
		return Bfloat16, nil
	case ir.Float32:
		return Float32, nil
	case ir.Float64:
		return Float64, nil
	}
	return 0, fmt.Errorf("nccl: element type %v has no NCCL data type", d)
}

// RedOp is an ncclRedOp_t (a built-in reduction).
type RedOp int32

// The built-in ncclRedOp_t values (nccl.h).
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4
)

// RedOpOf maps a collective reduction to its ncclRedOp_t.
func RedOpOf(op collective.Op) (RedOp, error) {
	switch op {
	case collective.Sum:
		return Sum, nil
	case collective.Prod:
		return Prod, nil
	case collective.Max:
		return Max, nil
	case collective.Min:
		return Min, nil
	}
	return 0, fmt.Errorf("nccl: no NCCL reduction for collective op %d", op)
}

// Error is a failed NCCL call: the function, its ncclResult_t and
// ncclGetErrorString's text.
type Error struct {
	// Func is the NCCL function (ncclAllReduce).
	Func string
	// Code is the ncclResult_t it returned.
	Code Result
	// Msg is ncclGetErrorString(Code).
	Msg string
}

// Error reads "nccl: ncclAllReduce: invalid argument (ncclInvalidArgument)".
func (e *Error) Error() string {
	return fmt.Sprintf("nccl: %s: %s (%v)", e.Func, e.Msg, e.Code)
}

// entryPoints are the NCCL functions Load resolves.
var entryPoints = []string{
	"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitAll",
	"ncclGroupStart", "ncclGroupEnd", "ncclAllReduce", "ncclAllGather",
	"ncclReduceScatter", "ncclBroadcast", "ncclSend", "ncclRecv",
	"ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError", "ncclGetErrorString",
}

// Lib is a loaded NCCL library with its entry points resolved.
type Lib struct {
	*cuda.Library
	procs *dynlib.Table
}

// Load finds and loads NCCL: the file $FERRY_NCCL_LIB when it is set (and
// nothing else), otherwise libnccl.so.2 in cuda.SearchDirs
// ($FERRY_CUDA_LIB_DIR, /usr/local/cuda*/lib64, $LD_LIBRARY_PATH, the
// nvidia/*/lib folders of pip wheels, which hold nvidia-nccl-cu12's
// nvidia/nccl/lib), then through the system loader. A missing library or
// entry point is a *cuda.LoadError listing every attempt.
func Load() (*Lib, error) {
	s := dynlib.Spec{Prefix: "nccl", Pattern: Soname}
	if p := settings.NCCLLib.Get(); p != "" {
		// RTLD_LOCAL: a library named here (a test double, say) must not
		// interpose its symbols on a real NCCL loaded later.
		s.Env, s.EnvPath, s.Local = LibEnv, p, true
	} else {
		s.Dirs, s.Paths = cuda.SearchDirs(), []string{Soname}
	}
	lib, err := dynlib.Open(s)
	if err != nil {
		return nil, err
	}
	procs, err := lib.Resolve(dynlib.Names(entryPoints...))
	if err != nil {
		return nil, err
	}
	return &Lib{Library: lib, procs: procs}, nil
}

// call calls an entry point with raw arguments and returns its
// ncclResult_t. Addresses of Go memory converted to uintptr in the argument
// list stay on the heap and alive for the call (go:uintptrescapes).
//
//go:uintptrescapes
func (l *Lib) call(name string, args ...uintptr) Result {
	return Result(l.procs.Call(name, args...))
}

// check turns a result into nil or an *Error with ncclGetErrorString's text.
func (l *Lib) check(name string, r Result) error {
	if r == Success {
		return nil
	}
	return &Error{Func: name, Code: r, Msg: l.ErrorString(r)}
}

// ErrorString returns ncclGetErrorString(r).
func (l *Lib) ErrorString(r Result) string {
	p, _, _ := purego.SyscallN(l.procs.Proc("ncclGetErrorString"), uintptr(r))
	if p == 0 {
		return r.String()
	}
	return dynlib.GoString(p) // a C string owned by NCCL
}

// Version returns ncclGetVersion (for example 22304 for NCCL 2.23.4).
func (l *Lib) Version() (int, error) {
	var v int32
	err := l.check("ncclGetVersion", l.call("ncclGetVersion", uintptr(unsafe.Pointer(&v))))
	return int(v), err
}

// GetUniqueID returns a new ncclGetUniqueId, to be made by one rank and
// sent to the others.
func (l *Lib) GetUniqueID() (UniqueID, error) {
	var id UniqueID
	err := l.check("ncclGetUniqueId", l.call("ncclGetUniqueId", uintptr(unsafe.Pointer(&id))))
	return id, err
}

// GroupStart calls ncclGroupStart: the collectives until GroupEnd are
// launched together (needed when one thread drives several ranks, and for
// Send/Recv pairs).
func (l *Lib) GroupStart() error { return l.check("ncclGroupStart", l.call("ncclGroupStart")) }

// GroupEnd calls ncclGroupEnd.
func (l *Lib) GroupEnd() error { return l.check("ncclGroupEnd", l.call("ncclGroupEnd")) }

// Comm is an ncclComm_t: one rank of a communicator.
type Comm struct {
	lib          *Lib
	h            uintptr
	rank, nranks int
	device       int // for CommInitAll; -1 when unknown
}

// Rank returns the communicator rank this Comm is.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.nranks }

// Handle returns the ncclComm_t, or 0 after Destroy or Abort.
func (c *Comm) Handle() uintptr { return c.h }

// CommInitRank joins the communicator of nranks ranks named by id as rank
// (ncclCommInitRank), on the CUDA device current on the calling thread. It
// blocks until every rank has joined.
func (l *Lib) CommInitRank(nranks int, id UniqueID, rank int) (*Comm, error) {
	if nranks < 1 || nranks > 1<<30 {
		return nil, fmt.Errorf("nccl: CommInitRank: %d ranks (want at least 1)", nranks)
	}
	if rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("nccl: CommInitRank: rank %d out of range [0, %d)", rank, nranks)
	}
	h := new(uintptr) // heap: its address is stored in args before the call
	var r Result
	switch runtime.GOARCH {
	case "amd64":
		// System V: the 128-byte struct is class MEMORY. It takes no
		// register; the caller copies it to the stack, in the argument area
		// at the callee's entry (%rsp+8), eightbyte by eightbyte, while the
		// int arguments around it keep taking %rdi, %rsi, %rdx. SyscallN
		// puts its first six arguments in the six integer registers and the
		// rest on the stack in order, so: comm, nranks, rank in %rdi, %rsi,
		// %rdx; three unused registers; the 16 eightbytes of the id.
		w := idWords(&id)
		args := append([]uintptr{0, uintptr(nranks), uintptr(rank), 0, 0, 0}, w[:]...)
		r = l.initRank(h, args)
	case "arm64":
		// AAPCS64: a composite over 16 bytes is copied by the caller and
		// passed as a pointer to the copy, in the next integer register.
		cp := id
		r = l.call("ncclCommInitRank", uintptr(unsafe.Pointer(h)), uintptr(nranks), uintptr(unsafe.Pointer(&cp)), uintptr(rank))
	default:
		return nil, fmt.Errorf("nccl: CommInitRank: passing ncclUniqueId by value is not implemented on %s", runtime.GOARCH)
	}
	if err := l.check("ncclCommInitRank", r); err != nil {
		return nil, err
	}
	return &Comm{lib: l, h: *h, rank: rank, nranks: nranks, device: -1}, nil
}

// initRank calls ncclCommInitRank with args, whose first slot it sets to
// the address of *h (kept alive by the go:uintptrescapes call).
func (l *Lib) initRank(h *uintptr, args []uintptr) Result {
	var pin runtime.Pinner
	pin.Pin(h)
	defer pin.Unpin()
	args[0] = uintptr(unsafe.Pointer(h))
	return l.call("ncclCommInitRank", args...)
}

// idWords returns the id as the 16 eightbytes it occupies in memory.
func idWords(id *UniqueID) (w [UniqueIDBytes / 8]uintptr) {
	for i := range w {
		w[i] = uintptr(binary.NativeEndian.Uint64(id[8*i:]))
	}
	return w
}

// CommInitAll makes one communicator over devices (CUDA device ordinals)
// in this process (ncclCommInitAll): Comm i is rank i, on devices[i].
func (l *Lib) CommInitAll(devices []int) ([]*Comm, error) {
	if len(devices) == 0 {
		return nil, errors.New("nccl: CommInitAll: no devices")
	}
	devs := make([]int32, len(devices))
	seen := map[int]bool{}
	for i, d := range devices {
		if d < 0 || d > 1<<20 || seen[d] {
			return nil, fmt.Errorf("nccl: CommInitAll: bad or repeated device %d", d)
		}
		seen[d] = true
		devs[i] = int32(d)
	}
	hs := make([]uintptr, len(devices))
	r := l.call("ncclCommInitAll", uintptr(unsafe.Pointer(&hs[0])), uintptr(len(devs)), uintptr(unsafe.Pointer(&devs[0])))
	if err := l.check("ncclCommInitAll", r); err != nil {
		return nil, err
	}
	cs := make([]*Comm, len(hs))
	for i, h := range hs {
		cs[i] = &Comm{lib: l, h: h, rank: i, nranks: len(hs), device: devices[i]}
	}
	return cs, nil
}

// Device returns the CUDA device ordinal of a Comm made by CommInitAll, or
// -1.
func (c *Comm) Device() int { return c.device }

// live returns an error when c was destroyed.
func (c *Comm) live(fn string) error {
	if c == nil || c.h == 0 {
		return fmt.Errorf("nccl: %s on a destroyed or nil communicator", fn)
	}
	return nil
}

// collArgs checks a collective's count and element type.
func (c *Comm) collArgs(fn string, count int, dtype ir.DType) (DataType, error) {
	if err := c.live(fn); err != nil {
		return 0, err
	}
	if count < 0 {
		return 0, fmt.Errorf("nccl: %s: negative count %d", fn, count)
	}
	dt, err := DataTypeOf(dtype)
	if err != nil {
		return 0, fmt.Errorf("nccl: %s: %w", fn, err)
	}
	return dt, nil
}

func checkOp(fn string, op RedOp) error {
	if op < Sum || op > Avg {
		return fmt.Errorf("nccl: %s: unknown reduction %d", fn, op)
	}
	return nil
}

// AllReduce reduces count elements of send (a device pointer) over the
// ranks with op into recv on every rank, enqueued on stream (a CUstream;
// 0 is the legacy default stream).
func (c *Comm) AllReduce(send, recv uintptr, count int, dtype ir.DType, op RedOp, stream uintptr) error {
	const fn = "ncclAllReduce"
	dt, err := c.collArgs(fn, count, dtype)
	if err != nil {
		return err
	}
	if err := checkOp(fn, op); err != nil {
		return err
	}
	return c.lib.check(fn, c.lib.call(fn, send, recv, uintptr(count), uintptr(dt), uintptr(op), c.h, stream))
}

// AllGather gathers sendCount elements from every rank into recv
// (Size()*sendCount elements, rank i's at i*sendCount).
func (c *Comm) AllGather(send, recv uintptr, sendCount int, dtype ir.DType, stream uintptr) error {
	const fn = "ncclAllGather"
	dt, err := c.collArgs(fn, sendCount, dtype)
	if err != nil {
		return err
	}
	return c.lib.check(fn, c.lib.call(fn, send, recv, uintptr(sendCount), uintptr(dt), c.h, stream))
}

// ReduceScatter reduces Size()*recvCount elements of send over the ranks
// with op; rank i receives block i (recvCount elements) in recv.
func (c *Comm) ReduceScatter(send, recv uintptr, recvCount int, dtype ir.DType, op RedOp, stream uintptr) error {
	const fn = "ncclReduceScatter"
	dt, err := c.collArgs(fn, recvCount, dtype)
	if err != nil {
		return err
	}
	if err := checkOp(fn, op); err != nil {
		return err
	}
	return c.lib.check(fn, c.lib.call(fn, send, recv, uintptr(recvCount), uintptr(dt), uintptr(op), c.h, stream))
}

// Broadcast copies count elements of root's send into every rank's recv.
func (c *Comm) Broadcast(send, recv uintptr, count int, dtype ir.DType, root int, stream uintptr) error {
	const fn = "ncclBroadcast"
	dt, err := c.collArgs(fn, count, dtype)
	if err != nil {
		return err
	}
	if root < 0 || root >= c.nranks {
		return fmt.Errorf("nccl: %s: root %d out of range [0, %d)", fn, root, c.nranks)
	}
	return c.lib.check(fn, c.lib.call(fn, send, recv, uintptr(count), uintptr(dt), uintptr(root), c.h, stream))
}

// Send sends count elements of send to rank peer (matched by its Recv;
// wrap pairs in GroupStart/GroupEnd to avoid deadlock).
func (c *Comm) Send(send uintptr, count int, dtype ir.DType, peer int, stream uintptr) error {
	return c.p2p("ncclSend", send, count, dtype, peer, stream)
}

// Recv receives count elements from rank peer into recv.
func (c *Comm) Recv(recv uintptr, count int, dtype ir.DType, peer int, stream uintptr) error {
	return c.p2p("ncclRecv", recv, count, dtype, peer, stream)
}

func (c *Comm) p2p(fn string, buf uintptr, count int, dtype ir.DType, peer int, stream uintptr) error {
	dt, err := c.collArgs(fn, count, dtype)
	if err != nil {
		return err
	}
	if peer < 0 || peer >= c.nranks {
		return fmt.Errorf("nccl: %s: peer %d out of range [0, %d)", fn, peer, c.nranks)
	}
	return c.lib.check(fn, c.lib.call(fn, buf, uintptr(count), uintptr(dt), uintptr(peer), c.h, stream))
}

// AsyncError returns ncclCommGetAsyncError: Success, InProgress (a
// non-blocking operation still running) or the error a background
// operation met (a peer that failed, for example). The error is for the
// query itself.
func (c *Comm) AsyncError() (Result, error) {
	const fn = "ncclCommGetAsyncError"
	if err := c.live(fn); err != nil {
		return 0, err
	}
	var r int32
	if err := c.lib.check(fn, c.lib.call(fn, c.h, uintptr(unsafe.Pointer(&r)))); err != nil {
		return 0, err
	}
	return Result(r), nil
}

// Destroy frees the communicator after its pending operations finish
// (ncclCommDestroy). The Comm is unusable afterwards.
func (c *Comm) Destroy() error { return c.end("ncclCommDestroy") }

// Abort frees the communicator at once, cancelling pending operations
// (ncclCommAbort): what a rank does when a peer died or a collective timed
// out, so it does not hang in Destroy.
func (c *Comm) Abort() error { return c.end("ncclCommAbort") }

func (c *Comm) end(fn string) error {
	if err := c.live(fn); err != nil {
		return err
	}
	h := c.h
	c.h = 0
	return c.lib.check(fn, c.lib.call(fn, h))
}
