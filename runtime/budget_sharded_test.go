package runtime_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// shardedBudgetCase lays the scanned model of budgetGrad out over a mesh of
// one axis: the stacked weights and the input as passed (w1, w2, x), and
// inside the scan each layer's weights (l1, l2) and the carry.
type shardedBudgetCase struct {
	name, axis       string
	w1, w2, x        ir.PartitionSpec
	l1, l2, carry    ir.PartitionSpec
	gathers, reduces string // a collective the per-device program must have
}

// shardedBudgetCases: FSDP (weights split along their rows, all-gathered
// per layer inside the scan, gradients reduce-scattered; the batch split
// too) and Megatron tensor parallelism (w1 by columns, w2 by rows, one
// all-reduce per layer).
var shardedBudgetCases = []shardedBudgetCase{
	{name: "fsdp", axis: "fsdp", w1: ir.P("", "fsdp", ""), w2: ir.P("", "fsdp", ""), x: ir.P("fsdp", ""),
		l1: ir.P("fsdp", ""), l2: ir.P("fsdp", ""), carry: ir.P("fsdp", ""), gathers: "all_gather(", reduces: "reduce_scatter("},
	{name: "tp", axis: "model", w1: ir.P("", "", "model"), w2: ir.P("", "model", ""), x: ir.P(),
		l1: ir.P("", "model"), l2: ir.P("model", ""), carry: ir.P(), gathers: "all_reduce(", reduces: "all_reduce("},
}

// layer is budgetLayer with the case's layouts inside the scan.
func (c shardedBudgetCase) layer(t *testing.T, n int) func(*trace.Array, budgetW) *trace.Array {
	l1 := mustSharding(t, []int{n}, []string{c.axis}, c.l1)
	l2 := mustSharding(t, []int{n}, []string{c.axis}, c.l2)
	carry := mustSharding(t, []int{n}, []string{c.axis}, c.carry)
	return func(x *trace.Array, w budgetW) *trace.Array {
		w = budgetW{W1: trace.WithShardingConstraint(w.W1, l1), W2: trace.WithShardingConstraint(w.W2, l2)}
		return trace.WithShardingConstraint(budgetLayer(x, w), carry)
	}
}

// shardedCall runs c on the sharded arguments and returns the gradients
// with each device's measured peak of device memory during the call (what
// the call allocated there, plus its arguments' blocks).
func shardedCall(t *testing.T, c *rt.Compiled, w budgetW, x *trace.Array, devs []rt.Device) (budgetW, []int64) {
	t.Helper()
	collectGarbage()
	before := make([]int64, len(devs))
	for i, d := range devs {
		st, err := rt.DeviceMemoryStats(d, ir.Device)
		require.NoError(t, err)
		before[i] = st.BytesInUse
	}
	rt.ResetPeakMemory()
	out, err := c.Call(w, x)
	require.NoError(t, err)
	peaks := make([]int64, len(devs))
	for i, d := range devs {
		st, err := rt.DeviceMemoryStats(d, ir.Device)
		require.NoError(t, err)
		peaks[i] = st.PeakBytesInUse - before[i] + c.MemoryAnalysis().ArgumentBytes
	}
	return out[0].(budgetW), peaks
}

// requireGradsClose checks two gradients elementwise within float tolerance.
func requireGradsClose(t *testing.T, want, got budgetW, what string) {
	t.Helper()
	for _, p := range [][2]*trace.Array{{want.W1, got.W1}, {want.W2, got.W2}} {
		a, b := p[0].Float32s(), p[1].Float32s()
		require.Len(t, b, len(a))
		scale := 0.0
		for _, v := range a {
			scale = math.Max(scale, math.Abs(float64(v)))
		}
		for i := range a {
			require.InDelta(t, a[i], b[i], 1e-5*scale+1e-6, "%s: element %d", what, i)
		}
	}
}

