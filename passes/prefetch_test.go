package passes_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// hostScan traces a scan over w1 and w2 (f32[n,d,d], pinned_host) whose
// body moves its slices to device and computes c = (c @ w1[i]) @ w2[i], and
// then tail(final c, big), big a parameter f32[3d,3d].
func hostScan(n, d int, tail func(c, big *trace.Array) *trace.Array) *ir.Func {
	hT := ir.TypeOf(ir.Float32, n, d, d).WithSpace(ir.PinnedHost)
	return traceFunc("host_scan", func(a ...*trace.Array) []*trace.Array {
		c, _ := trace.Scan(func(c, w []*trace.Array) ([]*trace.Array, []*trace.Array) {
			y := trace.MatMul(c[0], trace.DevicePut(w[0], ir.Device))
			return []*trace.Array{trace.MatMul(y, trace.DevicePut(w[1], ir.Device))}, nil
		}, []*trace.Array{a[0]}, []*trace.Array{a[1], a[2]})
		return []*trace.Array{tail(c[0], a[3])}
	}, ir.TypeOf(ir.Float32, d, d), hT, hT, ir.TypeOf(ir.Float32, 3*d, 3*d))
}

// reservedCopy returns the device_put of p's scan body that copies the w1
// slice, and whether its buffer shares no byte with another value of the
// body.
func reservedCopy(t *testing.T, p *passes.Program) (put *ir.Op, alone bool) {
	t.Helper()
	var scan *ir.Op
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.Scan {
			scan = op
		}
	}
	require.NotNil(t, scan)
	body := scan.Regions[0]
	bp := p.Plan.Sub[scan][0]
	for _, op := range body.Ops {
		if op.Code == ir.DevicePut && op.Args[0] == body.Params[1] {
			put = op
		}
	}
	require.NotNil(t, put, "the body copies its slice")
	b := bp.Values[put.Result()]
	require.Equal(t, passes.BufTemp, b.Kind)
	alone = true
	for v, o := range bp.Values {
		if v != put.Result() && o.Kind == passes.BufTemp && o.Space == b.Space && o.Offset < b.Offset+b.Size && b.Offset < o.Offset+o.Size {
			alone = false
		}
	}
	return put, alone
}

func checkAgainstEval(t *testing.T, f *ir.Func, p *passes.Program) {
	t.Helper()
	args := randprog.Args(testseed.Rand(t, 3), f)
	want, err := eval.Run(f, args)
	require.NoError(t, err)
	got, err := runPlan(p, args)
	require.NoError(t, err)
	require.NoError(t, sameResults(want, got))
}

// A program whose device peak is outside the scan: keeping the w1 copy's
// bytes for the whole iteration costs nothing, so the pass moves the copy
// first and reserves its buffer (without the pass, the w2 copy reuses it),
// the arenas are those of the program compiled without the pass, and the
// plan computes eval's results.
func TestPrefetchReservesFreeBuffer(t *testing.T) {
	f := hostScan(4, 8, func(c, big *trace.Array) *trace.Array {
		return trace.Add(trace.Sum(trace.Tanh(trace.MatMul(big, big))), trace.Sum(c))
	})
	p := compile(t, f, passes.Options{})
	off := compile(t, f, passes.Options{Disable: []string{"prefetch"}})
	_, aloneOff := reservedCopy(t, off)
	require.False(t, aloneOff, "without the pass the bytes are reused:\n%s\n%s", off.Func, off.PlanString())
	put, alone := reservedCopy(t, p)
	require.True(t, alone, "the copy's bytes are its own for the whole iteration:\n%s\n%s", p.Func, p.PlanString())
	var scan *ir.Op
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.Scan {
			scan = op
		}
	}
	for _, op := range scan.Regions[0].Ops {
		if op == put {
			break
		}
		require.Equal(t, ir.DevicePut, op.Code, "only other reserved copies precede the copy:\n%s", p.Func)
	}
	require.Equal(t, off.Plan.Arena, p.Plan.Arena, "no memory added")
	require.Equal(t, off.Analysis, p.Analysis)
	checkAgainstEval(t, f, p)
}

// The same scan as the whole program: reserving the w1 copy's bytes (which
// the w2 copy reuses) would grow the device arena, so the pass leaves them.
func TestPrefetchKeepsMemory(t *testing.T) {
	f := hostScan(4, 8, func(c, big *trace.Array) *trace.Array { return trace.Sum(c) })
	p := compile(t, f, passes.Options{})
	off := compile(t, f, passes.Options{Disable: []string{"prefetch"}})
	_, alone := reservedCopy(t, p)
	require.False(t, alone, "the copy's bytes are reused:\n%s\n%s", p.Func, p.PlanString())
	require.Equal(t, off.Plan.Arena, p.Plan.Arena)
	checkAgainstEval(t, f, p)
}
