package runtime_test

import (
	"errors"
	"fmt"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A scanned model that needs less device memory: give jit a budget and the
// compiler decides what each layer's backward pass keeps on device,
// recomputes or offloads to pinned_host. The plan is in the memory analysis
// (c.MemoryPlan(), printed by FERRY_DUMP_IR); a budget below what any plan
// reaches is an error naming the smallest one that fits.
func ExampleMemoryBudget() {
	type W struct{ W1, W2 *trace.Array }
	grad := func(w W, x *trace.Array) W {
		return trace.Grad(func(w W) *trace.Array {
			y, _ := trace.ScanTree(func(x *trace.Array, w W) (*trace.Array, struct{}) {
				return trace.MatMul(trace.Tanh(trace.MatMul(x, w.W1)), w.W2), struct{}{}
			}, x, w)
			return trace.Sum(y)
		})(w)
	}
	fill := func(shape ...int) *trace.Array {
		n := 1
		for _, d := range shape {
			n *= d
		}
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(i%13-6) / 64
		}
		return rt.FromSlice(s, shape...)
	}
	w, x := W{W1: fill(8, 64, 256), W2: fill(8, 256, 64)}, fill(128, 64)

	compile := func(opts ...rt.Option) (*rt.Compiled, error) {
		l, err := rt.NewJitted(grad, opts...).Lower(w, x)
		if err != nil {
			return nil, err
		}
		return l.Compile()
	}
	plain, _ := compile()
	full := plain.MemoryAnalysis().TotalBytes()

	budget := full * 9 / 10
	c, err := compile(rt.MemoryBudget(budget))
	if err != nil {
		panic(err)
	}
	fmt.Println("fits:", c.MemoryAnalysis().TotalBytes() <= budget)
	g, _ := c.Call(w, x)
	want, _ := plain.Call(w, x)
	fmt.Println("same gradients:", fmt.Sprint(g[0].(W).W1.Float32s()[:3]) == fmt.Sprint(want[0].(W).W1.Float32s()[:3]))

	_, err = compile(rt.MemoryBudget(1 << 10))
	var be *rt.MemoryBudgetError
	fmt.Println("1 KiB is too small:", errors.As(err, &be), be.Minimum < full)
	// Output:
	// fits: true
	// same gradients: true
	// 1 KiB is too small: true true
}

// Planning for another machine: BudgetRates prices the plan with given rates
// (here an accelerator's: 1e15 FLOP/s for products, 5e13 for the rest, 5e10
// bytes/s between device and pinned_host) instead of this machine's, so the
// plan's step estimate is the other machine's.
func ExampleBudgetRates() {
	type W struct{ W1, W2 *trace.Array }
	grad := func(w W, x *trace.Array) W {
		return trace.Grad(func(w W) *trace.Array {
			y, _ := trace.ScanTree(func(x *trace.Array, w W) (*trace.Array, struct{}) {
				return trace.MatMul(trace.Tanh(trace.MatMul(x, w.W1)), w.W2), struct{}{}
			}, x, w)
			return trace.Sum(y)
		})(w)
	}
	w := W{W1: trace.Zeros(ir.Shape{8, 64, 256}, ir.Float32), W2: trace.Zeros(ir.Shape{8, 256, 64}, ir.Float32)}
	x := trace.Zeros(ir.Shape{128, 64}, ir.Float32)
	plain, _ := rt.NewJitted(grad).Lower(w, x)
	pc, _ := plain.Compile()
	budget := pc.MemoryAnalysis().TotalBytes() * 9 / 10

	l, err := rt.NewJitted(grad, rt.MemoryBudget(budget), rt.BudgetRates(1e15, 5e13, 5e10)).Lower(w, x)
	if err != nil {
		panic(err)
	}
	c, err := l.Compile()
	if err != nil {
		panic(err)
	}
	p := c.MemoryPlan()
	fmt.Println("priced at the given rates:", p.FlopRate == 1e15 && p.ElementRate == 5e13 && p.Bandwidth == 5e10)
	fmt.Println("step estimate under a millisecond:", p.StepSeconds < 1e-3)
	// Output:
	// priced at the given rates: true
	// step estimate under a millisecond: true
}

// A sharded function's plan is one device's: BudgetCollectiveBandwidth
// prices the per-device program's collectives (here at 450 GB/s of bus
// bandwidth, NVLink's) in its step estimate, beside its arithmetic or, as
// with BudgetCopiesOverlap(false), after it.
func ExampleBudgetCollectiveBandwidth() {
	if err := rt.SetCPUDeviceCount(4); err != nil {
		panic(err)
	}
	defer rt.ConfigureMemory(rt.MemoryConfig{})
	mesh, err := ir.NewMesh([]int{4}, []string{"fsdp"})
	if err != nil {
		panic(err)
	}
	shard := func(spec ir.PartitionSpec) *ir.NamedSharding {
		s, err := ir.NewNamedSharding(mesh, spec)
		if err != nil {
			panic(err)
		}
		return s
	}
	stacked, layer, batch := shard(ir.P("", "fsdp", "")), shard(ir.P("fsdp", "")), shard(ir.P("fsdp", ""))
	type W struct{ W1, W2 *trace.Array }
	// FSDP: each device holds a quarter of every layer and of the batch.
	grad := func(w W, x *trace.Array) W {
		return trace.Grad(func(w W) *trace.Array {
			y, _ := trace.ScanTree(func(x *trace.Array, w W) (*trace.Array, struct{}) {
				w1, w2 := trace.WithShardingConstraint(w.W1, layer), trace.WithShardingConstraint(w.W2, layer)
				h := trace.MatMul(trace.Tanh(trace.MatMul(x, w1)), w2)
				return trace.WithShardingConstraint(h, batch), struct{}{}
			}, x, w)
			return trace.Sum(y)
		})(w)
	}
	w := W{W1: trace.Zeros(ir.Shape{8, 64, 256}, ir.Float32), W2: trace.Zeros(ir.Shape{8, 256, 64}, ir.Float32)}
	x := trace.Zeros(ir.Shape{128, 64}, ir.Float32)
	plan := func(opts ...rt.Option) float64 {
		opts = append(opts, rt.InShardings(stacked, stacked, batch), rt.MemoryBudget(1<<40),
			rt.BudgetRates(1e15, 5e13, 5e10), rt.BudgetCopiesOverlap(false))
		l, err := rt.NewJitted(grad, opts...).Lower(w, x)
		if err != nil {
			panic(err)
		}
		c, err := l.Compile()
		if err != nil {
			panic(err)
		}
		p := c.MemoryPlan()
		return p.StepSeconds - p.ComputeSeconds // what is not arithmetic
	}
	fmt.Println("collectives unpriced:", plan() == 0)
	fmt.Println("collectives priced:", plan(rt.BudgetCollectiveBandwidth(450e9)) > 0)
	// Output:
	// collectives unpriced: true
	// collectives priced: true
}