// TestMemoryBudgetSharded plans a scanned model partitioned over four
// virtual CPU devices (FSDP and tensor parallel) under budgets per device
// from the unconstrained per-device total down to the smallest plan: every
// device's measured peak stays within the budget, and the gradients equal
// the unconstrained sharded run's, the one-device run's and a float64
// reference.
func TestMemoryBudgetSharded(t *testing.T) {
	const n = 4
	withDevices(t, n)
	devs := rt.Devices()[:n]
	for _, tc := range shardedBudgetCases {
		t.Run(tc.name, func(t *testing.T) {
			d := newBudgetData(budgetModel{L: 6, B: 16, D: 32, H: 64}, testseed.Uint64(t))
			single, err := compileBudget(t, d, budgetLayer)
			require.NoError(t, err)
			want := runBudget(t, single, d)
			d.check(t, want)

			sw1 := mustSharding(t, []int{n}, []string{tc.axis}, tc.w1)
			sw2 := mustSharding(t, []int{n}, []string{tc.axis}, tc.w2)
			sx := mustSharding(t, []int{n}, []string{tc.axis}, tc.x)
			w1, err := rt.DevicePut(d.w.W1, sw1)
			require.NoError(t, err)
			w2, err := rt.DevicePut(d.w.W2, sw2)
			require.NoError(t, err)
			x, err := rt.DevicePut(d.xa, sx)
			require.NoError(t, err)
			w := budgetW{W1: w1, W2: w2}
			layer := tc.layer(t, n)
			compile := func(opts ...rt.Option) (*rt.Compiled, error) {
				l, err := rt.NewJitted(budgetGrad(layer), append(opts, rt.InShardings(sw1, sw2, sx))...).Lower(w, x)
				if err != nil {
					return nil, err
				}
				return l.Compile()
			}

			base, err := compile()
			require.NoError(t, err)
			require.Contains(t, base.OptimizedIR(), tc.gathers)
			require.Contains(t, base.OptimizedIR(), tc.reduces)
			baseline := base.MemoryAnalysis().TotalBytes()
			free, peaks := shardedCall(t, base, w, x, devs)
			requireGradsClose(t, want, free, "unconstrained sharded run against one device")
			d.check(t, free)
			t.Logf("unconstrained: per-device total %d, measured peaks %v", baseline, peaks)

			// A budget below the smallest plan names the per-device minimum.
			_, err = compile(rt.MemoryBudget(1))
			var be *rt.MemoryBudgetError
			require.ErrorAs(t, err, &be)
			require.NotNil(t, be.Mesh)
			require.Equal(t, baseline, be.Baseline)
			require.Less(t, be.Minimum, baseline)
			require.Contains(t, err.Error(), "per device")
			t.Log(err)

			for i := 4; i >= 0; i-- {
				budget := be.Minimum + (baseline-be.Minimum)*int64(i)/4
				c, err := compile(rt.MemoryBudget(budget))
				require.NoError(t, err, "budget %d", budget)
				require.LessOrEqual(t, c.MemoryAnalysis().TotalBytes(), budget)
				if i < 4 {
					require.NotNil(t, c.MemoryPlan())
				}
				g, peaks := shardedCall(t, c, w, x, devs)
				for k, p := range peaks {
					require.LessOrEqual(t, p, budget, "budget %d: %v's measured peak", budget, devs[k])
				}
				t.Logf("budget %d: plan total %d, measured peaks %v", budget, c.MemoryAnalysis().TotalBytes(), peaks)
				requireGradsClose(t, free, g, "planned against unconstrained sharded run")
				requireGradsClose(t, want, g, "planned against one device")
			}
			_, err = compile(rt.MemoryBudget(be.Minimum - 1))
			require.ErrorAs(t, err, &be)
		})
	}
}

