package cpu

import (
	"errors"
	"github.com/ferryml/ferry/backend"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

func deviceInUse() int64 { return MemoryStats(ir.Device).BytesInUse }

func waitInUse(t *testing.T, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for deviceInUse() != want {
		if time.Now().After(deadline) {
			t.Fatalf("BytesInUse = %d, want %d", deviceInUse(), want)
		}
		goruntime.GC()
		time.Sleep(time.Millisecond)
	}
}

func f32Literal(t *testing.T, v ...float32) *ir.Literal {
	l, err := ir.LiteralOf(ir.Shape{len(v)}, v)
	require.NoError(t, err)
	return l
}

func TestBufferCopiesIntoPool(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	src := f32Literal(t, 1, 2, 3)
	b, err := newBuffer(src)
	require.NoError(t, err)
	src.Data[0] = 9 // the buffer owns a copy
	l, err := b.Literal()
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2, 3}, ir.View[float32](l))
	require.Zero(t, addrOf(l.Data)%allocAlign)
	require.Equal(t, int64(64), deviceInUse())
	_, err = newBuffer(&ir.Literal{Type: ir.TypeOf(ir.Float32, 2), Data: make([]byte, 3)})
	require.Error(t, err)
	// Zero-size arrays hold no pool memory.
	z, err := newBuffer(&ir.Literal{Type: ir.TypeOf(ir.Float32, 0), Data: []byte{}})
	require.NoError(t, err)
	zl, err := z.Literal()
	require.NoError(t, err)
	require.Empty(t, zl.Data)
	require.NoError(t, b.Delete())
	require.NoError(t, z.Delete())
	require.Zero(t, deviceInUse())
}

func TestMarkDonated(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	b, err := newBuffer(f32Literal(t, 1, 2))
	require.NoError(t, err)
	b.markDonated("model_test.go:42")
	require.Zero(t, deviceInUse())
	_, err = b.Literal()
	require.ErrorIs(t, err, backend.ErrDonated)
	require.NotErrorIs(t, err, backend.ErrDeleted)
	require.ErrorContains(t, err, "f32[2] was donated at model_test.go:42")
	a := trace.FromBuffer(b)
	require.Contains(t, a.String(), "donated at model_test.go:42")
	require.NoError(t, a.Delete()) // no-op
	b.markDonated("again.go:1")    // no-op
	_, err = b.Literal()
	require.ErrorContains(t, err, "model_test.go:42")
	_, _, err = b.donate("x.go:1")
	require.ErrorIs(t, err, backend.ErrDonated)
}

// An executor reuses a donated argument's memory for a result.
func TestDonateToResult(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	in, err := newBuffer(f32Literal(t, 1, 2, 3, 4))
	require.NoError(t, err)
	inLit, _ := in.Literal()
	mem, release, err := in.donate("train.go:7")
	require.NoError(t, err)
	require.Equal(t, addrOf(inLit.Data), addrOf(mem))
	require.Equal(t, int64(64), deviceInUse()) // not freed: handed over
	out := newPoolBuffer(&ir.Literal{Type: ir.TypeOf(ir.Int32, 2, 2), Data: mem}, release, "train.go:7")
	live := LiveArrays()
	require.Len(t, live, 1)
	require.Equal(t, "i32[2,2]", live[0].Type.String())
	require.Equal(t, "train.go:7", live[0].Site)
	_, err = in.Literal()
	require.ErrorIs(t, err, backend.ErrDonated)
	// Dropping the input changes nothing; dropping the result frees the memory.
	in, inLit = nil, nil
	_ = in
	_ = inLit
	goruntime.GC()
	require.Equal(t, int64(64), deviceInUse())
	goruntime.KeepAlive(out)
	out = nil
	waitInUse(t, 0)
}

// An executor allocates its outputs with Pools.Alloc and wraps them.
func TestExecutorOutputs(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	_, file, line, _ := goruntime.Caller(0)
	mem, release, err := MemoryPools().Alloc(ir.Device, 24, "output 0 of f")
	require.NoError(t, err)
	copy(ir.ViewBytes[float32](mem), []float32{1, 2, 3, 4, 5, 6})
	b := newPoolBuffer(&ir.Literal{Type: ir.TypeOf(ir.Float32, 2, 3), Data: mem}, release, "")
	live := LiveArrays()
	require.Len(t, live, 1)
	require.Equal(t, "f32[2,3]", live[0].Type.String())
	require.Equal(t, "output 0 of f", live[0].What)
	require.True(t, strings.HasSuffix(file, live[0].Site[:strings.LastIndexByte(live[0].Site, ':')]))
	require.True(t, strings.HasSuffix(live[0].Site, ":"+strconv.Itoa(line+1)), live[0].Site)
	a := trace.FromBuffer(b)
	require.Equal(t, []float32{1, 2, 3, 4, 5, 6}, a.Float32s())
	require.NoError(t, a.Delete())
	require.Zero(t, deviceInUse())
	// Memory from elsewhere: release is called when the buffer is freed.
	called := 0
	f := newPoolBuffer(f32Literal(t, 1), func() { called++ }, "x.go:1")
	require.NoError(t, f.Delete())
	require.NoError(t, f.Delete())
	require.Equal(t, 1, called)
}

