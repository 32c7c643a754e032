package nccl

import (
	"bytes"
	"errors"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/cuda"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// fakeNCCL is a C library exporting NCCL's entry points with the real
// signatures (the by-value ncclUniqueId included), compiled by gcc, so gcc
// decides where each argument lives and the binding must agree with it. It
// records every call's arguments in fake_rec and returns fake_fail when it
// is set.
const fakeNCCL = `#include <stddef.h>
#include <string.h>
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
  ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm* ncclComm_t;
typedef struct CUstream_st* cudaStream_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
struct rec {
  int fn, nranks, rank, ndev, devs[8];
  unsigned char id[128];
  unsigned long long send, recv, count;
  int dtype, op, root, peer;
  unsigned long long comm, stream;
  int group_start, group_end;
};
struct rec fake_rec;
int fake_fail, fake_async, fake_counter;
static ncclResult_t ret(int fn) { fake_rec.fn = fn; int r = fake_fail; fake_fail = 0; return (ncclResult_t)r; }
ncclResult_t ncclGetVersion(int* v) { *v = 22304; return ret(1); }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  fake_counter++;
  for (int i = 0; i < 128; i++) id->internal[i] = (char)(fake_counter * 37 + i * 11);
  return ret(2);
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  fake_rec.nranks = nranks; fake_rec.rank = rank; memcpy(fake_rec.id, id.internal, 128);
  *comm = (ncclComm_t)(0x10000 + 16 * (size_t)rank);
  return ret(3);
}
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  fake_rec.ndev = ndev;
  for (int i = 0; i < ndev && i < 8; i++) { fake_rec.devs[i] = devlist[i]; comm[i] = (ncclComm_t)(0x20000 + 16 * (size_t)devlist[i]); }
  return ret(4);
}
ncclResult_t ncclGroupStart(void) { fake_rec.group_start++; return ret(5); }
ncclResult_t ncclGroupEnd(void) { fake_rec.group_end++; return ret(6); }
static void coll(const void* s, void* r, size_t n, ncclDataType_t dt, ncclComm_t c, cudaStream_t st) {
  fake_rec.send = (size_t)s; fake_rec.recv = (size_t)r; fake_rec.count = n; fake_rec.dtype = dt;
  fake_rec.comm = (size_t)c; fake_rec.stream = (size_t)st;
}
ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  coll(s, r, n, dt, c, st); fake_rec.op = op; return ret(7);
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t dt, ncclComm_t c, cudaStream_t st) {
  coll(s, r, n, dt, c, st); return ret(8);
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  coll(s, r, n, dt, c, st); fake_rec.op = op; return ret(9);
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t dt, int root, ncclComm_t c, cudaStream_t st) {
  coll(s, r, n, dt, c, st); fake_rec.root = root; return ret(10);
}
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t st) {
  coll(s, 0, n, dt, c, st); fake_rec.peer = peer; return ret(11);
}
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t st) {
  coll(0, r, n, dt, c, st); fake_rec.peer = peer; return ret(12);
}
ncclResult_t ncclCommDestroy(ncclComm_t c) { fake_rec.comm = (size_t)c; return ret(13); }
ncclResult_t ncclCommAbort(ncclComm_t c) { fake_rec.comm = (size_t)c; return ret(14); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) { fake_rec.comm = (size_t)c; *e = (ncclResult_t)fake_async; return ret(15); }
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclInvalidArgument: return "fake: invalid argument";
  case ncclRemoteError: return "fake: remote process exited or there was a network error";
  default: return "fake: other error";
  }
}
`

// rec mirrors struct rec (same field order and sizes, so the same layout).
type rec struct {
	Fn, NRanks, Rank, NDev int32
	Devs                   [8]int32
	ID                     [128]byte
	Send, Recv, Count      uint64
	DType, Op, Root, Peer  int32
	Comm, Stream           uint64
	GroupStart, GroupEnd   int32
}

var (
	fakeOnce sync.Once
	fakePath string
	fakeErr  error
)

// loadFake builds the fake NCCL once and loads it through $FERRY_NCCL_LIB.
// It returns the binding and views of fake_rec, fake_fail and fake_async.
func loadFake(t *testing.T) (*Lib, *rec, *int32, *int32) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the fake NCCL library cannot be built")
	}
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ferry-fakenccl")
		if err != nil {
			fakeErr = err
			return
		}
		src := filepath.Join(dir, "fakenccl.c")
		fakePath = filepath.Join(dir, "libnccl.so.2")
		if fakeErr = os.WriteFile(src, []byte(fakeNCCL), 0o644); fakeErr != nil {
			return
		}
		if out, err := exec.Command(gcc, "-O1", "-shared", "-fPIC", "-o", fakePath, src).CombinedOutput(); err != nil {
			fakeErr = errors.New(err.Error() + ": " + string(out))
		}
	})
	if fakeErr != nil {
		t.Fatalf("building the fake NCCL: %v", fakeErr)
	}
	t.Setenv(LibEnv, fakePath)
	l, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	sym := func(name string) unsafe.Pointer {
		p, err := l.Sym(name)
		if err != nil {
			t.Fatal(err)
		}
		return unsafe.Add(nil, p) // C memory of the loaded library
	}
	r := (*rec)(sym("fake_rec"))
	*r = rec{}
	return l, r, (*int32)(sym("fake_fail")), (*int32)(sym("fake_async"))
}