// ringBytes counts the bytes the collectives of region r (run times times)
// move around a ring: S·(n−1)/n for an all-gather's result or a
// reduce-scatter's operand of S bytes over a group of n, twice that for an
// all-reduce's operands.
func ringBytes(r *ir.Region, times float64) float64 {
	total := 0.0
	for _, op := range r.Ops {
		k := times
		if op.Code == ir.Scan {
			k *= float64(op.Attrs.Int("length"))
		}
		for _, sub := range op.Regions {
			total += ringBytes(sub, k)
		}
		n := float64(op.Attrs.Int("size"))
		switch op.Code {
		case ir.AllGather:
			total += float64(op.Result().Type.Bytes()) * (n - 1) / n * times
		case ir.ReduceScatter:
			total += float64(op.Args[0].Type.Bytes()) * (n - 1) / n * times
		case ir.AllReduce:
			total += 2 * float64(op.Args[0].Type.Bytes()) * (n - 1) / n * times
		}
	}
	return total
}

// TestMemoryBudgetShardedEstimate: the estimate of a plan of a sharded
// function is one device's step: the per-device program's arithmetic at
// the rates, beside its collectives at the collective bandwidth (after
// them, when copies share the cores), a fraction of the one-device
// program's; and the plan's bytes are a device's.
func TestMemoryBudgetShardedEstimate(t *testing.T) {
	const n = 4
	withDevices(t, n)
	r := testseed.Rand(t, 11)
	d := newBudgetData(budgetModel{L: 2 + r.IntN(4), B: 16, D: 32, H: 64}, r.Uint64())
	flop, elem, bw, bus := 1e10*(1+r.Float64()), 1e9*(1+r.Float64()), 1e9*(1+r.Float64()), 1e8*(1+r.Float64())
	rates := []rt.Option{rt.BudgetRates(flop, elem, bw), rt.BudgetCollectiveBandwidth(bus)}
	single, err := compileBudget(t, d, budgetLayer, append(rates, rt.MemoryBudget(1<<62), rt.BudgetCopiesOverlap(false))...)
	require.NoError(t, err)

	tc := shardedBudgetCases[0] // FSDP
	sw1 := mustSharding(t, []int{n}, []string{tc.axis}, tc.w1)
	sw2 := mustSharding(t, []int{n}, []string{tc.axis}, tc.w2)
	sx := mustSharding(t, []int{n}, []string{tc.axis}, tc.x)
	compile := func(opts ...rt.Option) *rt.Compiled {
		l, err := rt.NewJitted(budgetGrad(tc.layer(t, n)), append(append(opts, rates...), rt.InShardings(sw1, sw2, sx))...).Lower(d.w, d.xa)
		require.NoError(t, err)
		c, err := l.Compile()
		require.NoError(t, err)
		return c
	}
	for _, overlap := range []bool{false, true} {
		c := compile(rt.MemoryBudget(1<<62), rt.BudgetCopiesOverlap(overlap))
		p := c.MemoryPlan()
		require.NotNil(t, p)
		cost := c.CostAnalysis() // the per-device program's
		compute := cost.DotFlops/flop + (cost.Flops-cost.DotFlops+cost.Transcendentals)/elem
		coll := ringBytes(c.Program().Func.Body, 1) / bus
		require.Positive(t, coll)
		want := compute + coll
		if overlap {
			want = math.Max(compute, coll)
		}
		require.InDelta(t, compute, p.ComputeSeconds, 1e-9*compute)
		require.InDelta(t, want, p.StepSeconds, 1e-9*want, "overlap %v: compute %g s, collectives %g s", overlap, compute, coll)
		// A device computes its quarter of the batch: well under half of
		// the one-device program's arithmetic.
		require.Less(t, p.ComputeSeconds, single.MemoryPlan().ComputeSeconds/2)
	}

	// With everything kept, the residuals a device keeps fit within its
	// temporaries.
	c := compile(rt.MemoryBudget(1 << 62))
	kept := int64(0)
	for _, v := range c.MemoryPlan().Values {
		if v.Action == "keep" {
			kept += v.Bytes
		}
	}
	require.Positive(t, kept)
	require.LessOrEqual(t, kept, c.MemoryAnalysis().TempBytes)
}
