//go:build linux && (amd64 || arm64)

package cuda

import (
	"bytes"
	"errors"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
)

// cudaLive returns the runtime's live arrays held by the CUDA backend.
func cudaLive() []rt.LiveArray {
	var out []rt.LiveArray
	for _, l := range rt.LiveArrays() {
		if l.Platform == "cuda" {
			out = append(out, l)
		}
	}
	return out
}

// With a CUDA backend (over the fake driver) registered as the default, the
// runtime's MemoryStats, LiveArrays, out-of-memory report and memory profile
// describe its device slab: the bytes in use are the arrays' sizes rounded
// up to 256, the live arrays are those made here, with their types and this
// file as their site, and a request larger than the largest free range
// fails with an *rt.OutOfMemoryError listing the largest arrays.
func TestRuntimeReportsCUDAMemory(t *testing.T) {
	_, d := newFakeCUDA(t)
	t.Setenv(rt.EnvDeviceMemory, "1MiB") // slab: 0.75 MiB
	t.Setenv(backend.EnvBackend, "")
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	prev := backend.Lookup("cuda")
	rt.RegisterBackend(b)
	t.Cleanup(func() {
		backend.Unregister(b)
		if prev != nil {
			rt.RegisterBackend(prev)
		}
	})
	if rt.DefaultBackend() != rt.Backend(b) {
		t.Fatal("the CUDA backend is not the default")
	}
	const slab = 3 << 18
	rng := testseed.Rand(t, 9)
	var bufs []*Buffer
	var want, peak int64
	for range 6 {
		n := 1 + rng.IntN(10000)
		typ := ir.TypeOf(ir.Float32, n)
		buf, err := b.FromLiteral(randomLiteral(rng, typ))
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, buf.(*Buffer))
		want += (int64(4*n) + 255) / 256 * 256
		peak = max(peak, want)
	}
	s := rt.MemoryStats(ir.Device)
	if s.Platform != "cuda" || s.Allocator != "bfc" || s.BytesInUse != want || s.PeakBytesInUse != peak ||
		s.Limit != slab || s.LiveAllocs != int64(len(bufs)) || s.LargestFreeBlock != slab-want {
		t.Fatalf("MemoryStats = %+v, want cuda bfc in use %d of %d, %d live", s, want, slab, len(bufs))
	}
	live := cudaLive()
	if len(live) != len(bufs) {
		t.Fatalf("%d live CUDA arrays, want %d", len(live), len(bufs))
	}
	for i, l := range live {
		if i > 0 && l.Bytes > live[i-1].Bytes {
			t.Fatalf("live arrays not largest first: %v", live)
		}
		if l.Space != ir.Device || !l.IsArray || l.Bytes != l.Type.Bytes() || !strings.HasPrefix(l.Site, "cuda/memstats_test.go:") {
			t.Fatalf("live array %d = %+v", i, l)
		}
	}
	// Freeing lowers the bytes in use, not the peak; ResetPeakMemory does.
	freed := bufs[0].t.Bytes()
	if err := bufs[0].Delete(); err != nil {
		t.Fatal(err)
	}
	want -= (freed + 255) / 256 * 256
	if s := rt.MemoryStats(ir.Device); s.BytesInUse != want || s.PeakBytesInUse != peak || s.LiveAllocs != int64(len(bufs)-1) {
		t.Fatalf("after a free: %+v, want in use %d, peak %d", s, want, peak)
	}
	rt.ResetPeakMemory()
	if s := rt.MemoryStats(ir.Device); s.PeakBytesInUse != want {
		t.Fatalf("after ResetPeakMemory: peak %d, want %d", s.PeakBytesInUse, want)
	}
	// The memory profile has one sample per live buffer, labelled cuda.
	var pb bytes.Buffer
	if err := rt.SaveDeviceMemoryProfile(&pb); err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse(&pb)
	if err != nil {
		t.Fatal(err)
	}
	var cudaBytes int64
	for _, smp := range prof.Sample {
		if len(smp.Label["platform"]) == 1 && smp.Label["platform"][0] == "cuda" {
			cudaBytes += smp.Value[1]
		}
	}
	var liveBytes int64
	for _, l := range cudaLive() {
		liveBytes += l.Bytes
	}
	if cudaBytes != liveBytes {
		t.Fatalf("profile holds %d CUDA bytes, live arrays %d", cudaBytes, liveBytes)
	}
	// Out of memory: the runtime's report.
	_, err = b.FromLiteral(ir.NewLiteral(ir.TypeOf(ir.Float32, slab/4)))
	var oom *rt.OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("oversized allocation: %v, want *rt.OutOfMemoryError", err)
	}
	if oom.Platform != "cuda" || oom.Requested != slab || oom.InUse != want || oom.LiveAllocs != int64(len(bufs)-1) ||
		len(oom.Largest) != len(bufs)-1 || oom.Largest[0].Bytes != cudaLive()[0].Bytes {
		t.Fatalf("out-of-memory report %+v", oom)
	}
	if msg := oom.Error(); !strings.Contains(msg, "made at cuda/memstats_test.go:") {
		t.Fatalf("report does not name the arrays' site:\n%s", msg)
	}
	t.Log("\n" + oom.Error())
}