func randomID(r *rand.Rand) UniqueID {
	var id UniqueID
	for i := range id {
		id[i] = byte(r.Uint32())
	}
	return id
}

func TestLoadFakeAndVersion(t *testing.T) {
	l, r, _, _ := loadFake(t)
	v, err := l.Version()
	if err != nil || v != 22304 || r.Fn != 1 {
		t.Fatalf("Version = %d, %v (fn %d); want 22304", v, err, r.Fn)
	}
	if l.Path != settings.NCCLLib.Get() {
		t.Errorf("loaded %s, want %s", l.Path, settings.NCCLLib.Get())
	}
}

func TestLoadErrors(t *testing.T) {
	t.Setenv(LibEnv, filepath.Join(t.TempDir(), "nope.so"))
	_, err := Load()
	var le *cuda.LoadError
	if !errors.As(err, &le) || len(le.Attempts) != 1 || !strings.Contains(err.Error(), "nope.so ($FERRY_NCCL_LIB)") {
		t.Fatalf("Load with a missing $%s: %v", LibEnv, err)
	}
	// A library without the entry points names the missing one. (It
	// exports no NCCL name: it is loaded RTLD_GLOBAL by the directory
	// search and must not interpose on a real NCCL loaded later.)
	gcc, gerr := exec.LookPath("gcc")
	if gerr != nil {
		t.Skip("gcc not found")
	}
	empty := t.TempDir()
	t.Setenv(LibEnv, "")
	t.Setenv(cuda.LibDirEnv, empty)
	so := filepath.Join(empty, Soname)
	src := filepath.Join(empty, "x.c")
	os.WriteFile(src, []byte("int not_nccl(void) { return 0; }\n"), 0o644)
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v %s", err, out)
	}
	_, err = Load()
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "ncclGetVersion") || !strings.Contains(err.Error(), "missing entry point") {
		t.Fatalf("Load of an incomplete library: %v", err)
	}
	// Without $FERRY_NCCL_LIB and with nothing installed, every search
	// directory is an attempt and the system loader the last one.
	empty = t.TempDir()
	t.Setenv(cuda.LibDirEnv, empty)
	if _, err := Load(); err == nil {
		t.Skip("an NCCL is installed; the not-found listing cannot be checked")
	} else if !errors.As(err, &le) || !strings.Contains(err.Error(), filepath.Join(empty, Soname)) ||
		!strings.Contains(le.Attempts[len(le.Attempts)-1].Path, "system loader") {
		t.Fatalf("Load with no NCCL: %v", err)
	}
}

// TestCommInitRankPassesIDByValue checks the ABI: the fake, compiled by gcc
// with the by-value ncclUniqueId parameter, must see the 128 bytes, nranks
// and the rank that follows the struct.
func TestCommInitRankPassesIDByValue(t *testing.T) {
	l, r, _, _ := loadFake(t)
	rnd := testseed.Rand(t, 1)
	for range 20 {
		nranks := 1 + rnd.IntN(1000)
		rank := rnd.IntN(nranks)
		id := randomID(rnd)
		c, err := l.CommInitRank(nranks, id, rank)
		if err != nil {
			t.Fatal(err)
		}
		if r.Fn != 3 || int(r.NRanks) != nranks || int(r.Rank) != rank || UniqueID(r.ID) != id {
			t.Fatalf("ncclCommInitRank got nranks %d rank %d id %x; want %d %d %x", r.NRanks, r.Rank, r.ID[:], nranks, rank, id[:])
		}
		if c.Handle() != uintptr(0x10000+16*rank) || c.Rank() != rank || c.Size() != nranks {
			t.Fatalf("comm %#x rank %d size %d", c.Handle(), c.Rank(), c.Size())
		}
	}
}

