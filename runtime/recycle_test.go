package runtime

import (
	"math/rand/v2"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Pools recycle the records of freed buffers and arenas. A recycled record
// must describe its new allocation only: its name, type, site, array flag
// and size, whatever the record described before.
func TestRecycledRecordsDescribeNewAllocation(t *testing.T) {
	SetMemoryForTest(t, MemoryConfig{})
	r := rand.New(rand.NewPCG(rand.Uint64(), 11))
	n := 1 + r.IntN(50)
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = r.Float32()
	}
	double := Jit(func(x *trace.Array) *trace.Array { return trace.Add(x, x) }, WithName("double"))
	for range 5 {
		// Free records of several kinds: arrays of FromSlice (with a
		// site), jitted results, donated memory.
		a := FromSlice(xs, n)
		b := double(a)
		require.NoError(t, a.Delete())
		require.NoError(t, b.Delete())
	}
	_, _, line, _ := goruntime.Caller(0)
	y := double(FromSlice(make([]float32, 3), 3)) // the input is garbage; y is live
	live := LiveArrays()
	var found []LiveArray
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
	require.True(t, strings.HasSuffix(l.Site, "recycle_test.go:"+strconv.Itoa(line+1)), l.Site)
	want := make([]float32, 3)
	require.Equal(t, want, y.Float32s())
	require.NoError(t, y.Delete())
	for _, l := range LiveArrays() {
		require.NotEqual(t, "output 0 of double", l.What)
	}
}

// Memory handed out with a release function that may be called more than
// once (Pools.Alloc, donate) keeps its record: releasing it again, after the
// pool made other allocations, frees nothing of theirs.
func TestReleasedTwiceFreesNothingElse(t *testing.T) {
	SetMemoryForTest(t, MemoryConfig{})
	add := Jit(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) })
	x, y := FromSlice([]float32{1, 2}, 2), FromSlice([]float32{3, 4}, 2)
	base := deviceInUse()

	_, release, err := MemoryPools().Alloc(ir.Device, 100, "scratch")
	require.NoError(t, err)
	release()
	var keep []*trace.Array
	for range 4 {
		keep = append(keep, add(x, y)) // may take the scratch's chunk
	}
	release()
	require.Equal(t, base+4*64, deviceInUse())

	in, err := newBuffer(f32Literal(t, 1, 2, 3))
	require.NoError(t, err)
	_, rel, err := in.donate("x.go:1")
	require.NoError(t, err)
	rel()
	for range 4 {
		keep = append(keep, add(x, y))
	}
	rel()
	require.Equal(t, base+8*64, deviceInUse())
	require.Len(t, LiveArrays(), 2+8)
	for _, k := range keep {
		require.Equal(t, []float32{4, 6}, k.Float32s())
		require.NoError(t, k.Delete())
	}
	require.Equal(t, base, deviceInUse())
}

// A pool keeps at most maxSpareRecords freed records, and its statistics
// count every allocation whether its record was recycled or new.
func TestSpareRecordsBounded(t *testing.T) {
	SetMemoryForTest(t, MemoryConfig{})
	before := MemoryStats(ir.Device)
	var bufs []*cpuBuffer
	for range maxSpareRecords + 40 {
		b, err := newBuffer(f32Literal(t, 1))
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		require.NoError(t, b.Delete())
	}
	p, err := memPools.set().pool(ir.Device)
	require.NoError(t, err)
	p.mu.Lock()
	require.Equal(t, maxSpareRecords, p.nspare)
	p.mu.Unlock()
	for range 10 {
		b, err := newBuffer(f32Literal(t, 2))
		require.NoError(t, err)
		require.NoError(t, b.Delete())
	}
	after := MemoryStats(ir.Device)
	require.Equal(t, before.NumAllocs+int64(maxSpareRecords+50), after.NumAllocs)
	require.Equal(t, before.LiveAllocs, after.LiveAllocs)
	require.Equal(t, before.BytesInUse, after.BytesInUse)
}

// clearSmall zeroes every element of short and long slices alike.
func TestClearSmall(t *testing.T) {
	for _, n := range []int{0, 1, 8, 9, 40} {
		s := make([]*int, n)
		for i := range s {
			v := i
			s[i] = &v
		}
		clearSmall(s)
		for i := range s {
			require.Nil(t, s[i], "n=%d, element %d", n, i)
		}
	}
}