func TestCPUBufferCarriesOOM(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{Capacity: 1024, Fraction: 1})
	b := newCPUBuffer(&ir.Literal{Type: ir.TypeOf(ir.Float32, 1000), Data: make([]byte, 4000)})
	_, err := b.Literal()
	var oom *backend.OutOfMemoryError
	require.True(t, errors.As(err, &oom))
	require.Equal(t, int64(4000), oom.Requested)
	require.NoError(t, b.Delete())
	_, _, err = b.donate("x.go:1")
	require.ErrorAs(t, err, &oom)
}

// The cleanup is on the literal: a caller still holding the literal keeps
// the memory, even after the buffer itself is garbage.
func TestLiteralKeepsMemory(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	b, err := newBuffer(f32Literal(t, 5, 6))
	require.NoError(t, err)
	l, err := b.Literal()
	require.NoError(t, err)
	b = nil
	_ = b
	for i := 0; i < 3; i++ {
		goruntime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, int64(64), deviceInUse())
	require.Equal(t, []float32{5, 6}, ir.View[float32](l))
	goruntime.KeepAlive(l)
	l = nil
	waitInUse(t, 0)
}

// executorAllocator is cpu/cpuexec's Allocator interface.
type executorAllocator interface {
	Alloc(space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error)
}

var (
	_ executorAllocator = MemoryPools()
	_ executorAllocator = (*execAlloc)(nil)
)

// The pools as one execution's allocator: outputs and arenas are named after
// the function, their call site is the user's line, the records of outputs
// become arrays' and the rest is released when the execution ends.
func TestExecAllocator(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{Capacity: 1 << 20, Fraction: 1})
	a := &execAlloc{exe: &cpuExecutable{suffix: " of train_step"}}
	var ea executorAllocator = a
	_, file, line, _ := goruntime.Caller(0)
	out, rel, err := ea.Alloc(ir.Device, 1000, "output 0")
	require.NoError(t, err)
	rel() // allocates and frees nothing: the execution's owner releases
	_, _, err = ea.Alloc(ir.Device, 2<<20, "temp arena")
	var oom *backend.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Equal(t, "temp arena of train_step", oom.What)
	require.Len(t, oom.Largest, 1)
	require.Equal(t, "output 0 of train_step", oom.Largest[0].What)
	require.True(t, strings.HasSuffix(file, strings.Split(oom.Largest[0].Site, ":")[0]))
	require.True(t, strings.HasSuffix(oom.Largest[0].Site, ":"+strconv.Itoa(line+1)))
	_, _, err = ea.Alloc(ir.Device, 4096, "temp arena")
	require.NoError(t, err)
	require.Equal(t, int64(1024+4096), deviceInUse())
	require.Empty(t, LiveArrays()) // scratch until wrapped as an array

	rec := a.claim(out)
	require.NotNil(t, rec)
	require.Nil(t, a.claim(out), "claimed once")
	b := &cpuBuffer{lit: ir.Literal{Type: ir.TypeOf(ir.Uint8, 1000), Data: out}}
	rec.setArray(b.lit.Type, "")
	b.wrapRecord(rec)
	a.releaseAll() // the arena, not the claimed output
	require.Equal(t, int64(1024), deviceInUse())
	require.Len(t, LiveArrays(), 1)
	require.NoError(t, b.Delete())
	require.Zero(t, deviceInUse())
}

// An executable names its allocations after itself once per kind of
// allocation: the names are right on every call, from several goroutines,
// with a function name or without, and the cache stays bounded.
func TestExecutableAllocNames(t *testing.T) {
	e := &cpuExecutable{suffix: " of train_step"}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				what := "output " + strconv.Itoa((i+g)%5)
				require.Equal(t, what+" of train_step", e.name(what))
				require.Equal(t, "temp arena of train_step", e.name("temp arena"))
			}
		}()
	}
	wg.Wait()
	require.Len(t, *e.names.Load(), 6)
	for i := range 2 * maxAllocNames {
		what := "carry " + strconv.Itoa(i)
		require.Equal(t, what+" of train_step", e.name(what))
	}
	require.Len(t, *e.names.Load(), maxAllocNames)
	anon := &cpuExecutable{}
	require.Equal(t, "output 0", anon.name("output 0"))
	require.Nil(t, anon.names.Load())
}

// A cached call allocates a result array, its buffer and a pool record;
// the buffer and the record stay within the 128- and 144-byte size
// classes (sizes a field added without thought would push up).
func TestDispatchObjectSizes(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(cpuBuffer{}), uintptr(128))
	require.LessOrEqual(t, unsafe.Sizeof(allocRecord{}), uintptr(144))
}