// TestPuregoStructArgAgrees checks the ABI finding: purego's RegisterFunc
// with a 128-byte struct parameter (copied to the stack on amd64) reaches
// the same bytes as the binding's explicit layout.
func TestPuregoStructArgAgrees(t *testing.T) {
	l, r, _, _ := loadFake(t)
	var initRank func(comm *uintptr, nranks int32, id struct{ Internal [128]byte }, rank int32) int32
	purego.RegisterFunc(&initRank, l.procs.Proc("ncclCommInitRank"))
	id := randomID(testseed.Rand(t, 2))
	var h uintptr
	if res := initRank(&h, 9, struct{ Internal [128]byte }{id}, 5); res != 0 || r.NRanks != 9 || r.Rank != 5 || UniqueID(r.ID) != id {
		t.Fatalf("purego.RegisterFunc: result %d, nranks %d rank %d id %x; want 9 5 %x", res, r.NRanks, r.Rank, r.ID[:], id[:])
	}
}

func TestGetUniqueID(t *testing.T) {
	l, r, _, _ := loadFake(t)
	counter := (*int32)(unsafe.Add(nil, mustSym(t, l, "fake_counter")))
	for range 3 {
		id, err := l.GetUniqueID()
		if err != nil || r.Fn != 2 {
			t.Fatal(err)
		}
		for i, b := range id {
			if want := byte(int(*counter)*37 + i*11); b != want {
				t.Fatalf("id[%d] = %d, want %d", i, b, want)
			}
		}
	}
}

