package passes_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// stateUpdate is the optimizer-state pattern on small arrays: two pairs of
// host values (m_i, v_i) copied to device, each pair updated together with a
// gradient g_i, and the new values copied back. The traced order copies all
// four in first.
const stateUpdate = `func @f(%0: f32[1024], %1: f32[1024], %2: f32[1024]{pinned_host}, %3: f32[1024]{pinned_host}, %4: f32[1024]{pinned_host}, %5: f32[1024]{pinned_host}) -> (f32[1024]{pinned_host}, f32[1024]{pinned_host}, f32[1024]{pinned_host}, f32[1024]{pinned_host}) {
  %6 = device_put(%2) {space=#device} : f32[1024]
  %7 = device_put(%3) {space=#device} : f32[1024]
  %8 = device_put(%4) {space=#device} : f32[1024]
  %9 = device_put(%5) {space=#device} : f32[1024]
  %10 = add(%6, %0) : f32[1024]
  %11 = mul(%0, %0) : f32[1024]
  %12 = add(%8, %11) : f32[1024]
  %13 = device_put(%10) {space=#pinned_host} : f32[1024]{pinned_host}
  %14 = device_put(%12) {space=#pinned_host} : f32[1024]{pinned_host}
  %15 = add(%7, %1) : f32[1024]
  %16 = mul(%1, %1) : f32[1024]
  %17 = add(%9, %16) : f32[1024]
  %18 = device_put(%15) {space=#pinned_host} : f32[1024]{pinned_host}
  %19 = device_put(%17) {space=#pinned_host} : f32[1024]{pinned_host}
  return %13, %14, %18, %19
}`

// TestScheduleCopiesInLate: host→device copies run just before the op that
// reads them (never all at once up front), and with in-place fusion the new
// state overwrites the device copies, so at most two state buffers and the
// fused group's scratch are on device at any time.
func TestScheduleCopiesInLate(t *testing.T) {
	const kb = 1024 * 4
	f := parse(t, stateUpdate)
	traced := checkSame(t, f, only())
	require.Equal(t, int64(5*kb), traced.Analysis.TempBytes, "the traced order: four copies and a product")

	p := checkSame(t, f, only("schedule"))
	var order []string
	for _, op := range p.Func.Body.Ops {
		order = append(order, op.Result().String())
	}
	require.Equal(t, []string{"%6", "%10", "%13", "%11", "%8", "%12", "%14", "%7", "%15", "%18", "%16", "%9", "%17", "%19"}, order,
		"each copy just before its reader, each copy back right after its producer:\n%s", p.Func)
	require.Equal(t, int64(2*kb), p.Analysis.TempBytes, "%s", p.PlanString())

	// The whole pipeline with in-place fusion: one loop fusion per pair,
	// its new state written over a dying copy.
	fused := checkSame(t, f, passes.Options{FusionInPlace: true})
	require.LessOrEqual(t, fused.Analysis.TempBytes, int64(2*kb), "%s\n%s", fused.Func, fused.PlanString())
	for _, op := range fused.Func.Body.Ops {
		if op.Code != ir.Fusion {
			continue
		}
		res := fused.Plan.Values[op.Results[0]]
		inPlace := false
		for _, a := range op.Args {
			if b := fused.Plan.Values[a]; a.Op != nil && a.Op.Code == ir.DevicePut && b == res {
				inPlace = true
			}
		}
		require.True(t, inPlace, "the fusion's result reuses a dying copy's buffer:\n%s\n%s", fused.Func, fused.PlanString())
	}
}

// TestScheduleSharedCopyIn: a copy read by two ops runs before the first of
// them, once.
func TestScheduleSharedCopyIn(t *testing.T) {
	f := parse(t, `func @f(%0: f32[512], %1: f32[512]{pinned_host}, %2: f32[512]{pinned_host}) -> (f32[], f32[]) {
  %3 = device_put(%1) {space=#device} : f32[512]
  %4 = device_put(%2) {space=#device} : f32[512]
  %5 = mul(%4, %0) : f32[512]
  %6 = reduce_sum(%5) {axes=[0]} : f32[]
  %7 = mul(%3, %0) : f32[512]
  %8 = reduce_sum(%7) {axes=[0]} : f32[]
  %9 = add(%3, %4) : f32[512]
  %10 = reduce_sum(%9) {axes=[0]} : f32[]
  %11 = add(%8, %10) : f32[]
  return %6, %11
}`)
	traced := checkSame(t, f, only())
	p := checkSame(t, f, only("schedule"))
	require.Less(t, p.Analysis.TempBytes, traced.Analysis.TempBytes, "%s", p.Func)
	n := 0
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.DevicePut {
			n++
		}
	}
	require.Equal(t, 2, n)
}

// TestFusionNarrowSharedProducer: two independent chains share a global norm
// (a scalar computed from both) and a scalar parameter. Each chain is its own
// loop fusion — the shared scalars and their broadcasts do not tie them into
// one multi-output fusion — and each fusion reads only its chain's arrays.
func TestFusionNarrowSharedProducer(t *testing.T) {
	big := ir.TypeOf(ir.Float32, 64, 128)
	f := traceFunc("clip", func(a ...*trace.Array) []*trace.Array {
		norm := trace.Sqrt(trace.Add(trace.Sum(trace.Square(a[0])), trace.Sum(trace.Square(a[1]))))
		out := make([]*trace.Array, 2)
		for i := range out {
			g := trace.Div(a[i], norm)
			out[i] = trace.Add(trace.Mul(a[4], a[2+i]), trace.Mul(g, trace.Neg(a[4])))
		}
		return out
	}, big, big, big, big, ir.TypeOf(ir.Float32))
	p := checkSame(t, f, passes.Options{FusionInPlace: true})
	body := p.Func.Body
	chains := 0
	for _, op := range fusions(body) {
		if op.Attrs.String("kind") != passes.FusionLoop || op.Results[0].Type.Shape.Size() == 1 {
			continue
		}
		chains++
		require.Len(t, op.Results, 1, "one chain per fusion:\n%s", op)
		has := map[*ir.Value]bool{}
		for _, a := range op.Args {
			has[a] = true
		}
		require.False(t, has[body.Params[2]] && has[body.Params[3]], "the two chains are apart:\n%s", op)
	}
	require.Equal(t, 2, chains, "%s", p.Func)
}

// TestFusionNarrowOperandOneConsumer: a narrow value (a row vector about to
// be broadcast) read twice by one chain still fuses into it: nothing else
// reads it, so the chain stays one fusion with no temporaries.
func TestFusionNarrowOperandOneConsumer(t *testing.T) {
	f := traceFunc("row", func(a ...*trace.Array) []*trace.Array {
		w := trace.Exp(a[1])
		return []*trace.Array{trace.Tanh(trace.Add(trace.Mul(a[0], w), w))}
	}, ir.TypeOf(ir.Float32, 64, 256), ir.TypeOf(ir.Float32, 256))
	p := checkSame(t, f, passes.Options{})
	require.Equal(t, []string{"fusion:loop"}, codes(p.Func.Body), "%s", p.Func)
	require.Zero(t, p.Analysis.TempBytes)
}
