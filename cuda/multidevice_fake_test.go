//go:build linux && (amd64 || arm64)

package cuda

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// fakeDevices returns a backend over a fake driver with n devices of 1 GiB
// each (slabs capped by FERRY_DEVICE_MEMORY=mem), that runs the kernels it
// launches, with peer access where peer says.
func fakeDevices(t *testing.T, n int, mem string, peer func(i, j int) bool) (*fakeCUDA, *Backend) {
	t.Helper()
	fake, d := newFakeCUDA(t)
	fake.withDevices(n, 1<<30, peer)
	fake.executeKernels(t)
	t.Setenv(rt.EnvDeviceMemory, mem)
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	return fake, b
}

// checkFake fails t when the fake driver recorded a violation: a call on a
// device whose context was not current, a stream or memory of another
// device.
func checkFake(t *testing.T, fake *fakeCUDA) {
	t.Helper()
	if v, _, _ := fake.snapshot(); len(v) > 0 {
		t.Fatalf("%d violations, first: %s", len(v), v[0])
	}
}

const addMulSrc = `func @f(%0: f32[6,5], %1: f32[6,5]) -> (f32[6,5]) {
  %2 = add(%0, %1) : f32[6,5]
  %3 = mul(%2, %0) : f32[6,5]
  return %3
}`

