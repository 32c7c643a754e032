package cuda

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// On a GPU (skipped elsewhere): cuBLASLt loads and takes the dots of a dense
// layer (plain and fused with its epilogue), the result matches eval, and
// the device timer measures a positive interval around Execute.
func TestDeviceMatmulAndTimer(t *testing.T) {
	b, err := Register()
	if err != nil {
		t.Skipf("cuda backend unavailable: %v", err)
	}
	t.Log("\n" + b.Info().String())
	if ok, why := b.MatmulStatus(); !ok {
		t.Fatalf("cuBLASLt unavailable: %v", why)
	}
	f32 := func(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }
	f := traceFn(t, []ir.Type{f32(64, 96), f32(96, 128), f32(128)}, func(x []*trace.Array) []*trace.Array {
		h := trace.MatMul(x[0], x[1])
		return []*trace.Array{h, trace.Gelu(trace.Add(trace.MatMul(x[0], x[1]), x[2]), true)}
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := exe.(*executable)
	n := 0
	for _, s := range e.steps {
		if s.kind == stepMatmul {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no step uses cuBLASLt in\n%v", e.prog.Func)
	}
	rng := testseed.Rand(t, 13)
	var ins []*ir.Literal
	var bufs []trace.Buffer
	for _, p := range f.Body.Params {
		l := randomLiteral(rng, p.Type)
		ins = append(ins, l)
		buf, err := b.FromLiteral(l)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, buf)
	}
	tm, err := b.NewTimer()
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	if err := tm.Start(); err != nil {
		t.Fatal(err)
	}
	outs, err := exe.Execute(bufs, rt.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := tm.Stop()
	if err != nil || !(ms > 0) {
		t.Fatalf("timer: %v ms, %v", ms, err)
	}
	t.Logf("%d cuBLASLt steps, %.3f ms on %s", n, ms, b.Devices()[0].Kind)
	want, err := eval.Run(f, ins)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		got, err := outs[i].Literal()
		if err != nil {
			t.Fatal(err)
		}
		for j := range w.Type.Size() {
			// f32 on a GPU: cuBLASLt chooses its own split of K and order of
			// the partial sums (and the kernels contract into FMAs), where
			// eval sums in cpu/gemm's blocked order: 1e-4, ten times the
			// generated kernels' (mismatch), for products of up to a few
			// hundred terms.
			if g, x := got.Float64At(j), w.Float64At(j); math.Abs(g-x) > 1e-4*(1+math.Abs(x)) {
				t.Fatalf("result %d element %d = %v, want %v", i, j, g, x)
			}
		}
	}
	// A deleted argument is refused with an error naming it.
	if err := bufs[2].(*Buffer).Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := exe.Execute(bufs, rt.ExecOptions{}); err == nil || !strings.Contains(err.Error(), "argument 2") {
		t.Fatalf("executing with a deleted argument: %v", err)
	}
}
