package main

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The -devices mode: the same step sharded FSDP-style over a mesh of
// virtual devices, planned per device.

// fsdpAxis names the mesh's one axis.
const fsdpAxis = "fsdp"

// fsdpSetup gives the CPU backend n devices (before any array exists) and
// returns the one-axis mesh over them.
func fsdpSetup(n int) (*ir.Mesh, error) {
	if n < 2 {
		return nil, fmt.Errorf("-devices %d: want at least 2", n)
	}
	if len(rt.Devices()) < n {
		if err := rt.SetCPUDeviceCount(n); err != nil {
			return nil, err
		}
	}
	return ir.NewMesh([]int{n}, []string{fsdpAxis})
}

// fsdpSpec splits a leaf over the mesh's axis along its first dimension
// from skip that n divides (none: the leaf is whole on every device).
func fsdpSpec(t ir.Type, skip, n int) ir.PartitionSpec {
	spec := make(ir.PartitionSpec, len(t.Shape))
	for d := skip; d < len(t.Shape); d++ {
		if t.Shape[d]%n == 0 {
			spec[d] = []string{fsdpAxis}
			return spec
		}
	}
	return spec
}

// fsdpLayout is the sharding of every leaf of the step's arguments: the
// stacked blocks split after their layer axis, the other parameters along
// their first dimension the device count divides, AdamW's moments as their
// parameters, its count whole, the batch split by sequence.
type fsdpLayout struct {
	mesh   *ir.Mesh
	n      int
	params nn.Llama // the parameters' shardings, as a tree of abstract arrays
	in     []*ir.NamedSharding
	out    []*ir.NamedSharding
}

func mustSharding(mesh *ir.Mesh, spec ir.PartitionSpec) *ir.NamedSharding {
	s, err := ir.NewNamedSharding(mesh, spec)
	if err != nil {
		panic(err)
	}
	return s
}

// newFSDPLayout lays out the step's arguments (parameters p, AdamW's state,
// ids and targets like ids) and results on mesh.
func newFSDPLayout(mesh *ir.Mesh, p nn.Llama, ids *trace.Array) fsdpLayout {
	n := mesh.NumDevices()
	l := fsdpLayout{mesh: mesh, n: n}
	blocks := map[*trace.Array]bool{}
	for _, a := range trace.Leaves(p.Blocks) {
		blocks[a] = true
	}
	var ps []*ir.NamedSharding
	for _, a := range trace.Leaves(p) {
		skip := 0
		if blocks[a] {
			skip = 1
		}
		ps = append(ps, mustSharding(mesh, fsdpSpec(a.Type(), skip, n)))
	}
	state := append(append([]*ir.NamedSharding{mustSharding(mesh, ir.P())}, ps...), ps...)
	batch := mustSharding(mesh, fsdpSpec(ids.Type(), 0, n))
	l.in = append(append(append([]*ir.NamedSharding{}, ps...), state...), batch, batch)
	l.out = append(append(append([]*ir.NamedSharding{}, ps...), state...), mustSharding(mesh, ir.P()))
	return l
}

// layer constrains one layer's parameters (a slice of the stacked blocks
// inside the layer scan) to their stack's split without the layer axis:
// the partitioner then all-gathers each layer where the block uses it and
// reduce-scatters its gradient.
func (l fsdpLayout) layer(b nn.TransformerBlock) nn.TransformerBlock {
	return mustTree(trace.MapAs(b, func(a *trace.Array) *trace.Array {
		return trace.WithShardingConstraint(a, mustSharding(l.mesh, fsdpSpec(a.Type(), 0, l.n)))
	}))
}

// logits is nn.Llama.Logits with the layer scan written here, so that each
// layer's parameters pass through layer first (nn.WithLayerParams is typed
// for nn.Stack's blocks).
func logits(p nn.Llama, ids *trace.Array, layer func(nn.TransformerBlock) nn.TransformerBlock) *trace.Array {
	x, _ := trace.ScanTree(func(x *trace.Array, b nn.TransformerBlock) (*trace.Array, struct{}) {
		return layer(b).Apply(trace.CheckpointName(x, nn.BlockInput), nn.Context{}), struct{}{}
	}, p.Embed.Apply(ids), p.Blocks.Blocks)
	return p.LMHead.Apply(p.Norm.Apply(x))
}

