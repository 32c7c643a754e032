package runtime_test

import (
	goruntime "runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// heapObjects returns the number of live heap objects after a full collection.
func heapObjects() uint64 {
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	return ms.HeapObjects
}

// A long chain of donated steps (x = step(x)) retains nothing per step: each
// result takes over the donated buffer's memory and release function instead
// of wrapping the donated buffer's releaser, so memory stays flat and the
// final Delete releases in O(1).
func TestDonationChainFlat(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	step := rt.Jit(func(x *trace.Array) *trace.Array {
		return trace.Add(trace.Mul(x, trace.Scalar(0.5)), trace.Scalar(1))
	}, rt.Donate(0))
	x := rt.FromSlice([]float32{2, 4, 6, 8}, 4)
	const warm, steps = 2000, 100_000
	for range warm {
		x = step(x)
	}
	before := heapObjects()
	for range steps {
		x = step(x)
	}
	after := heapObjects()
	t.Logf("heap objects: %d after warm-up, %d after %d more steps", before, after, steps)
	// Before the fix every step kept two objects (a releaser and the closure
	// over the previous one): 200,000 here.
	require.Less(t, int64(after)-int64(before), int64(steps/100), "heap objects grow with the number of donated steps")
	require.Equal(t, []float32{2, 2, 2, 2}, x.Float32s()) // fixed point of x/2+1
	require.NoError(t, x.Delete())
	require.Zero(t, rt.MemoryStats(ir.Device).BytesInUse)
}
