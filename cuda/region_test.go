//go:build linux && (amd64 || arm64)

package cuda

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// fakeBackend is a backend over the fake driver (without cuBLASLt, so
// every dot is a generated kernel); execute makes the fake run the kernels
// it launches (skipping the test without gcc).
func fakeBackend(t *testing.T, execute bool) (*fakeCUDA, *Backend) {
	t.Helper()
	fake, d := newFakeCUDA(t)
	t.Setenv(rt.EnvDeviceMemory, "64MiB")
	if execute {
		fake.executeKernels(t)
	}
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	return fake, b
}

// controlPrograms are the scan, while and cond programs the device
// lowering runs: forward and reverse scans with consts, carries, xs and
// ys, a scan over pinned_host xs writing pinned_host ys (the offload
// plan's per-iteration copies), a carry swap (results that overlap other
// results' destinations), nested control flow, while loops and conds.
var controlPrograms = []struct {
	name   string
	params []ir.Type
	fn     func(x []*trace.Array) []*trace.Array
}{
	{"scan", []ir.Type{f32t(4), f32t(4, 4), f32t(5, 4)}, func(x []*trace.Array) []*trace.Array {
		w := x[1] // a const of the body
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			n := trace.Tanh(trace.Add(trace.MatMul(w, c[0]), xs[0]))
			return []*trace.Array{n}, []*trace.Array{trace.Mul(n, xs[0]), trace.Sum(n)}
		}, []*trace.Array{x[0]}, []*trace.Array{x[2]})
		return append(c, ys...)
	}},
	{"scan_reverse", []ir.Type{f32t(3), f32t(6, 3), f32t(6, 3)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			n := trace.Add(trace.Mul(c[0], xs[0]), xs[1])
			return []*trace.Array{n}, []*trace.Array{trace.Exp(trace.Neg(trace.Mul(n, n)))}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1], x[2]}, trace.ScanReverse())
		return append(c, ys...)
	}},
	{"scan_offload", []ir.Type{f32t(4), f32t(5, 4).WithSpace(ir.PinnedHost)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			xd := trace.DevicePut(xs[0], ir.Device)
			n := trace.Sin(trace.Add(c[0], xd))
			return []*trace.Array{n}, []*trace.Array{trace.DevicePut(trace.Mul(n, xd), ir.PinnedHost)}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(c, ys...)
	}},
	{"scan_swap", []ir.Type{f32t(4), f32t(4), f32t(3, 4)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{c[1], c[0]}, []*trace.Array{c[0], xs[0]}
		}, []*trace.Array{x[0], x[1]}, []*trace.Array{x[2]})
		return append(c, ys...)
	}},
	{"scan_cond", []ir.Type{f32t(3), f32t(4, 3)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			r := trace.Cond(trace.Greater(trace.Sum(xs[0]), trace.Scalar(0)),
				func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Add(o[0], o[1])} },
				func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Mul(o[0], o[1])} },
				c[0], xs[0])
			return r, []*trace.Array{trace.Sum(r[0])}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(c, ys...)
	}},
	{"while", []ir.Type{f32t(4), f32t(4)}, func(x []*trace.Array) []*trace.Array {
		return trace.While(func(s []*trace.Array) *trace.Array {
			return trace.Less(s[0], trace.ScalarOf(7, ir.Int32))
		}, func(s []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Add(s[0], trace.ScalarOf(1, ir.Int32)), trace.Add(trace.Mul(s[1], x[1]), trace.Scalar(0.5))}
		}, trace.ScalarOf(0, ir.Int32), x[0])
	}},
	{"cond", []ir.Type{f32t(5), f32t(5)}, func(x []*trace.Array) []*trace.Array {
		return trace.Cond(trace.Greater(trace.Sum(x[0]), trace.Sum(x[1])),
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Sub(o[0], o[1]), o[1]} },
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{o[1], trace.Tanh(o[0])} },
			x[0], x[1])
	}},
}

func f32t(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }

// Scan, while and cond run on the device: no step of theirs is a host
// step, and with the fake driver running the launched kernels (built with
// gcc) every program's results match eval's.
func TestControlFlowOnDevice(t *testing.T) {
	fake, b := fakeBackend(t, true)
	for _, p := range controlPrograms {
		t.Run(p.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(rand.Uint64(), 21))
			f := traceFn(t, p.params, p.fn)
			exe, err := b.Compile(f, rt.CompileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if hs := exe.(*executable).HostSteps(); len(hs) != 0 {
				t.Fatalf("host steps: %v", hs)
			}
			var ins []*ir.Literal
			var bufs []trace.Buffer
			for _, prm := range f.Body.Params {
				l := randomLiteral(rng, prm.Type)
				ins = append(ins, l)
				buf, err := b.FromLiteral(l)
				if err != nil {
					t.Fatal(err)
				}
				bufs = append(bufs, buf)
			}
			want, err := eval.Run(f, ins)
			if err != nil {
				t.Fatal(err)
			}
			// Twice: the second execution reuses nothing of the first.
			for range 2 {
				outs, err := exe.Execute(bufs, rt.ExecOptions{})
				if err != nil {
					v, _, _ := fake.snapshot()
					t.Fatalf("%v\n%s", err, strings.Join(v, "\n"))
				}
				for i, w := range want {
					got, err := outs[i].Literal()
					if err != nil {
						t.Fatal(err)
					}
					if !got.Type.Equal(w.Type) {
						t.Fatalf("result %d is %v, want %v", i, got.Type, w.Type)
					}
					for j := range w.Type.Size() {
						if g, x := got.Float64At(j), w.Float64At(j); math.Abs(g-x) > 1e-5*(1+math.Abs(x)) {
							t.Fatalf("result %d element %d = %v, want %v", i, j, g, x)
						}
					}
				}
			}
		})
	}
}

// A reverse scan launches its body's kernel once per iteration, reading
// slice length-1-i of its xs in iteration i and writing the y it computes
// in place into the same slice of its ys; the carry result is initialised
// by a copy from the carry operand and then read and written by every
// iteration. (Launches are recorded, not run: no gcc needed.)
func TestScanLaunchPointers(t *testing.T) {
	fake, b := fakeBackend(t, false)
	const n, m = 5, 3
	f := traceFn(t, []ir.Type{f32t(m), f32t(n, m)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			s := trace.Add(c[0], xs[0])
			return []*trace.Array{s}, []*trace.Array{trace.Mul(s, xs[0])}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]}, trace.ScanReverse())
		return append(c, ys...)
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := exe.(*executable)
	if hs := e.HostSteps(); len(hs) != 0 {
		t.Fatalf("host steps: %v", hs)
	}
	var scan *step
	for i := range e.steps {
		if e.steps[i].kind == stepScan {
			scan = &e.steps[i]
		}
	}
	if scan == nil || len(scan.subs) != 1 {
		t.Fatalf("no scan step in\n%v", e.prog.Func)
	}
	var body []string
	for _, s := range scan.subs[0].steps {
		if s.kind != stepKernel {
			t.Fatalf("body step %v is %d, want a kernel", s.op.Code, s.kind)
		}
		body = append(body, s.kernel.Entries[0].Name)
	}
	if len(body) != 1 {
		t.Fatalf("body has %d kernels (%v), want one fused kernel", len(body), body)
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 22))
	var bufs []trace.Buffer
	for _, p := range f.Body.Params {
		buf, err := b.FromLiteral(randomLiteral(rng, p.Type))
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, buf)
	}
	outs, err := exe.Execute(bufs, rt.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	carry, ys := outs[0].(*Buffer).m.ptr, outs[1].(*Buffer).m.ptr
	xs := bufs[1].(*Buffer).m.ptr
	fake.mu.Lock()
	launches := fake.launchArgs
	fake.mu.Unlock()
	if len(launches) != n {
		t.Fatalf("%d launches, want %d: %v", len(launches), n, launches)
	}
	slice := uintptr(m * 4)
	for it, l := range launches {
		idx := uintptr(n - 1 - it)
		// Operands (carry, x slice in the fusion's order), results (new
		// carry into the body's arena, y in place), n.
		if l.name != body[0] {
			t.Fatalf("launch %d is %s, want %s", it, l.name, body[0])
		}
		has := func(p uintptr) bool {
			for _, a := range l.args {
				if a == p {
					return true
				}
			}
			return false
		}
		if !has(xs+idx*slice) || !has(ys+idx*slice) || !has(carry) {
			t.Fatalf("iteration %d (slice %d): launch args %#x, want xs slice %#x, ys slice %#x and carry %#x",
				it, idx, l.args, xs+idx*slice, ys+idx*slice, carry)
		}
		for k := range n {
			if k != int(idx) && (has(xs+uintptr(k)*slice) || has(ys+uintptr(k)*slice)) {
				t.Fatalf("iteration %d touches slice %d: %#x", it, k, l.args)
			}
		}
	}
}

// HostSteps names the steps nested in regions that still run on the host
// (sort has no device kernel), with the region path.
func TestHostStepsNested(t *testing.T) {
	_, b := fakeBackend(t, false)
	f := traceFn(t, []ir.Type{f32t(4), f32t(3, 4)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Sort(trace.Add(c[0], xs[0]), 0)}, nil
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(c, ys...)
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hs := exe.(*executable).HostSteps()
	if len(hs) != 1 || !strings.HasPrefix(hs[0], "scan body / sort: ") {
		t.Fatalf("host steps %q, want the sort in the scan body", hs)
	}
}
