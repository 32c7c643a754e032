//go:build linux && (amd64 || arm64)

package cuda_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/cuda"
	"github.com/ferryml/ferry/cuda/nccl"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// groupNCCL is a fake libnccl.so.2 in C whose communicators from
// ncclCommInitAll really run their collectives on host memory (the fake
// CUDA driver's device memory is Go memory): the k-th call of every rank
// (a group of Send/Recv counting as one call) forms round k; a rank's call
// waits until every rank has made its call of the round, and the last one
// performs it. It supports what the backend issues in this test: all-reduce
// and reduce-scatter of f32 sums, all-gather of bytes, and grouped
// Send/Recv in which every rank takes part. It records each call's
// function, rank, count, type, reduction and stream.
const groupNCCL = `#include <pthread.h>
#include <string.h>
#include <stddef.h>
typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef void* ncclComm_t;
#define MAXR 8
#define SLOTS 64
#define MAXREC 4096
struct p2p { int send, peer; char* buf; size_t bytes; };
struct call { int fn; const char* send; char* recv; size_t count; int dt, op, np; struct p2p ops[16]; };
struct round { int n, left, done; struct call calls[MAXR]; };
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int nranks, seqs[MAXR];
static struct round rounds[SLOTS];
int rec_n, rec_fn[MAXREC], rec_rank[MAXREC], rec_dt[MAXREC], rec_op[MAXREC], fake_aborts, fake_bad;
unsigned long long rec_stream[MAXREC], rec_count[MAXREC];
static __thread int in_group, grank;
static __thread struct call gcall;
static int rankof(ncclComm_t c) { return (int)((size_t)c - 0x1000); }
static void record(int fn, ncclComm_t c, size_t count, int dt, int op, void* st) {
  pthread_mutex_lock(&mu);
  if (rec_n < MAXREC) { rec_fn[rec_n] = fn; rec_rank[rec_n] = rankof(c); rec_count[rec_n] = count; rec_dt[rec_n] = dt; rec_op[rec_n] = op; rec_stream[rec_n] = (size_t)st; rec_n++; }
  pthread_mutex_unlock(&mu);
}
static size_t esz(int dt) { return dt == 7 ? 4 : dt == 1 ? 1 : 0; }
static void perform(struct round* r) {
  struct call* c0 = &r->calls[0];
  for (int i = 0; i < nranks; i++) {
    struct call* c = &r->calls[i];
    if (c->fn != c0->fn || c->count != c0->count || c->dt != c0->dt || c->op != c0->op) { fake_bad++; return; }
  }
  size_t n = c0->count, es = esz(c0->dt);
  if (c0->fn == 7 || c0->fn == 9) { /* f32 sum: all-reduce, reduce-scatter */
    size_t total = c0->fn == 9 ? n * nranks : n;
    float acc[4096];
    if (c0->dt != 7 || c0->op != 0 || total > 4096) { fake_bad++; return; }
    for (size_t i = 0; i < total; i++) { acc[i] = 0; for (int r2 = 0; r2 < nranks; r2++) acc[i] += ((const float*)r->calls[r2].send)[i]; }
    for (int r2 = 0; r2 < nranks; r2++) memcpy(r->calls[r2].recv, acc + (c0->fn == 9 ? r2 * n : 0), n * 4);
  } else if (c0->fn == 8) { /* all-gather */
    for (int r2 = 0; r2 < nranks; r2++)
      for (int src = 0; src < nranks; src++) memcpy(r->calls[r2].recv + src * n * es, r->calls[src].send, n * es);
  } else if (c0->fn == 100) { /* a group of sends and receives */
    for (int r2 = 0; r2 < nranks; r2++)
      for (int k = 0; k < r->calls[r2].np; k++) {
        struct p2p* rv = &r->calls[r2].ops[k];
        if (rv->send) continue;
        struct call* from = &r->calls[rv->peer];
        int found = 0;
        for (int m = 0; m < from->np; m++) {
          struct p2p* s = &from->ops[m];
          if (s->send && s->peer == r2 && s->bytes == rv->bytes) { memcpy(rv->buf, s->buf, s->bytes); s->send = 2; found = 1; break; }
        }
        if (!found) fake_bad++;
      }
  } else fake_bad++;
}
static ncclResult_t post(int rank, struct call* c) {
  pthread_mutex_lock(&mu);
  struct round* r = &rounds[seqs[rank]++ % SLOTS];
  r->calls[rank] = *c;
  if (++r->n == nranks) { perform(r); r->done = 1; pthread_cond_broadcast(&cv); }
  while (!r->done) pthread_cond_wait(&cv, &mu);
  if (++r->left == nranks) { r->n = r->left = r->done = 0; }
  pthread_mutex_unlock(&mu);
  return 0;
}
ncclResult_t ncclGetVersion(int* v) { *v = 22304; return 0; }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { memset(id, 1, sizeof *id); return 0; }
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int n, ncclUniqueId id, int rank) { return 5; }
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devs) {
  if (ndev > MAXR) return 4;
  nranks = ndev;
  memset(seqs, 0, sizeof seqs); memset(rounds, 0, sizeof rounds);
  for (int i = 0; i < ndev; i++) comm[i] = (ncclComm_t)(size_t)(0x1000 + i);
  return 0;
}
ncclResult_t ncclGroupStart(void) { in_group = 1; gcall.fn = 100; gcall.np = 0; gcall.count = 0; gcall.dt = 0; gcall.op = 0; return 0; }
ncclResult_t ncclGroupEnd(void) { in_group = 0; return gcall.np > 0 ? post(grank, &gcall) : 0; }
static ncclResult_t coll(int fn, const void* s, void* r, size_t n, int dt, int op, ncclComm_t c, void* st) {
  record(fn, c, n, dt, op, st);
  struct call k = { fn, s, r, n, dt, op, 0 };
  return post(rankof(c), &k);
}
ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, ncclComm_t c, void* st) { return coll(7, s, r, n, dt, op, c, st); }
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, int dt, ncclComm_t c, void* st) { return coll(8, s, r, n, dt, 0, c, st); }
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, int dt, int op, ncclComm_t c, void* st) { return coll(9, s, r, n, dt, op, c, st); }
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, int dt, int root, ncclComm_t c, void* st) { return 5; }
static ncclResult_t p2p(int fn, void* b, size_t n, int dt, int peer, ncclComm_t c, void* st) {
  record(fn, c, n, dt, 0, st);
  if (!in_group || gcall.np >= 16) return 5; /* ncclInvalidUsage: ungrouped point-to-point */
  grank = rankof(c);
  struct p2p p = { fn == 11, peer, (char*)b, n * esz(dt) };
  gcall.ops[gcall.np++] = p;
  return 0;
}
ncclResult_t ncclSend(const void* s, size_t n, int dt, int peer, ncclComm_t c, void* st) { return p2p(11, (void*)s, n, dt, peer, c, st); }
ncclResult_t ncclRecv(void* r, size_t n, int dt, int peer, ncclComm_t c, void* st) { return p2p(12, r, n, dt, peer, c, st); }
ncclResult_t ncclCommDestroy(ncclComm_t c) { return 0; }
ncclResult_t ncclCommAbort(ncclComm_t c) { fake_aborts++; return 0; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) { *e = 0; return 0; }
const char* ncclGetErrorString(ncclResult_t r) { return "fake group error"; }
`

