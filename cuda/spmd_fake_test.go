//go:build linux && (amd64 || arm64)

package cuda

import (
	"bytes"
	"math"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// fakeRuntime makes a backend over a fake driver of n devices (slabs
// capped by FERRY_DEVICE_MEMORY=mem) the runtime's default backend, with a
// fake NCCL as the maker of its device communicators, for the test.
func fakeRuntime(t *testing.T, n int, mem string) (*fakeCUDA, *Backend, *fakeMaker) {
	t.Helper()
	t.Setenv(backend.EnvBackend, "")
	fake, b := fakeDevices(t, n, mem, func(i, j int) bool { return true })
	prev, prevMaker := backend.Lookup("cuda"), backend.DeviceCommMakerFor("cuda")
	maker := &fakeMaker{f: fake}
	rt.RegisterBackend(b)
	backend.RegisterDeviceCommMaker("cuda", maker)
	t.Cleanup(func() {
		backend.Unregister(b)
		if prev != nil {
			rt.RegisterBackend(prev)
		}
		backend.RegisterDeviceCommMaker("cuda", prevMaker)
	})
	if rt.DefaultBackend() != rt.Backend(b) || len(rt.Devices()) != n {
		t.Fatalf("the CUDA backend is not the default with %d devices: %v", n, rt.Devices())
	}
	return fake, b, maker
}

func mesh(t *testing.T, shape []int, names []string, spec ir.PartitionSpec) *ir.NamedSharding {
	t.Helper()
	m, err := ir.NewMesh(shape, names)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ir.NewNamedSharding(m, spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Sharded initialisers on the devices of one process: an f32[256, 64]
// matrix generated straight into its blocks on 4 GPUs (rows over a mesh of
// 4; rows and columns over 2×2), as examples/init does on CPU devices.
// Each device's peak, above what it held before, is at most 1.05 × its
// block (no device builds the whole matrix), each holds its block, and the
// gathered values are bit-identical to the unsharded init's on one device.
func TestShardedInitOnDevices(t *testing.T) {
	fake, b, _ := fakeRuntime(t, 4, "16MiB")
	const rows, cols = 256, 64
	key := random.NewKey(testseed.Rand(t, 4).Uint64())
	layouts := map[string]*ir.NamedSharding{
		"4":   mesh(t, []int{4}, []string{"x"}, ir.P("x", "")),
		"2x2": mesh(t, []int{2, 2}, []string{"x", "y"}, ir.P("x", "y")),
	}
	for _, in := range []struct {
		name string
		init nn.Initializer
	}{{"lecun", nn.LecunNormal}, {"zeros", nn.Zeros}} {
		fn := func(k *trace.Array) *trace.Array { return in.init(k, ir.Float32, ir.Shape{rows, cols}) }
		want, err := rt.Jit(fn)(key).Literal()
		if err != nil {
			t.Fatal(err)
		}
		for name, sh := range layouts {
			// The key, replicated on the mesh's devices beforehand, is used
			// in place: the call allocates nothing but the program's.
			keys, err := rt.DevicePut(key, mesh(t, sh.Mesh.Shape(), sh.Mesh.AxisNames(), ir.P()))
			if err != nil {
				t.Fatal(err)
			}
			js := rt.Jit(fn, rt.OutShardings(sh))
			if err := js(keys).Delete(); err != nil { // compiled and loaded on every device
				t.Fatal(err)
			}
			var base [4]int64
			for d := range base {
				s, _ := b.MemoryStats(d, ir.Device)
				base[d] = s.BytesInUse
			}
			b.ResetPeak()
			out := js(keys)
			const shard = rows * cols * 4 / 4
			shards, err := rt.Shards(out)
			if err != nil || len(shards) != 4 {
				t.Fatalf("%s %s: %d shards, %v", in.name, name, len(shards), err)
			}
			for d := range base {
				s, _ := b.MemoryStats(d, ir.Device)
				peak := s.PeakBytesInUse - base[d]
				if peak < shard || float64(peak) > 1.05*shard || shards[d].Array.Type().Bytes() != shard {
					t.Errorf("%s %s: device %d peak %d bytes above its %d before, block %d bytes: want between %d and 1.05×", in.name, name, d, peak, base[d], shards[d].Array.Type().Bytes(), shard)
				}
				if dev, _ := rt.DeviceOf(shards[d].Array); dev.ID != d {
					t.Errorf("%s %s: block %d on %v", in.name, name, d, dev)
				}
			}
			got, err := out.Literal()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Data, want.Data) {
				t.Errorf("%s %s: the sharded values differ from the unsharded init's", in.name, name)
			}
			_ = out.Delete()
			_ = keys.Delete()
		}
	}
	checkFake(t, fake)
}

// mlpLoss is the mean squared error of a two-layer MLP, tanh(x·w1)·w2
// against y.
func mlpLoss(w1, w2, x, y *trace.Array) *trace.Array {
	d := trace.Sub(trace.MatMul(trace.Tanh(trace.MatMul(x, w1)), w2), y)
	return trace.Mean(trace.Mul(d, d))
}

// sgdStep is one SGD step of mlpLoss: the parameters after it.
func sgdStep(w1, w2, x, y *trace.Array) (*trace.Array, *trace.Array) {
	g := trace.Grad(func(p []*trace.Array) *trace.Array { return mlpLoss(p[0], p[1], x, y) })([]*trace.Array{w1, w2})
	lr := trace.Scalar(0.1)
	return trace.Sub(w1, trace.Mul(lr, g[0])), trace.Sub(w2, trace.Mul(lr, g[1]))
}

// Data-, tensor- and FSDP-style parallel training steps of an MLP on 4 GPUs
// of one process, each against the same steps on one device: the batch
// split over "data" (gradients all-reduced); w1 split by columns and w2 by
// rows over "model" (one all-reduce of the partial products); every
// parameter and the batch split by rows over "fsdp" (parameters gathered
// for the products, gradients reduced back to their blocks). The
// communicators are one ncclCommInitAll group over the 4 devices, each
// rank's collectives on its own device's stream and memory.
func TestParallelStepsOnDevices(t *testing.T) {
	fake, _, maker := fakeRuntime(t, 4, "16MiB")
	rng := testseed.Rand(t, 5)
	rnd := func(shape ...int) *trace.Array {
		v := make([]float32, ir.Shape(shape).Size())
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 0.5)
		}
		return trace.Const(v, shape...)
	}
	w1, w2, x, y := rnd(8, 16), rnd(16, 4), rnd(32, 8), rnd(32, 4)
	rep := func(axis string) *ir.NamedSharding { return mesh(t, []int{4}, []string{axis}, ir.P()) }
	rows := func(axis string) *ir.NamedSharding { return mesh(t, []int{4}, []string{axis}, ir.P(axis, "")) }
	cols := func(axis string) *ir.NamedSharding { return mesh(t, []int{4}, []string{axis}, ir.P("", axis)) }
	cases := []struct {
		name string
		in   []*ir.NamedSharding
		coll string // a collective the steps must run
	}{
		{"dp", []*ir.NamedSharding{rep("data"), rep("data"), rows("data"), rows("data")}, "ncclAllReduce"},
		{"tp", []*ir.NamedSharding{cols("model"), rows("model"), rep("model"), rep("model")}, "ncclAllReduce"},
		{"fsdp", []*ir.NamedSharding{rows("fsdp"), rows("fsdp"), rows("fsdp"), rows("fsdp")}, "ncclAllGather"},
	}
	w1u, w2u := w1, w2
	one := rt.Jit(sgdStep)
	for range 2 {
		w1u, w2u = one(w1u, w2u, x, y)
	}
	want := [2][]float64{w1u.Float64s(), w2u.Float64s()}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			step := rt.NewJitted(sgdStep, rt.InShardings(c.in...), rt.OutShardings(c.in[0], c.in[1]))
			inits := len(maker.inits)
			args := []*trace.Array{w1, w2, x, y}
			for i, a := range args {
				var err error
				if args[i], err = rt.DevicePut(a, c.in[i]); err != nil {
					t.Fatal(err)
				}
			}
			a, bb := args[0], args[1]
			for range 2 {
				a, bb = step.Fn()(a, bb, args[2], args[3])
			}
			checkFake(t, fake)
			for k, got := range [][]float64{a.Float64s(), bb.Float64s()} {
				for i := range got {
					// The partial sums of the gradients are reduced across the
					// devices in another order than on one device (and NVRTC
					// may contract the products into FMAs): f32 rounding
					// differences of a few ulps of the gradients' terms,
					// amplified by nothing over two steps of lr 0.1.
					if math.Abs(got[i]-want[k][i]) > 1e-5*(1+math.Abs(want[k][i])) {
						t.Fatalf("parameter %d element %d: %v on 4 devices, %v on one", k, i, got[i], want[k][i])
					}
				}
			}
			if len(maker.inits) == inits {
				t.Fatal("no device communicators were made")
			}
			for _, devs := range maker.inits[inits:] {
				if len(devs) != 4 {
					t.Fatalf("a communicator group over devices %v, want the mesh's 4", devs)
				}
			}
			ran := map[string]int{}
			for _, g := range maker.groups[inits:] {
				g.mu.Lock()
				for _, call := range g.calls {
					ran[call.fn]++
				}
				g.mu.Unlock()
			}
			if ran[c.coll] == 0 {
				t.Fatalf("the steps ran collectives %v, want %s among them", ran, c.coll)
			}
			t.Logf("collectives: %v", ran)
		})
	}
}