func mustSym(t *testing.T, l *Lib, name string) uintptr {
	p, err := l.Sym(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCommInitAll(t *testing.T) {
	l, r, _, _ := loadFake(t)
	devs := []int{3, 0, 5}
	cs, err := l.CommInitAll(devs)
	if err != nil {
		t.Fatal(err)
	}
	if r.Fn != 4 || r.NDev != 3 || r.Devs[0] != 3 || r.Devs[1] != 0 || r.Devs[2] != 5 {
		t.Fatalf("ncclCommInitAll got ndev %d devs %v", r.NDev, r.Devs[:3])
	}
	for i, c := range cs {
		if c.Handle() != uintptr(0x20000+16*devs[i]) || c.Rank() != i || c.Size() != 3 || c.Device() != devs[i] {
			t.Fatalf("comm %d: %#x rank %d size %d dev %d", i, c.Handle(), c.Rank(), c.Size(), c.Device())
		}
	}
	for _, bad := range [][]int{nil, {0, 0}, {-1}} {
		if _, err := l.CommInitAll(bad); err == nil {
			t.Errorf("CommInitAll(%v) accepted", bad)
		}
	}
}

// TestCollectivesPassArguments calls every collective with random
// arguments and checks what the C side received.
func TestCollectivesPassArguments(t *testing.T) {
	l, r, _, _ := loadFake(t)
	rnd := testseed.Rand(t, 3)
	c, err := l.CommInitRank(8, randomID(rnd), 2)
	if err != nil {
		t.Fatal(err)
	}
	want := map[ir.DType]int32{ir.Uint8: 1, ir.Int32: 2, ir.Uint32: 3, ir.Int64: 4, ir.Float16: 6, ir.Float32: 7, ir.Float64: 8, ir.BFloat16: 9}
	for range 50 {
		dts := []ir.DType{ir.Uint8, ir.Int32, ir.Uint32, ir.Int64, ir.Float16, ir.Float32, ir.Float64, ir.BFloat16}
		dt := dts[rnd.IntN(len(dts))]
		send, recv, stream := uintptr(rnd.Uint64()), uintptr(rnd.Uint64()), uintptr(rnd.Uint64())
		count := rnd.IntN(1 << 40)
		op := RedOp(rnd.IntN(5))
		peer := rnd.IntN(8)
		check := func(name string, err error, fn int32, s, rv uint64, extra func() bool) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if r.Fn != fn || r.Send != s || r.Recv != rv || r.Count != uint64(count) || r.DType != want[dt] ||
				r.Comm != uint64(c.Handle()) || r.Stream != uint64(stream) || !extra() {
				t.Fatalf("%s(%#x, %#x, %d, %v, op %d, peer %d, stream %#x): C got %+v", name, send, recv, count, dt, op, peer, stream, *r)
			}
		}
		check("AllReduce", c.AllReduce(send, recv, count, dt, op, stream), 7, uint64(send), uint64(recv), func() bool { return r.Op == int32(op) })
		check("AllGather", c.AllGather(send, recv, count, dt, stream), 8, uint64(send), uint64(recv), func() bool { return true })
		check("ReduceScatter", c.ReduceScatter(send, recv, count, dt, op, stream), 9, uint64(send), uint64(recv), func() bool { return r.Op == int32(op) })
		check("Broadcast", c.Broadcast(send, recv, count, dt, peer, stream), 10, uint64(send), uint64(recv), func() bool { return r.Root == int32(peer) })
		check("Send", c.Send(send, count, dt, peer, stream), 11, uint64(send), 0, func() bool { return r.Peer == int32(peer) })
		check("Recv", c.Recv(recv, count, dt, peer, stream), 12, 0, uint64(recv), func() bool { return r.Peer == int32(peer) })
	}
	if err := l.GroupStart(); err != nil || r.GroupStart != 1 {
		t.Fatalf("GroupStart: %v, %d", err, r.GroupStart)
	}
	if err := l.GroupEnd(); err != nil || r.GroupEnd != 1 {
		t.Fatalf("GroupEnd: %v, %d", err, r.GroupEnd)
	}
}

func TestBadArguments(t *testing.T) {
	l, r, _, _ := loadFake(t)
	c, err := l.CommInitRank(4, UniqueID{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	r.Fn = 0
	for name, err := range map[string]error{
		"bool":          c.AllReduce(1, 2, 3, ir.Bool, Sum, 0),
		"invalid dtype": c.AllGather(1, 2, 3, ir.InvalidDType, 0),
		"negative":      c.Broadcast(1, 2, -1, ir.Float32, 0, 0),
		"op":            c.ReduceScatter(1, 2, 3, ir.Float32, RedOp(5), 0),
		"root":          c.Broadcast(1, 2, 3, ir.Float32, 4, 0),
		"peer":          c.Send(1, 3, ir.Float32, -1, 0),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if r.Fn != 0 {
		t.Errorf("a rejected call reached NCCL (fn %d)", r.Fn)
	}
	for _, a := range [][2]int{{0, 0}, {4, 4}, {4, -1}} {
		if _, err := l.CommInitRank(a[0], UniqueID{}, a[1]); err == nil {
			t.Errorf("CommInitRank(%d, _, %d) accepted", a[0], a[1])
		}
	}
	if _, err := DataTypeOf(ir.Bool); err == nil || !strings.Contains(err.Error(), "bool") {
		t.Errorf("DataTypeOf(bool): %v", err)
	}
}

func TestRedOpOf(t *testing.T) {
	for op, want := range map[collective.Op]RedOp{collective.Sum: Sum, collective.Prod: Prod, collective.Max: Max, collective.Min: Min} {
		if got, err := RedOpOf(op); err != nil || got != want {
			t.Errorf("RedOpOf(%d) = %d, %v; want %d", op, got, err, want)
		}
	}
	if _, err := RedOpOf(0); err == nil {
		t.Error("RedOpOf(0) accepted")
	}
}

// TestErrorsCarryNCCLText makes the fake fail and checks the error names
// the function, the code and ncclGetErrorString's text.
func TestErrorsCarryNCCLText(t *testing.T) {
	l, _, fail, _ := loadFake(t)
	*fail = int32(InvalidArgument)
	_, err := l.CommInitRank(2, UniqueID{}, 0)
	var ne *Error
	if !errors.As(err, &ne) || ne.Func != "ncclCommInitRank" || ne.Code != InvalidArgument || ne.Msg != "fake: invalid argument" {
		t.Fatalf("CommInitRank error: %#v", err)
	}
	if want := "nccl: ncclCommInitRank: fake: invalid argument (ncclInvalidArgument)"; err.Error() != want {
		t.Errorf("error text %q, want %q", err, want)
	}
	c, err := l.CommInitRank(2, UniqueID{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	*fail = int32(RemoteError)
	err = c.AllReduce(1, 2, 3, ir.Float32, Sum, 0)
	if !errors.As(err, &ne) || ne.Code != RemoteError || !strings.Contains(err.Error(), "remote process exited") {
		t.Fatalf("AllReduce error: %v", err)
	}
	*fail = int32(SystemError)
	if err := l.GroupEnd(); !errors.As(err, &ne) || ne.Func != "ncclGroupEnd" || ne.Code != SystemError {
		t.Fatalf("GroupEnd error: %v", err)
	}
}

func TestAsyncErrorDestroyAbort(t *testing.T) {
	l, r, _, async := loadFake(t)
	cs, err := l.CommInitAll([]int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []Result{Success, InProgress, RemoteError} {
		*async = int32(want)
		got, err := cs[0].AsyncError()
		if err != nil || got != want || r.Fn != 15 || r.Comm != uint64(cs[0].Handle()) {
			t.Fatalf("AsyncError = %v, %v (comm %#x); want %v", got, err, r.Comm, want)
		}
	}
	h0, h1 := cs[0].Handle(), cs[1].Handle()
	if err := cs[0].Destroy(); err != nil || r.Fn != 13 || r.Comm != uint64(h0) {
		t.Fatalf("Destroy: %v, fn %d comm %#x", err, r.Fn, r.Comm)
	}
	if err := cs[1].Abort(); err != nil || r.Fn != 14 || r.Comm != uint64(h1) {
		t.Fatalf("Abort: %v, fn %d comm %#x", err, r.Fn, r.Comm)
	}
	r.Fn = 0
	if err := cs[0].AllReduce(1, 2, 3, ir.Float32, Sum, 0); err == nil || !strings.Contains(err.Error(), "destroyed") {
		t.Errorf("AllReduce after Destroy: %v", err)
	}
	if err := cs[1].Destroy(); err == nil {
		t.Error("Destroy after Abort accepted")
	}
	if _, err := cs[0].AsyncError(); err == nil {
		t.Error("AsyncError after Destroy accepted")
	}
	if r.Fn != 0 {
		t.Errorf("a call on a destroyed comm reached NCCL (fn %d)", r.Fn)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fakePath != "" {
		os.RemoveAll(filepath.Dir(fakePath))
	}
	os.Exit(code)
}

// TestCollectivesAdapter checks Comm.Collectives, the communicator the
// CUDA backend consumes: reductions map to NCCL's enums, the other calls
// pass their arguments through, an asynchronous failure is an *Error with
// NCCL's text (InProgress is none), and Abort reaches ncclCommAbort once.
func TestCollectivesAdapter(t *testing.T) {
	l, r, _, async := loadFake(t)
	cs, err := l.CommInitAll([]int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	d := cs[1].Collectives()
	if d.Rank() != 1 || d.Size() != 2 {
		t.Fatalf("rank %d size %d", d.Rank(), d.Size())
	}
	for op, want := range map[collective.Op]RedOp{collective.Sum: Sum, collective.Max: Max, collective.Min: Min, collective.Prod: Prod} {
		if err := d.AllReduce(0x100, 0x200, 7, ir.Float32, op, 0x300); err != nil || r.Fn != 7 || r.Op != int32(want) ||
			r.Send != 0x100 || r.Recv != 0x200 || r.Count != 7 || r.DType != int32(Float32) || r.Stream != 0x300 || r.Comm != uint64(cs[1].Handle()) {
			t.Fatalf("AllReduce(%v): %v, C got %+v", op, err, *r)
		}
		if err := d.ReduceScatter(0x100, 0x200, 3, ir.Int32, op, 0x300); err != nil || r.Fn != 9 || r.Op != int32(want) || r.DType != int32(Int32) {
			t.Fatalf("ReduceScatter(%v): %v, C got %+v", op, err, *r)
		}
	}
	if err := d.AllReduce(1, 2, 3, ir.Float32, 0, 4); err == nil {
		t.Error("AllReduce with an invalid reduction accepted")
	}
	if err := d.AllGather(0x10, 0x20, 5, ir.Uint8, 0x30); err != nil || r.Fn != 8 || r.Count != 5 || r.DType != int32(Uint8) {
		t.Fatalf("AllGather: %v, %+v", err, *r)
	}
	if err := d.Broadcast(0x10, 0x20, 5, ir.Float64, 1, 0x30); err != nil || r.Fn != 10 || r.Root != 1 {
		t.Fatalf("Broadcast: %v, %+v", err, *r)
	}
	if err := d.Send(0x10, 5, ir.Uint8, 0, 0x30); err != nil || r.Fn != 11 || r.Peer != 0 {
		t.Fatalf("Send: %v, %+v", err, *r)
	}
	if err := d.Recv(0x20, 5, ir.Uint8, 0, 0x30); err != nil || r.Fn != 12 || r.Recv != 0x20 {
		t.Fatalf("Recv: %v, %+v", err, *r)
	}
	gs, ge := r.GroupStart, r.GroupEnd
	if err := d.GroupStart(); err != nil || r.GroupStart != gs+1 {
		t.Fatalf("GroupStart: %v", err)
	}
	if err := d.GroupEnd(); err != nil || r.GroupEnd != ge+1 {
		t.Fatalf("GroupEnd: %v", err)
	}
	for _, res := range []Result{Success, InProgress} {
		*async = int32(res)
		if err := d.AsyncError(); err != nil {
			t.Errorf("AsyncError with %v: %v", res, err)
		}
	}
	*async = int32(RemoteError)
	var ne *Error
	if err := d.AsyncError(); !errors.As(err, &ne) || ne.Code != RemoteError || !strings.Contains(err.Error(), "remote process exited") {
		t.Errorf("AsyncError with ncclRemoteError: %v", err)
	}
	*async = 0
	h := cs[1].Handle()
	if err := d.Abort(); err != nil || r.Fn != 14 || r.Comm != uint64(h) {
		t.Fatalf("Abort: %v, fn %d comm %#x", err, r.Fn, r.Comm)
	}
	r.Fn = 0
	if err := d.Abort(); err != nil || r.Fn != 0 {
		t.Errorf("a second Abort: %v, reached NCCL: fn %d", err, r.Fn)
	}
}

// TestMakerRegistered: importing the package registers, for "cuda", a
// maker of device communicators that loads NCCL on first use and makes
// them with ncclCommInitAll, ncclGetUniqueId and ncclCommInitRank.
func TestMakerRegistered(t *testing.T) {
	if _, ok := backend.DeviceCommMakerFor("cuda").(*maker); !ok {
		t.Fatalf("the maker for cuda is %T", backend.DeviceCommMakerFor("cuda"))
	}
	t.Setenv(LibEnv, filepath.Join(t.TempDir(), "missing.so"))
	if _, err := (&maker{}).InitAll([]int{0}); err == nil || !strings.Contains(err.Error(), "runs collectives through NCCL") {
		t.Errorf("InitAll without NCCL: %v", err)
	}
	_, r, _, _ := loadFake(t) // sets $FERRY_NCCL_LIB to the fake
	m := &maker{}
	cs, err := m.InitAll([]int{0, 1})
	if err != nil || len(cs) != 2 || cs[1].Rank() != 1 || cs[1].Size() != 2 || r.Fn != 4 || r.NDev != 2 {
		t.Fatalf("InitAll: %v, %d comms, C got %+v", err, len(cs), *r)
	}
	id, err := m.NewGroupID()
	if err != nil || len(id) != UniqueIDBytes || r.Fn != 2 {
		t.Fatalf("NewGroupID: %v, %d bytes", err, len(id))
	}
	c, err := m.InitRank(id, 4, 3)
	if err != nil || c.Rank() != 3 || c.Size() != 4 || r.Fn != 3 || r.NRanks != 4 || r.Rank != 3 || !bytes.Equal(r.ID[:], id) {
		t.Fatalf("InitRank: %v, C got %+v", err, *r)
	}
	if _, err := m.InitRank(id[:5], 4, 3); err == nil {
		t.Error("InitRank with a 5-byte id accepted")
	}
}