// step is trainStep with the forward pass of logits under l: each layer's
// parameters gathered inside the layer scan, the AdamW update one
// optim.Step over every leaf (elementwise, so its results take the donated
// parameters' and moments' buffers, which the scanned update of
// trainStepLayered cannot: a scan's ys do not reuse its xs).
func (l fsdpLayout) step(p nn.Llama, s optim.AdamState[nn.Llama], ids, targets *trace.Array) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array) {
	loss, g := trace.ValueAndGrad(func(p nn.Llama) *trace.Array {
		return nn.SoftmaxCrossEntropy(logits(p, ids, l.layer), targets)
	})(p)
	p, s, err := optim.Step(adamW(), g, s, p)
	if err != nil {
		panic(err)
	}
	return p, s, loss
}

// FSDPReport is the analysis of the step sharded over a mesh, per device,
// unconstrained and under a budget per device.
type FSDPReport struct {
	Devices, Layers, D, Seq int
	// GlobalBatch is the step's sequences, one per device.
	GlobalBatch int   `json:"global_batch"`
	Parameters  int64 `json:"parameters"` // elements
	// Params and OptState are one device's share of the parameters and of
	// AdamW's state (its blocks of the arguments).
	Params, OptState int64
	// Unconstrained and Planned are one device's program with everything
	// kept and under Budget.
	Unconstrained FSDPStep  `json:"unconstrained"`
	Budget        int64     `json:"budget_bytes"`
	Fits          bool      `json:"fits"`
	Planned       *FSDPStep `json:"planned,omitempty"`
	Minimum       int64     `json:"minimum_bytes,omitempty"`
	Error         string    `json:"error,omitempty"`
	// Plan is the planner's plan (its values have their global types and
	// one device's bytes; its estimate is one device's step).
	Plan *passes.MemoryPlan `json:"plan,omitempty"`
	// PerDevice is the plan's bytes per action on one device.
	PerDevice   map[string]int64 `json:"per_device_action_bytes,omitempty"`
	CompileSecs float64          `json:"compile_seconds"`
}

// FSDPStep is one device's program: its memory analysis, its traffic, and
// the step priced at the H100 node's rates.
type FSDPStep struct {
	Argument, Output, Alias, Temp, Total, HostTemp int64
	Traffic                                        Traffic
	// ComputeSeconds (the program's arithmetic, recomputation included),
	// LinkSeconds (host↔device copies) and CollectiveSeconds; Serial is
	// their sum (nothing overlapped), Overlapped their maximum (each hidden
	// behind the longest).
	ComputeSeconds, LinkSeconds, CollectiveSeconds float64
	Serial, Overlapped                             float64
}

// fsdpStepOf reads c's analysis and traffic over n devices.
func fsdpStepOf(c *rt.Compiled, n int) *FSDPStep {
	m := c.MemoryAnalysis()
	t := trafficOf(c.Program().Func)
	cost := c.CostAnalysis()
	t.Flops, t.DotFlops = cost.Flops+cost.Transcendentals, cost.DotFlops
	s := &FSDPStep{Argument: m.ArgumentBytes, Output: m.OutputBytes, Alias: m.AliasBytes, Temp: m.TempBytes, Total: m.TotalBytes(),
		HostTemp: m.HostTempBytes, Traffic: t}
	s.ComputeSeconds, s.LinkSeconds, s.CollectiveSeconds = t.Seconds(h100, n)
	s.Serial = s.ComputeSeconds + s.LinkSeconds + s.CollectiveSeconds
	s.Overlapped = max(s.ComputeSeconds, s.LinkSeconds, s.CollectiveSeconds)
	return s
}

