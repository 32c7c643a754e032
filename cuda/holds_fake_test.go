package cuda

import (
	"runtime"
	"strings"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A CUDA buffer deleted while an execution holds it (backend.HoldArgs)
// keeps its device memory until the hold ends; a donation hold waits for
// the usage holds, and a buffer being donated cannot be held meanwhile.
func TestCUDAHoldsKeepMemory(t *testing.T) {
	_, d := newFakeCUDA(t)
	t.Setenv(rt.EnvDeviceMemory, "1MiB")
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	rng := testseed.Rand(t, 1)
	inUse := func() int64 {
		s, _ := b.MemoryStats(0, ir.Device)
		return s.BytesInUse
	}
	typ := ir.TypeOf(ir.Float32, 1+rng.IntN(1000))
	empty := inUse()
	buf, err := b.FromLiteral(randomLiteral(rng, typ))
	if err != nil {
		t.Fatal(err)
	}
	x := buf.(*Buffer)
	used := inUse()
	if err := backend.HoldArgs([]trace.Buffer{x}, nil, ""); err != nil {
		t.Fatal(err)
	}
	if err := x.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Literal(); err == nil {
		t.Fatal("a deleted buffer can be read")
	}
	if inUse() != used {
		t.Fatalf("a held buffer's memory was freed by Delete: %d bytes in use, want %d", inUse(), used)
	}
	backend.ReleaseArgs([]trace.Buffer{x}, nil)
	if inUse() != empty {
		t.Fatalf("the last hold did not free the memory: %d bytes in use, want %d", inUse(), empty)
	}

	buf, err = b.FromLiteral(randomLiteral(rng, typ))
	if err != nil {
		t.Fatal(err)
	}
	y := buf.(*Buffer)
	if err := y.Hold(false, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- y.Hold(true, "step.go:4") }()
	// The donation waits for the reader; until then, or after, no other
	// call holds the buffer.
	for !y.st.Donating() {
		runtime.Gosched()
	}
	if err := y.Hold(false, ""); err == nil || !strings.Contains(err.Error(), "being donated to a running call at step.go:4") {
		t.Fatalf("holding a buffer being donated: %v", err)
	}
	y.Unhold(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Deleted while the donating call holds it, which then fails: deleted
	// when the call lets go.
	if err := y.Delete(); err != nil {
		t.Fatal(err)
	}
	y.Unhold(true)
	if _, err := y.Literal(); err == nil {
		t.Fatal("a buffer deleted during a failed donation can be read")
	}
	if got := inUse(); got != empty {
		t.Fatalf("%d bytes in use after the failed donation, want %d", got, empty)
	}
}