// rt.ToDevice between two GPUs copies peer to peer (no host literal), and
// a jitted call on the copy runs on its device.
func TestToDeviceBetweenGPUs(t *testing.T) {
	fake, b, _ := fakeRuntime(t, 2, "4MiB")
	rng := testseed.Rand(t, 6)
	l := randomLiteral(rng, ir.TypeOf(ir.Float32, 9, 7))
	x, err := rt.FromLiteralOn(l, rt.Devices()[0])
	if err != nil {
		t.Fatal(err)
	}
	y, err := rt.ToDevice(x, rt.Devices()[1])
	if err != nil {
		t.Fatal(err)
	}
	if fake.peerCopies != 1 {
		t.Fatalf("%d peer copies, want 1", fake.peerCopies)
	}
	if d, _ := rt.DeviceOf(y); d.ID != 1 || !rt.IsCommitted(y) {
		t.Fatalf("copy on %v", d)
	}
	z := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Mul(a, a) })(y)
	if d, _ := rt.DeviceOf(z); d.ID != 1 {
		t.Fatalf("result on %v, want cuda:1", d)
	}
	got := z.Float64s()
	for i := range got {
		v := float64(float32(l.Float64At(i) * l.Float64At(i)))
		if got[i] != v {
			t.Fatalf("element %d: %v, want %v", i, got[i], v)
		}
	}
	if s, _ := b.MemoryStats(0, ir.Device); s.LiveAllocs != 1 {
		t.Fatalf("device 0 holds %d allocations, want the original only", s.LiveAllocs)
	}
	checkFake(t, fake)
}
