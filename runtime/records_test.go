package runtime_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

func deviceInUse() int64 { return rt.MemoryStats(ir.Device).BytesInUse }

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

// A jitted result's literal points into its buffer: holding only the
// literal keeps the memory (and the values) after the array is dropped;
// dropping the literal too frees it. A deleted result is freed once, and
// collecting its buffer later frees nothing more.
func TestJitResultLiteralKeepsMemory(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	r := testseed.Rand(t, 7)
	xs, ys := make([]float32, 40), make([]float32, 40)
	for i := range xs {
		xs[i], ys[i] = r.Float32()*8-4, r.Float32()*8-4
	}
	x, y := rt.FromSlice(xs, 40), rt.FromSlice(ys, 40)
	inputs := deviceInUse()
	add := rt.Jit(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) })
	l, err := add(x, y).Literal()
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		goruntime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, inputs+192, deviceInUse())
	got := ir.View[float32](l)
	for i := range xs {
		require.Equal(t, float64(float32(float64(xs[i])+float64(ys[i]))), float64(got[i]))
	}
	goruntime.KeepAlive(l)
	l, got = nil, nil
	waitInUse(t, inputs)

	s := add(x, y)
	require.Equal(t, inputs+192, deviceInUse())
	require.NoError(t, s.Delete())
	require.Equal(t, inputs, deviceInUse())
	keep := add(x, y) // may reuse the freed chunk
	s = nil
	for i := 0; i < 3; i++ {
		goruntime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, inputs+192, deviceInUse(), "a deleted buffer's finalizer frees nothing")
	require.Len(t, rt.LiveArrays(), 3)
	goruntime.KeepAlive(keep)
	goruntime.KeepAlive(x)
	goruntime.KeepAlive(y)
}

// Pools recycle the records of freed buffers and arenas. A recycled record
// must describe its new allocation only: its name, type, site, array flag
// and size, whatever the record described before.
func TestRecycledRecordsDescribeNewAllocation(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	r := testseed.Rand(t, 11)
	n := 1 + r.IntN(50)
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = r.Float32()
	}
	double := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Add(x, x) }, rt.WithName("double"))
	for range 5 {
		// Free records of several kinds: arrays of FromSlice (with a
		// site), jitted results, donated memory.
		a := rt.FromSlice(xs, n)
		b := double(a)
		require.NoError(t, a.Delete())
		require.NoError(t, b.Delete())
	}
	_, _, line, _ := goruntime.Caller(0)
	y := double(rt.FromSlice(make([]float32, 3), 3)) // the input is garbage; y is live
	live := rt.LiveArrays()
	var found []rt.LiveArray
	for _, l := range live {
		if l.What == "output 0 of double" {
			found = append(found, l)
		}
	}
	require.Len(t, found, 1, "%+v", live)
	l := found[0]
	require.True(t, l.IsArray)
	require.Equal(t, "f32[3]", l.Type.String())
	require.Equal(t, int64(12), l.Bytes)
	require.True(t, strings.HasSuffix(l.Site, "records_test.go:"+strconv.Itoa(line+1)), l.Site)
	want := make([]float32, 3)
	require.Equal(t, want, y.Float32s())
	require.NoError(t, y.Delete())
	for _, l := range rt.LiveArrays() {
		require.NotEqual(t, "output 0 of double", l.What)
	}
}