// Every device the driver reports is a device of the backend, with its own
// context, streams and slab (FERRY_MEM_FRACTION of FERRY_DEVICE_MEMORY on
// each); a program compiled once runs on the device of its arguments, from
// goroutines on all devices at once, each call's driver work in that
// device's context; results stay on their device, committed when asked.
func TestMultiDeviceExecute(t *testing.T) {
	t.Setenv(rt.EnvMemFraction, "0.5")
	const n = 4
	fake, b := fakeDevices(t, n, "8MiB", nil)
	devs := b.Devices()
	if len(devs) != n {
		t.Fatalf("Devices() = %v, want %d", devs, n)
	}
	for i, dv := range devs {
		s, ok := b.MemoryStats(i, ir.Device)
		if dv.ID != i || !ok || s.Limit != 4<<20 || s.Device != i {
			t.Fatalf("device %d: %v, stats %+v", i, dv, s)
		}
		// The slab (4 MiB) and cuBLASLt's nothing: each device holds its own.
		if used := fake.used(i); used != 4<<20 {
			t.Fatalf("device %d: the fake holds %d bytes of it, want the 4 MiB slab", i, used)
		}
	}
	if _, err := b.Device(n); err == nil || !strings.Contains(err.Error(), "cuda:4") {
		t.Fatalf("Device(%d): %v", n, err)
	}
	f, err := ir.Parse(addMulSrc)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := b.Compile(f, backend.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rng := testseed.Rand(t, 1)
	typ := ir.TypeOf(ir.Float32, 6, 5)
	var wg sync.WaitGroup
	errs := make([]error, n)
	ins := make([][]*ir.Literal, n)
	outs := make([]trace.Buffer, n)
	for dev := range n {
		ins[dev] = []*ir.Literal{randomLiteral(rng, typ), randomLiteral(rng, typ)}
	}
	for dev := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var args []trace.Buffer
			for _, l := range ins[dev] {
				x, err := b.FromLiteralOn(l, dev)
				if err != nil {
					errs[dev] = err
					return
				}
				args = append(args, x)
			}
			res, err := exe.Execute(args, backend.ExecOptions{Device: dev, Commit: dev%2 == 1})
			if err != nil {
				errs[dev] = err
				return
			}
			outs[dev] = res[0]
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	checkFake(t, fake)
	for dev := range n {
		x := outs[dev].(*Buffer)
		if x.Device() != dev || x.Committed() != (dev%2 == 1) {
			t.Fatalf("result on device %d committed %v, want %d, %v", x.Device(), x.Committed(), dev, dev%2 == 1)
		}
		want, err := eval.Run(f, ins[dev])
		if err != nil {
			t.Fatal(err)
		}
		got, err := x.Literal()
		if err != nil {
			t.Fatal(err)
		}
		// add then mul: NVRTC may contract them into one FMA (one rounding
		// instead of two), so the result may differ from eval's by an ulp.
		compare(t, "device result", got, want[0])
		if s, _ := b.MemoryStats(dev, ir.Device); s.LiveAllocs != 3 {
			t.Fatalf("device %d holds %d live allocations, want its 2 arguments and result", dev, s.LiveAllocs)
		}
	}
	// The modules were compiled once and loaded into each device's context.
	if c := fake.calls["cuModuleLoadData"]; c != n*len(exe.(*executable).steps) {
		t.Fatalf("%d module loads for %d devices of %d steps", c, n, len(exe.(*executable).steps))
	}
	// An argument on another device than the call's is refused.
	y, err := b.FromLiteralOn(ins[0][0], 1)
	if err != nil {
		t.Fatal(err)
	}
	z, _ := b.FromLiteralOn(ins[0][1], 0)
	if _, err := exe.Execute([]trace.Buffer{y, z}, backend.ExecOptions{}); err == nil || !strings.Contains(err.Error(), "cuda:1") {
		t.Fatalf("an argument on cuda:1 for a call on cuda:0: %v", err)
	}
}

// CopyToDevice moves an array between two GPUs: one cuMemcpyPeerAsync when
// peer access is on, through pinned host memory when it is off; the copy
// is committed to its device and equal to the original.
func TestCopyBetweenDevices(t *testing.T) {
	for _, peer := range []bool{true, false} {
		t.Run(map[bool]string{true: "peer", false: "host"}[peer], func(t *testing.T) {
			fake, b := fakeDevices(t, 3, "4MiB", func(i, j int) bool { return peer })
			rng := testseed.Rand(t, 2)
			l := randomLiteral(rng, ir.TypeOf(ir.Float32, 37, 3))
			x, err := b.FromLiteralOn(l, 0)
			if err != nil {
				t.Fatal(err)
			}
			y, err := x.(*Buffer).CopyToDevice(2)
			if err != nil {
				t.Fatal(err)
			}
			checkFake(t, fake)
			if y.(*Buffer).Device() != 2 || !y.(*Buffer).Committed() {
				t.Fatalf("copy on device %d", y.(*Buffer).Device())
			}
			got, err := y.Literal()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Data, l.Data) {
				t.Fatal("the copy differs from the original")
			}
			if want := map[bool]int{true: 1, false: 0}[peer]; fake.peerCopies != want {
				t.Fatalf("%d peer copies, want %d", fake.peerCopies, want)
			}
			s1, _ := b.MemoryStats(1, ir.Device)
			s2, _ := b.MemoryStats(2, ir.Device)
			if s1.BytesInUse != 0 || s2.BytesInUse != 512 {
				t.Fatalf("devices 1 and 2 hold %d and %d bytes, want 0 and 512", s1.BytesInUse, s2.BytesInUse)
			}
		})
	}
}