// TestCollectivesThroughNCCLBinding runs the CUDA backend's collective
// steps through the whole chain on two fake ranks: the backend on the fake
// driver, Comm.Collectives, the binding's purego calls into a gcc-built
// fake NCCL (loaded by nccl.Load through $FERRY_NCCL_LIB) that performs the
// collectives across the ranks of a CommInitAll group. The results match
// float64 references, every call was made on its rank's collective stream,
// with the element counts and types the layouts call for.
func TestCollectivesThroughNCCLBinding(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the fake NCCL cannot be built")
	}
	dir := t.TempDir()
	so := filepath.Join(dir, "libnccl.so.2")
	if err := os.WriteFile(filepath.Join(dir, "g.c"), []byte(groupNCCL), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-O1", "-shared", "-fPIC", "-pthread", "-o", so, filepath.Join(dir, "g.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	t.Setenv(nccl.LibEnv, so)
	l, err := nccl.Load()
	if err != nil {
		t.Fatal(err)
	}
	bs := cuda.FakeRanksForTest(t, 2)
	cs, err := l.CommInitAll([]int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	sq, outs := runNCCLRanks(t, bs, cs)
	sym := func(name string) unsafe.Pointer {
		p, err := l.Sym(name)
		if err != nil {
			t.Fatal(err)
		}
		return unsafe.Add(nil, p) // C memory of the loaded library
	}
	if bad := *(*int32)(sym("fake_bad")); bad != 0 {
		t.Fatalf("the fake NCCL saw %d mismatched or unsupported calls", bad)
	}
	for r := range 2 {
		check := func(what string, k int, want func(i int) float64) {
			t.Helper()
			got := outs[r][k]
			for i := range got.Type.Size() {
				// A reduction over 2 ranks of f32 values, rounded once
				// more than the float64 reference: an ulp or two, inside
				// mismatch's f32 tolerance (1e-5).
				if w := want(i); math.Abs(got.Float64At(i)-w) > 1e-5*math.Max(1, math.Abs(w)) {
					t.Fatalf("rank %d: %s: element %d is %v, want %v", r, what, i, got.Float64At(i), w)
				}
			}
		}
		check("all_reduce", 0, func(i int) float64 { return sq[0][i] + sq[1][i] })
		check("all_gather", 1, func(i int) float64 { row, col := i/8, i%8; return sq[col/4][row*4+col%4] })
		check("all_to_all", 2, func(i int) float64 { row, c := i/2, i%2; j, x := row/3, row%3; return sq[j][x*4+r*2+c] })
	}
	checkNCCLCalls(t, bs, sym)
}

// runNCCLRanks runs a program of an all_reduce, an all_gather and an
// all_to_all of x·x on two ranks at once, x random per rank, and returns
// each rank's x·x and results.
func runNCCLRanks(t *testing.T, bs []*cuda.Backend, cs []*nccl.Comm) (sq [][]float64, outs [][]*ir.Literal) {
	t.Helper()
	const src = `func @p(%0: f32[3,4]) -> (f32[3,4], f32[3,8], f32[6,2]) {
  %1 = mul(%0, %0) : f32[3,4]
  %2 = all_reduce(%1) {axis="x", reduction="sum", size=2} : f32[3,4]
  %3 = all_gather(%1) {axis="x", dimension=1, size=2, tiled=true} : f32[3,8]
  %4 = all_to_all(%1) {axis="x", concat_dimension=0, size=2, split_dimension=1} : f32[6,2]
  return %2, %3, %4
}`
	sq = make([][]float64, 2)
	outs = make([][]*ir.Literal, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		f, err := ir.Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		exe, err := bs[r].Compile(f, backend.CompileOptions{BoundAxes: []string{"x"}})
		if err != nil {
			t.Fatal(err)
		}
		in := ir.NewLiteral(ir.TypeOf(ir.Float32, 3, 4))
		rng := testseed.Rand(t, 1)
		for i := range 12 {
			v := float32(rng.Float64()*4 - 2)
			in.SetFloat64At(i, float64(v))
			sq[r] = append(sq[r], float64(v*v))
		}
		arg, err := bs[r].FromLiteral(in)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := exe.Execute([]trace.Buffer{arg}, backend.ExecOptions{DeviceComms: map[string]backend.DeviceCommunicator{"x": cs[r].Collectives()}})
			if err != nil {
				errs[r] = err
				return
			}
			for _, b := range res {
				lit, err := b.Literal()
				if err != nil {
					errs[r] = err
					return
				}
				outs[r] = append(outs[r], lit)
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return sq, outs
}

// checkNCCLCalls checks the calls the fake NCCL recorded: each on its
// rank's collective stream; all_reduce as 12 f32 (ncclFloat32 = 7) sums,
// all_gather as 48 bytes (ncclUint8 = 1), the all_to_all as one send and
// one receive of 24 bytes per peer.
func checkNCCLCalls(t *testing.T, bs []*cuda.Backend, sym func(string) unsafe.Pointer) {
	t.Helper()
	n := int(*(*int32)(sym("rec_n")))
	fns := unsafe.Slice((*int32)(sym("rec_fn")), n)
	ranks := unsafe.Slice((*int32)(sym("rec_rank")), n)
	streams := unsafe.Slice((*uint64)(sym("rec_stream")), n)
	counts := unsafe.Slice((*uint64)(sym("rec_count")), n)
	dts := unsafe.Slice((*int32)(sym("rec_dt")), n)
	perRank := map[int32]map[int32]int{0: {}, 1: {}}
	for i := range n {
		if want := bs[ranks[i]].CollectiveStreamForTest(); uintptr(streams[i]) != want {
			t.Errorf("call %d (fn %d, rank %d) on stream %#x, want the collective stream %#x", i, fns[i], ranks[i], streams[i], want)
		}
		wantCount, wantDT := map[int32]uint64{7: 12, 8: 48, 11: 24, 12: 24}[fns[i]], map[int32]int32{7: 7, 8: 1, 11: 1, 12: 1}[fns[i]]
		if counts[i] != wantCount || dts[i] != wantDT {
			t.Errorf("call %d (fn %d): count %d type %d, want %d and %d", i, fns[i], counts[i], dts[i], wantCount, wantDT)
		}
		perRank[ranks[i]][fns[i]]++
	}
	for r, m := range perRank {
		if m[7] != 1 || m[8] != 1 || m[11] != 2 || m[12] != 2 {
			t.Errorf("rank %d made calls %v, want one all-reduce (7), one all-gather (8), two sends (11) and two receives (12)", r, m)
		}
	}
}
