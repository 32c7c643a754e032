package nccl_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/cuda"
	"github.com/ferryml/ferry/cuda/nccl"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// onePerDevice is a per-device program of a sharded computation over an
// axis "x" of one device: every collective the CUDA backend runs, on the
// square of the operand. The dimensions before the collectives' are not 1,
// so all_gather, reduce_scatter and all_to_all take their transpose paths
// around NCCL's flat buffers; all_to_all is grouped Send/Recv to the rank
// itself; collective_permute of the rank to itself is a device copy.
const onePerDevice = `func @per_device(%0: f32[4,6]) -> (f32[4,6], f32[4,6], f32[4,6], f32[4,6], f32[4,6], f32[4,6], i32[]) {
  %1 = mul(%0, %0) : f32[4,6]
  %2 = all_reduce(%1) {axis="x", reduction="sum", size=1} : f32[4,6]
  %3 = all_reduce(%1) {axis="x", reduction="max", size=1} : f32[4,6]
  %4 = all_gather(%1) {axis="x", dimension=1, size=1, tiled=true} : f32[4,6]
  %5 = reduce_scatter(%1) {axis="x", dimension=1, size=1, tiled=true} : f32[4,6]
  %6 = all_to_all(%1) {axis="x", concat_dimension=1, size=1, split_dimension=1} : f32[4,6]
  %7 = collective_permute(%1) {axis="x", pairs=[0, 0], size=1} : f32[4,6]
  %8 = axis_index() {axis="x", size=1} : i32[]
  return %2, %3, %4, %5, %6, %7, %8
}`

// TestBackendCollectivesRealNCCL runs the CUDA backend's collective steps
// through NCCL on a real GPU: a one-device communicator from CommInitAll,
// a per-device program with every collective, results checked against the
// square of the operand computed in float32 here (with one rank every
// collective is the identity and axis_index is 0). It skips without NCCL
// or a GPU.
func TestBackendCollectivesRealNCCL(t *testing.T) {
	l, err := nccl.Load()
	if err != nil {
		t.Skipf("no NCCL: %v", err)
	}
	b, err := cuda.Register()
	if err != nil {
		t.Skipf("no GPU (the CUDA backend is unavailable): %v", err)
	}
	cs, err := l.CommInitAll([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Destroy()
	f, err := ir.Parse(onePerDevice)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := b.Compile(f, backend.CompileOptions{BoundAxes: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	in := ir.NewLiteral(ir.TypeOf(ir.Float32, 4, 6))
	want := make([]float64, 24)
	rng := testseed.Rand(t, 1)
	for i := range want {
		v := rng.Float32()*4 - 2
		in.SetFloat64At(i, float64(v))
		want[i] = float64(v * v)
	}
	arg, err := b.FromLiteral(in)
	if err != nil {
		t.Fatal(err)
	}
	for run := range 2 { // the second run reuses the communicator
		outs, err := exe.Execute([]trace.Buffer{arg}, backend.ExecOptions{DeviceComms: map[string]backend.DeviceCommunicator{"x": cs[0].Collectives()}})
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		names := []string{"all_reduce sum", "all_reduce max", "all_gather", "reduce_scatter", "all_to_all", "collective_permute"}
		for k, name := range names {
			got, err := outs[k].Literal()
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range want {
				if g := got.Float64At(i); g != w {
					t.Fatalf("run %d: %s: element %d is %v, want %v", run, name, i, g, w)
				}
			}
		}
		idx, err := outs[6].Literal()
		if err != nil {
			t.Fatal(err)
		}
		if idx.Float64At(0) != 0 {
			t.Errorf("run %d: axis_index = %v, want 0", run, idx.Float64At(0))
		}
	}
	if err := cs[0].Collectives().AsyncError(); err != nil {
		t.Fatalf("AsyncError: %v", err)
	}
}