// An allocation that does not fit device 1's slab fails with an
// out-of-memory error naming cuda:1 and listing its arrays only; the other
// devices' memory is untouched and still serves.
func TestOutOfMemoryOnOneDevice(t *testing.T) {
	fake, b := fakeDevices(t, 3, "1MiB", nil) // slabs of 768 KiB
	rng := testseed.Rand(t, 3)
	small := randomLiteral(rng, ir.TypeOf(ir.Float32, 1000))
	if _, err := b.FromLiteralOn(small, 0); err != nil {
		t.Fatal(err)
	}
	big := ir.NewLiteral(ir.TypeOf(ir.Float32, 150000)) // 600 KB
	if _, err := b.FromLiteralOn(big, 1); err != nil {
		t.Fatal(err)
	}
	before := [3]backend.MemStats{}
	for i := range before {
		before[i], _ = b.MemoryStats(i, ir.Device)
	}
	_, err := b.FromLiteralOn(big, 1)
	var oom *backend.OutOfMemoryError
	if !errors.As(err, &oom) || oom.Device != 1 || !strings.Contains(err.Error(), "of cuda:1") {
		t.Fatalf("got %v, want an out-of-memory error of cuda:1", err)
	}
	if len(oom.Largest) != 1 || oom.Largest[0].Bytes != 600000 {
		t.Fatalf("the report lists %+v, want device 1's one array", oom.Largest)
	}
	for i := range before {
		s, _ := b.MemoryStats(i, ir.Device)
		if s.BytesInUse != before[i].BytesInUse || s.PeakBytesInUse != before[i].PeakBytesInUse {
			t.Fatalf("device %d: %d bytes in use (peak %d) after device 1's failure, %d (%d) before", i, s.BytesInUse, s.PeakBytesInUse, before[i].BytesInUse, before[i].PeakBytesInUse)
		}
	}
	if _, err := b.FromLiteralOn(big, 2); err != nil {
		t.Fatalf("device 2 after device 1's failure: %v", err)
	}
	checkFake(t, fake)
}

// With FERRY_PREALLOCATE=false no device reserves a slab: each buffer is
// allocated as it comes, and each device stops at its own limit,
// FERRY_MEM_FRACTION of its memory (here of FERRY_DEVICE_MEMORY), with an
// out-of-memory error naming it.
func TestNoPreallocationPerDevice(t *testing.T) {
	t.Setenv(rt.EnvPreallocate, "false")
	t.Setenv(rt.EnvMemFraction, "0.5")
	fake, b := fakeDevices(t, 2, "2MiB", nil) // a limit of 1 MiB each
	for i := range 2 {
		if used := fake.used(i); used != 0 {
			t.Fatalf("device %d: %d bytes reserved up front", i, used)
		}
		if s, _ := b.MemoryStats(i, ir.Device); s.Limit != 1<<20 {
			t.Fatalf("device %d: limit %d, want 1 MiB", i, s.Limit)
		}
	}
	big := ir.NewLiteral(ir.TypeOf(ir.Float32, 200000)) // 800 KB
	if _, err := b.FromLiteralOn(big, 0); err != nil {
		t.Fatal(err)
	}
	if used := fake.used(0); used != 800000 {
		t.Fatalf("device 0 holds %d bytes, want the array's 800000", used)
	}
	_, err := b.FromLiteralOn(big, 0)
	var oom *backend.OutOfMemoryError
	if !errors.As(err, &oom) || oom.Device != 0 || !strings.Contains(err.Error(), "of cuda:0") {
		t.Fatalf("a second array on device 0: %v, want an out-of-memory error of cuda:0", err)
	}
	if _, err := b.FromLiteralOn(big, 1); err != nil {
		t.Fatalf("device 1, with its own limit: %v", err)
	}
	checkFake(t, fake)
}

// A driver without the peer entry points (optionalEntryPoints) still loads:
// no device enables peer access, and a copy between GPUs whose hardware
// would allow peer access goes through pinned host memory.
func TestCopyBetweenDevicesWithoutPeerEntryPoints(t *testing.T) {
	fake, d := newFakeCUDA(t)
	fake.withDevices(2, 1<<30, func(i, j int) bool { return true })
	fake.executeKernels(t)
	t.Setenv(rt.EnvDeviceMemory, "4MiB")
	for _, name := range optionalEntryPoints {
		delete(d.procs, name)
	}
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	l := randomLiteral(testseed.Rand(t, 3), ir.TypeOf(ir.Float32, 5, 7))
	x, err := b.FromLiteralOn(l, 0)
	if err != nil {
		t.Fatal(err)
	}
	y, err := x.(*Buffer).CopyToDevice(1)
	if err != nil {
		t.Fatal(err)
	}
	checkFake(t, fake)
	got, err := y.Literal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Data, l.Data) || fake.peerCopies != 0 {
		t.Fatalf("copy equal %v, %d peer copies (want equal, 0)", bytes.Equal(got.Data, l.Data), fake.peerCopies)
	}
}
