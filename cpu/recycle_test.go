package cpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/backend/ledger"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Memory handed out with a release function that may be called more than
// once (Pools.Alloc, donate) keeps its record: releasing it again, after the
// pool made other allocations, frees nothing of theirs.
func TestReleasedTwiceFreesNothingElse(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	add := func(x, y *trace.Array) *trace.Array { return addOnCPU(t, x, y) }
	x, y := fromSlice(t, []float32{1, 2}, 2), fromSlice(t, []float32{3, 4}, 2)
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

// A pool keeps at most ledger.MaxSpare freed records, and its statistics
// count every allocation whether its record was recycled or new.
func TestSpareRecordsBounded(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	before := MemoryStats(ir.Device)
	var bufs []*cpuBuffer
	for range ledger.MaxSpare + 40 {
		b, err := newBuffer(f32Literal(t, 1))
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		require.NoError(t, b.Delete())
	}
	p, err := memPools.set().pool(0, ir.Device)
	require.NoError(t, err)
	p.mu.Lock()
	require.Equal(t, ledger.MaxSpare, p.l.Spare())
	p.mu.Unlock()
	for range 10 {
		b, err := newBuffer(f32Literal(t, 2))
		require.NoError(t, err)
		require.NoError(t, b.Delete())
	}
	after := MemoryStats(ir.Device)
	require.Equal(t, before.NumAllocs+int64(ledger.MaxSpare+50), after.NumAllocs)
	require.Equal(t, before.LiveAllocs, after.LiveAllocs)
	require.Equal(t, before.BytesInUse, after.BytesInUse)
}