// planFSDP compiles the step of size sz (sz.Batch sequences, one per
// device) sharded over n devices twice: with everything kept, and under
// budget bytes per device.
func planFSDP(sz Size, n int, budget int64) (*FSDPReport, error) {
	mesh, err := fsdpSetup(n)
	if err != nil {
		return nil, err
	}
	p, s, ids, targets, err := abstractArgs(sz)
	if err != nil {
		return nil, err
	}
	l := newFSDPLayout(mesh, p, ids)
	compile := func(b int64) (*rt.Compiled, error) {
		low, err := rt.NewJitted(l.step, rt.WithName("llama_fsdp_step"), rt.Donate(0, 1), rt.InShardings(l.in...), rt.OutShardings(l.out...),
			rt.MemoryBudget(b), rt.BudgetRates(h100MatmulFlops, h100ElemFlops, h100HostBytes), rt.BudgetCollectiveBandwidth(h100BusBytes)).Lower(p, s, ids, targets)
		if err != nil {
			return nil, err
		}
		return low.Compile()
	}
	start := time.Now()
	base, err := compile(1 << 62)
	if err != nil {
		return nil, err
	}
	c := sz.Config
	r := &FSDPReport{Devices: n, Layers: c.Layers, D: c.D, Seq: sz.Seq, GlobalBatch: sz.Batch, Parameters: paramCount(p), Budget: budget,
		Unconstrained: *fsdpStepOf(base, n)}
	for i, par := range base.Program().Func.Body.Params {
		switch np := len(trace.Leaves(p)); {
		case i < np:
			r.Params += par.Type.Bytes()
		case i < np+len(trace.Leaves(s)):
			r.OptState += par.Type.Bytes()
		}
	}
	fitted, err := compile(budget)
	r.CompileSecs = time.Since(start).Seconds()
	var be *rt.MemoryBudgetError
	switch {
	case errors.As(err, &be):
		r.Minimum, r.Error = be.Minimum, be.Error()
		return r, nil
	case err != nil:
		return nil, err
	}
	r.Fits, r.Plan, r.Planned = true, fitted.MemoryPlan(), fsdpStepOf(fitted, n)
	r.PerDevice = map[string]int64{}
	for _, v := range r.Plan.Values {
		r.PerDevice[v.Action] += v.Bytes // a device's (the planner plans per device)
	}
	return r, nil
}

func (r *FSDPReport) print(w io.Writer) {
	fmt.Fprintf(w, "Llama-style decoder: %d layers, d %d, seq %d: %.3g parameters; FSDP over %d devices, global batch %d (one sequence per device)\n\n",
		r.Layers, r.D, r.Seq, float64(r.Parameters), r.Devices, r.GlobalBatch)
	fmt.Fprintf(w, "per device: parameters %s, optimizer state %s (its 1/%d of each, donated)\n", gib(r.Params), gib(r.OptState), r.Devices)
	u := r.Unconstrained
	fmt.Fprintf(w, "unconstrained step (everything kept): %s per device (argument %s + output %s − alias %s + temp %s)\n",
		gib(u.Total), gib(u.Argument), gib(u.Output), gib(u.Alias), gib(u.Temp))
	u.printTime(w, r.Devices)
	if !r.Fits {
		fmt.Fprintf(w, "\nbudget %s per device: does not fit; the smallest budget the planner reaches is %s\n%s\n", gib(r.Budget), gib(r.Minimum), r.Error)
		return
	}
	q := r.Planned
	fmt.Fprintf(w, "\nbudget %s per device: fits, %s per device (argument %s + output %s − alias %s + temp %s; pinned_host temp %s), %d compiles, %.1f s\n",
		gib(r.Budget), gib(q.Total), gib(q.Argument), gib(q.Output), gib(q.Alias), gib(q.Temp), gib(q.HostTemp), r.Plan.Compiles, r.CompileSecs)
	actions := make([]string, 0, len(r.PerDevice))
	for a := range r.PerDevice {
		actions = append(actions, a)
	}
	sort.Strings(actions)
	for _, a := range actions {
		fmt.Fprintf(w, "  %-10s %10s per device (the plan's residuals by action, a value and its views each counted)\n", a+":", gib(r.PerDevice[a]))
	}
	q.printTime(w, r.Devices)
	fmt.Fprintf(w, "  = %.2f× the unconstrained sharded step (%.2f× overlapped); the planner's own estimate of the per-device step: %.3f s\n\n",
		q.Serial/u.Serial, q.Overlapped/u.Overlapped, r.Plan.StepSeconds)
	fmt.Fprintln(w, "the plan (global types, one device's bytes):")
	fmt.Fprintln(w, r.Plan.String())
}

// printTime prints what a device moves and the step's estimate.
func (s *FSDPStep) printTime(w io.Writer, n int) {
	t := s.Traffic
	fmt.Fprintf(w, "  gathered %s (all-gather), reduced %s (reduce-scatter) + %s (all-reduce); host link %s in, %s out\n",
		gib(t.AllGather), gib(t.ReduceScatter), gib(t.AllReduce), gib(t.ToDevice), gib(t.ToHost))
	fmt.Fprintf(w, "  step at H100 SXM node rates: compute %.3f s (recomputation included), host link %.3f s, collectives %.3f s over %d devices: %.3f s in turn, %.3f s overlapped\n",
		s.ComputeSeconds, s.LinkSeconds, s.CollectiveSeconds, n, s.Serial, s.Overlapped)
}
