// Command sharded trains three models partitioned over N virtual CPU devices
// and compares each with the same training on one device:
//
//   - dp: a data-parallel MLP: the batch split over the mesh axis "data",
//     parameters and optimizer state replicated; the gradients are partial
//     sums the partitioner all-reduces.
//   - tp: a Megatron-style tensor-parallel Transformer block: attention's
//     Wq, Wk, Wv and the first MLP layer split by columns (heads and hidden
//     units) over "model", Wo and the second MLP layer by rows: one
//     all-reduce after each row-parallel matmul.
//   - fsdp: a stacked-layer Transformer language model trained FSDP-style:
//     every parameter and Adam's moments split over "fsdp", the batch too;
//     each scan step gathers one layer's parameters (nn.WithLayerParams
//     constrains them to their layout) and the layer's gradient is reduced
//     back to its split layout.
//
// For each it prints the per-device memory analysis of the training step
// (and the one-device step's for comparison), the collectives of the
// per-device program, the step time of both, and the largest difference of
// the parameters after the steps from the one-device run.
//
//	go run ./examples/sharded                      # 8 devices, every mode
//	FERRY_BACKEND=cuda go run ./examples/sharded -devices 4   # 4 GPUs, one process
//	go run ./examples/sharded -devices 4 -json     # one JSON row per mode
//	go run ./examples/sharded -mode fsdp -steps 3
//	go run ./examples/sharded -mode fsdp -budget 0.5  # a memory budget per device: half the step's per-device total
//
// With -budget f each sharded step is compiled under rt.MemoryBudget of f
// times its unconstrained per-device total: the budget is per device, and
// the planner plans the per-device program. The arguments of a sharded run
// are laid out on the mesh before the steps, so a device's measured peak is
// the step's own (its argument blocks and what it allocates), comparable
// with the per-device analysis. FERRY_ASYNC_COLLECTIVES=0 runs the
// collectives in turn instead of beside the compute (the next layer's
// all-gather overlapping the current layer).
//
// Under mpirun it runs one mesh over the devices of every process
// (rt.InitDistributed), -devices per process, and process 0 prints:
//
//	go build -o /tmp/sharded ./examples/sharded
//	mpirun -np 2 /tmp/sharded -devices 2          # 4 devices in 2 processes
//
// Sizes are printed in binary units (KiB, MiB, GiB); -json gives bytes. While
// it compiles and trains it says what it is doing on standard error
// ("dp on 8 devices: step 3/5, 2.1 ms"), in place on a terminal, as lines
// otherwise (internal/progress; -quiet or FERRY_PROGRESS=0 silences it; under
// mpirun only process 0 reports).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective/mpi"
	_ "github.com/ferryml/ferry/cuda"      // FERRY_BACKEND=cuda: the mesh is this host's GPUs
	_ "github.com/ferryml/ferry/cuda/nccl" // their collectives through NCCL
	"github.com/ferryml/ferry/internal/progress"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Row is one mode's report.
type Row struct {
	Mode    string `json:"mode"`
	Devices int    `json:"devices"`
	Mesh    string `json:"mesh"`
	Steps   int    `json:"steps"`
	// ParamBytes and StateBytes are the global sizes of the parameters and
	// the optimizer state.
	ParamBytes int64 `json:"param_bytes"`
	StateBytes int64 `json:"state_bytes"`
	// LayerBytes is one layer's parameters (fsdp).
	LayerBytes int64 `json:"layer_bytes,omitempty"`
	// PerDevice is the memory analysis of the partitioned step on each
	// device; Single that of the one-device step.
	PerDevice Memory `json:"per_device"`
	Single    Memory `json:"single_device"`
	// PeakDeviceBytes is each device's measured peak during the sharded
	// steps: its blocks of the arguments (laid out before the steps) plus
	// what the steps allocate above what it held before; the mesh's devices
	// of this process under mpirun.
	PeakDeviceBytes []int64 `json:"peak_device_bytes"`
	// Collectives counts the collective ops of the per-device program, by
	// name (inside scan bodies counted once).
	Collectives map[string]int `json:"collectives"`
	// StepMillis and SingleStepMillis are the median step times after the
	// first (compiling) step.
	StepMillis       float64 `json:"step_ms"`
	SingleStepMillis float64 `json:"single_step_ms"`
	// Loss is the last step's loss, sharded and on one device.
	Loss       float64 `json:"loss"`
	SingleLoss float64 `json:"single_loss"`
	// MaxAbsDiff is the largest difference of a parameter after the steps
	// from the one-device run, MaxAbsParam the largest parameter.
	MaxAbsDiff  float64 `json:"max_abs_diff"`
	MaxAbsParam float64 `json:"max_abs_param"`
	// AnalysisOnly rows are lowered and compiled, never run.
	AnalysisOnly bool `json:"analysis_only,omitempty"`
	// ForwardCollectives counts the collectives of the forward pass alone
	// (tp: one all-reduce per column- then row-parallel pair).
	ForwardCollectives map[string]int `json:"forward_collectives,omitempty"`
	// ExpectedPerDevice (fsdp) is (parameters + state)/devices + one
	// layer, the bytes FSDP is meant to need per device besides
	// activations.
	ExpectedPerDevice int64 `json:"expected_per_device,omitempty"`
	// Budget is the memory budget per device the sharded run was planned
	// under (-budget), and Unconstrained its per-device total without one.
	Budget        int64 `json:"budget,omitempty"`
	Unconstrained int64 `json:"unconstrained,omitempty"`
}

// Memory is a step's memory analysis in bytes.
type Memory struct {
	Argument int64 `json:"argument"`
	Output   int64 `json:"output"`
	Alias    int64 `json:"alias"`
	Temp     int64 `json:"temp"`
	Total    int64 `json:"total"`
}

func memoryOf(a passes.MemoryAnalysis) Memory {
	return Memory{Argument: a.ArgumentBytes, Output: a.OutputBytes, Alias: a.AliasBytes, Temp: a.TempBytes, Total: a.TotalBytes()}
}

func main() {
	devices := flag.Int("devices", 8, "devices of the mesh (virtual CPU devices, or GPUs with FERRY_BACKEND=cuda)")
	mode := flag.String("mode", "all", "dp, tp, fsdp, fsdp_analysis or all")
	steps := flag.Int("steps", 5, "training steps")
	asJSON := flag.Bool("json", false, "print one JSON object per mode")
	quiet := flag.Bool("quiet", false, "no progress lines on standard error")
	flag.Float64Var(&BudgetFraction, "budget", 0, "train the sharded runs under a memory budget per device of this fraction of the unconstrained per-device total")
	flag.Parse()
	start := time.Now()
	status = progress.New(os.Stderr).SetQuiet(*quiet)
	status.Phase("starting %d devices…", *devices)
	if err := setup(*devices); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if mpi.InMPIJob() {
		// One mesh over every process's devices: -devices per process.
		if err := rt.InitDistributed(rt.DistributedConfig{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer func() {
			if err := rt.ShutdownDistributed(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}()
		*devices *= rt.ProcessCount()
		status.SetQuiet(*quiet || rt.ProcessIndex() != 0)
		if rt.ProcessIndex() == 0 {
			status.Clear()
			fmt.Printf("%d processes, %d devices each\n", rt.ProcessCount(), len(rt.LocalDevices()))
		}
	}
	modes := []string{"dp", "tp", "fsdp", "fsdp_analysis"}
	if *mode != "all" {
		modes = []string{*mode}
	}
	for _, m := range modes {
		sizes := Small
		if m == "fsdp_analysis" {
			sizes = Large
		}
		r, err := Run(m, *devices, *steps, sizes)
		status.Clear()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", m, err)
			os.Exit(1)
		}
		if rt.ProcessIndex() != 0 {
			continue // process 0 prints for the job
		}
		if *asJSON {
			b, _ := json.Marshal(r)
			fmt.Println(string(b))
			continue
		}
		print(r)
	}
	status.Done("%d modes done in %s", len(modes), progress.Seconds(time.Since(start)))
}

// status says what the program is doing; nil (the tests) says nothing.
var status *progress.Reporter

// setup gives the CPU backend n devices (before any array exists). Another
// backend (FERRY_BACKEND=cuda: every GPU of the host, driven from this
// process) must have n devices already.
func setup(n int) error {
	if n < 1 {
		return fmt.Errorf("-devices %d: want at least 1", n)
	}
	if have := len(rt.Devices()); have < n && rt.DefaultBackend().Name() != "cpu" {
		return fmt.Errorf("-devices %d: the %s backend has %d devices", n, rt.DefaultBackend().Name(), have)
	} else if have < n {
		return rt.SetCPUDeviceCount(n)
	}
	return nil
}

func print(r Row) {
	mib := backend.FormatBytes
	fmt.Printf("%s on %s (%d devices), %d steps\n", r.Mode, r.Mesh, r.Devices, r.Steps)
	fmt.Printf("  parameters %s, optimizer state %s", mib(r.ParamBytes), mib(r.StateBytes))
	if r.LayerBytes > 0 {
		fmt.Printf(", one layer %s", mib(r.LayerBytes))
	}
	fmt.Println()
	fmt.Printf("  per device: arguments %s, temp %s, output %s, total %s (one device: total %s)\n",
		mib(r.PerDevice.Argument), mib(r.PerDevice.Temp), mib(r.PerDevice.Output), mib(r.PerDevice.Total), mib(r.Single.Total))
	if r.Budget > 0 {
		fmt.Printf("  memory budget per device %s (%.2f of the unconstrained %s)\n", mib(r.Budget), float64(r.Budget)/float64(r.Unconstrained), mib(r.Unconstrained))
	}
	if len(r.PeakDeviceBytes) > 0 {
		peaks := make([]string, len(r.PeakDeviceBytes))
		for i, p := range r.PeakDeviceBytes {
			peaks[i] = mib(p)
		}
		fmt.Printf("  measured peak per device: %s\n", strings.Join(peaks, ", "))
	}
	fmt.Printf("  collectives in the per-device program: %s\n", collectives(r.Collectives))
	if r.ForwardCollectives != nil {
		fmt.Printf("  collectives of the forward pass alone: %s\n", collectives(r.ForwardCollectives))
	}
	if r.ExpectedPerDevice > 0 {
		fmt.Printf("  (parameters + state)/%d + one layer = %s; per-device total / that = %.2f\n", r.Devices, mib(r.ExpectedPerDevice), float64(r.PerDevice.Total)/float64(r.ExpectedPerDevice))
	}
	if r.AnalysisOnly {
		return
	}
	fmt.Printf("  step %.2f ms (one device %.2f ms); loss %.6f (one device %.6f); max |Δparam| %.3g of max |param| %.3g\n",
		r.StepMillis, r.SingleStepMillis, r.Loss, r.SingleLoss, r.MaxAbsDiff, r.MaxAbsParam)
}

// collectives lists counts of collectives by name: "2 all_gather, 1
// all_reduce".
func collectives(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var cs []string
	for _, k := range keys {
		cs = append(cs, fmt.Sprintf("%d %s", counts[k], k))
	}
	if len(cs) == 0 {
		return "none"
	}
	return strings.Join(cs, ", ")
}

// Sizes are the models' dimensions.
type Sizes struct {
	Batch, In, Hidden, Classes int // dp
	T, D, Heads, FF            int // tp and fsdp
	Vocab, Layers              int // fsdp
}

// Small are the sizes the example runs at.
var Small = Sizes{Batch: 64, In: 64, Hidden: 256, Classes: 16, T: 16, D: 64, Heads: 8, FF: 256, Vocab: 128, Layers: 4}

// Large are the sizes of the fsdp_analysis row: a language model whose
// parameters and Adam state (300 MiB) dwarf its activations, lowered and
// compiled only.
var Large = Sizes{Batch: 32, T: 16, D: 512, Heads: 8, FF: 2048, Vocab: 1024, Layers: 8}

// Run trains mode on a mesh of n devices for steps steps at sizes s, and on
// one device, and reports both.
func Run(mode string, n, steps int, s Sizes) (Row, error) {
	switch mode {
	case "dp":
		return runDP(n, steps, s)
	case "tp":
		return runTP(n, steps, s)
	case "fsdp":
		return runFSDP(n, steps, s, false)
	case "fsdp_analysis":
		return runFSDP(n, 1, s, true)
	}
	return Row{}, fmt.Errorf("unknown mode %q (want dp, tp, fsdp, fsdp_analysis or all)", mode)
}

// mesh1 is a one-axis mesh of n devices.
func mesh1(n int, name string) (*ir.Mesh, error) { return ir.NewMesh([]int{n}, []string{name}) }

// shardings gives every leaf of tree the sharding spec(leaf) on mesh.
func shardings(mesh *ir.Mesh, tree any, spec func(a *trace.Array) ir.PartitionSpec) ([]*ir.NamedSharding, error) {
	var out []*ir.NamedSharding
	for _, a := range trace.Leaves(tree) {
		s, err := ir.NewNamedSharding(mesh, spec(a))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// replicated is the spec of a whole array.
func replicated(*trace.Array) ir.PartitionSpec { return ir.P() }

// bytesOf sums the bytes of the leaves of trees.
func bytesOf(trees ...any) int64 {
	var n int64
	for _, t := range trees {
		for _, a := range trace.Leaves(t) {
			n += a.Type().Bytes()
		}
	}
	return n
}

// trainer is one training setup: params and state, a step, its batches.
type trainer[P, S any] struct {
	params  P
	state   S
	step    func(P, S, *trace.Array, *trace.Array) (P, S, *trace.Array)
	batches [][2]*trace.Array
	// in, when set, are the shardings of the step's argument leaves
	// (parameters, state, x, y): train lays them out so before the steps.
	in      []*ir.NamedSharding
	analyse bool   // lower and compile only
	name    string // for the status line: the mode and its devices
}

// layOut lays the parameters, state and batches out as tr.in says, so
// that the steps find their arguments' blocks in place.
func (tr *trainer[P, S]) layOut() error {
	i := 0
	put := func(a *trace.Array) *trace.Array {
		b, err := rt.DevicePut(a, tr.in[i])
		if err != nil {
			panic(err)
		}
		i++
		return b
	}
	var err error
	if tr.params, err = trace.MapAs(tr.params, put); err != nil {
		return err
	}
	if tr.state, err = trace.MapAs(tr.state, put); err != nil {
		return err
	}
	if i+2 != len(tr.in) {
		return fmt.Errorf("%d shardings for %d argument leaves", len(tr.in), i+2)
	}
	tr.batches, err = layOut(tr.batches, tr.in[i:])
	return err
}

// result is a training run.
type result[P any] struct {
	params   P
	loss     float64
	ms       float64
	analysis passes.MemoryAnalysis
	program  string
	peaks    []int64
}

// train runs the steps with jit options opts and returns the final
// parameters, the last loss, the median step time, the step's memory
// analysis and per-device program, and each device's measured peak. With
// tr.analyse it only lowers and compiles the step.
func train[P, S any](tr trainer[P, S], devs int, opts ...rt.Option) (res result[P], err error) {
	defer trace.Recover(&err)
	status.Phase("%s: tracing and compiling the training step…", tr.name)
	if tr.in != nil {
		if err = tr.layOut(); err != nil {
			return res, err
		}
	}
	// The parameters and state are donated: each step writes the new ones
	// over the old (on every device, its blocks).
	j := rt.NewJitted(tr.step, append(opts, rt.Donate(0, 1))...)
	b0 := tr.batches[0]
	l, err := j.Lower(tr.params, tr.state, b0[0], b0[1])
	if err != nil {
		return res, err
	}
	c, err := l.Compile()
	if err != nil {
		return res, err
	}
	res.analysis, res.program = c.MemoryAnalysis(), c.OptimizedIR()
	if tr.analyse {
		return res, nil
	}
	// The steps call the program compiled above: nothing is traced or
	// compiled (no constant made) while the peaks are measured.
	step := func(p P, s S, x, y *trace.Array) (P, S, *trace.Array) {
		outs, err := c.Call(p, s, x, y)
		if err != nil {
			panic(err)
		}
		return outs[0].(P), outs[1].(S), outs[2].(*trace.Array)
	}
	p, s := tr.params, tr.state
	// This process's devices of the mesh (devices 0 to devs-1): all of
	// them in one process.
	var mine []rt.Device
	for _, d := range rt.LocalDevices() {
		if d.ID < devs {
			mine = append(mine, d)
		}
	}
	// The peak is measured above what a device holds before the steps;
	// laid out in place (tr.in), the step's arguments are part of that,
	// and count as the analysis counts them.
	var args int64
	if tr.in != nil {
		args = res.analysis.ArgumentBytes
	}
	// Arrays no longer referenced free their device memory when collected:
	// collect them now, not while the steps run.
	for range 3 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	before := make([]int64, len(mine))
	for i, d := range mine {
		st, err := rt.DeviceMemoryStats(d, ir.Device)
		if err != nil {
			return res, err
		}
		before[i] = st.BytesInUse
	}
	rt.ResetPeakMemory()
	var times []float64
	var loss *trace.Array
	for i, b := range tr.batches {
		start := time.Now()
		p, s, loss = step(p, s, b[0], b[1])
		times = append(times, float64(time.Since(start).Microseconds())/1000)
		status.Update("%s: step %d/%d, %.1f ms", tr.name, i+1, len(tr.batches), times[len(times)-1])
	}
	res.loss = loss.Item() // after the steps: what it reads back is not in their peaks
	for i, d := range mine {
		st, err := rt.DeviceMemoryStats(d, ir.Device)
		if err != nil {
			return res, err
		}
		res.peaks = append(res.peaks, st.PeakBytesInUse-before[i]+args)
	}
	if len(times) > 1 {
		times = times[1:]
	}
	slices.Sort(times)
	res.ms = times[len(times)/2]
	res.params = p
	return res, nil
}

// trainBoth trains sharded with opts on n devices, then single on one
// device, and fills r from both.
func trainBoth[P, S any](r *Row, sharded, single trainer[P, S], n int, opts ...rt.Option) error {
	sharded.name = fmt.Sprintf("%s on %d devices", r.Mode, n)
	single.name = fmt.Sprintf("%s on one device", r.Mode)
	single.in = nil
	opts, budget, unconstrained, err := withBudget(sharded, opts)
	if err != nil {
		return err
	}
	r.Budget, r.Unconstrained = budget, unconstrained
	a, err := train(sharded, n, opts...)
	if err != nil {
		return err
	}
	b, err := train(single, n)
	if err != nil {
		return err
	}
	compare(r, a, b)
	return nil
}

// compare fills the row from the sharded and one-device runs.
func compare[P any](r *Row, sharded, single result[P]) {
	r.PerDevice, r.Single = memoryOf(sharded.analysis), memoryOf(single.analysis)
	r.PeakDeviceBytes = sharded.peaks
	r.StepMillis, r.SingleStepMillis = sharded.ms, single.ms
	r.Loss, r.SingleLoss = sharded.loss, single.loss
	r.Collectives = countCollectives(sharded.program)
	if r.AnalysisOnly {
		return
	}
	a, b := trace.Leaves(sharded.params), trace.Leaves(single.params)
	for i := range a {
		x, y := a[i].Float64s(), b[i].Float64s()
		for k := range x {
			r.MaxAbsDiff = math.Max(r.MaxAbsDiff, math.Abs(x[k]-y[k]))
			r.MaxAbsParam = math.Max(r.MaxAbsParam, math.Abs(y[k]))
		}
	}
}

// countCollectives counts the collective ops of a program's text by name.
func countCollectives(program string) map[string]int {
	out := map[string]int{}
	for _, c := range []string{"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute"} {
		if k := strings.Count(program, " "+c+"("); k > 0 {
			out[c] = k
		}
	}
	return out
}

// inputs returns steps batches of random features [batch, in] and int32
// labels [batch] below classes.
func inputs(key *trace.Array, steps int, xShape ir.Shape, classes int, labelShape ir.Shape) [][2]*trace.Array {
	var out [][2]*trace.Array
	for i, k := range random.Keys(key, steps) {
		ks := random.Keys(k, 2)
		x := rt.Jit(func(k *trace.Array) *trace.Array { return random.Normal(k, ir.Float32, xShape) })(ks[0])
		y := rt.Jit(func(k *trace.Array) *trace.Array {
			return trace.Convert(trace.Floor(random.Uniform(k, ir.Float32, labelShape, 0, float64(classes))), ir.Int32)
		})(ks[1])
		_ = i
		out = append(out, [2]*trace.Array{x, y})
	}
	return out
}

// runDP trains the data-parallel MLP.
func runDP(n, steps int, s Sizes) (Row, error) {
	mesh, err := mesh1(n, "data")
	if err != nil {
		return Row{}, err
	}
	key := random.NewKey(1)
	params := rt.Jit(func(k *trace.Array) nn.MLP {
		return nn.NewMLP(k, ir.Float32, []int{s.In, s.Hidden, s.Hidden, s.Classes}, nn.Relu)
	})(key)
	opt := optim.Adam[nn.MLP](optim.Constant(1e-2), 0.9, 0.999, 1e-8)
	state, err := opt.Init(params)
	if err != nil {
		return Row{}, err
	}
	tr := trainer[nn.MLP, optim.AdamState[nn.MLP]]{params: params, state: state,
		batches: inputs(random.NewKey(2), steps, ir.Shape{s.Batch, s.In}, s.Classes, ir.Shape{s.Batch}),
		step: func(p nn.MLP, st optim.AdamState[nn.MLP], x, y *trace.Array) (nn.MLP, optim.AdamState[nn.MLP], *trace.Array) {
			loss, g := trace.ValueAndGrad(func(p nn.MLP) *trace.Array { return nn.SoftmaxCrossEntropy(p.Apply(x), y) })(p)
			p, st, err := optim.Step(opt, g, st, p)
			if err != nil {
				panic(err)
			}
			return p, st, loss
		}}
	// Parameters and state replicated, the batch split over "data".
	in, err := shardings(mesh, []any{params, state}, replicated)
	if err != nil {
		return Row{}, err
	}
	batch, err := shardings(mesh, tr.batches[0], func(a *trace.Array) ir.PartitionSpec { return ir.P("data") })
	if err != nil {
		return Row{}, err
	}
	out, err := shardings(mesh, []any{params, state}, replicated)
	if err != nil {
		return Row{}, err
	}
	r := Row{Mode: "dp", Devices: n, Mesh: mesh.String(), Steps: steps, ParamBytes: bytesOf(params), StateBytes: bytesOf(state)}
	sharded := tr
	sharded.in = append(append([]*ir.NamedSharding{}, in...), batch...)
	return r, trainBoth(&r, sharded, tr, n, rt.InShardings(sharded.in...), rt.OutShardings(out...))
}

// tpSpec is the Megatron layout of a Block's leaf on the mesh axis
// "model": attention's Wq, Wk, Wv and the first MLP layer by columns
// (heads, hidden units; the first layer's bias alike), Wo and the second
// MLP layer's weight by rows; layer norms and the last bias replicated.
func tpSpecs(mesh *ir.Mesh, b nn.Block) ([]*ir.NamedSharding, error) {
	col, row := ir.P("", "model"), ir.P("model", "")
	specs := map[*trace.Array]ir.PartitionSpec{
		b.Attn.Wq: col, b.Attn.Wk: col, b.Attn.Wv: col, b.Attn.Wo: row,
		b.MLP.Layers[0].W: col, b.MLP.Layers[0].B: ir.P("model"), b.MLP.Layers[1].W: row,
	}
	return shardings(mesh, b, func(a *trace.Array) ir.PartitionSpec { return specs[a] })
}

// runTP trains the tensor-parallel block on a regression to a random
// target.
func runTP(n, steps int, s Sizes) (Row, error) {
	mesh, err := mesh1(n, "model")
	if err != nil {
		return Row{}, err
	}
	params := rt.Jit(func(k *trace.Array) nn.Block { return nn.NewBlock(k, ir.Float32, s.D, s.Heads, s.FF) })(random.NewKey(3))
	opt := optim.SGD[nn.Block](optim.Constant(0.05))
	state, err := opt.Init(params)
	if err != nil {
		return Row{}, err
	}
	batchShape := ir.Shape{s.Batch / 8, s.T, s.D}
	var batches [][2]*trace.Array
	for _, k := range random.Keys(random.NewKey(4), steps) {
		ks := random.Keys(k, 2)
		x := rt.Jit(func(k *trace.Array) *trace.Array { return random.Normal(k, ir.Float32, batchShape) })(ks[0])
		y := rt.Jit(func(k *trace.Array) *trace.Array { return random.Normal(k, ir.Float32, batchShape) })(ks[1])
		batches = append(batches, [2]*trace.Array{x, y})
	}
	tr := trainer[nn.Block, optim.CountState]{params: params, state: state, batches: batches,
		step: func(p nn.Block, st optim.CountState, x, y *trace.Array) (nn.Block, optim.CountState, *trace.Array) {
			loss, g := trace.ValueAndGrad(func(p nn.Block) *trace.Array {
				d := trace.Sub(p.Apply(x), y)
				return trace.Mean(trace.Mul(d, d))
			})(p)
			p, st, err := optim.Step(opt, g, st, p)
			if err != nil {
				panic(err)
			}
			return p, st, loss
		}}
	ps, err := tpSpecs(mesh, params)
	if err != nil {
		return Row{}, err
	}
	rest, err := shardings(mesh, []any{state, batches[0]}, replicated)
	if err != nil {
		return Row{}, err
	}
	r := Row{Mode: "tp", Devices: n, Mesh: mesh.String(), Steps: steps, ParamBytes: bytesOf(params), StateBytes: bytesOf(state)}
	// The forward pass alone: one all-reduce after attention's Wo and one
	// after the MLP's second layer.
	xShard, err := shardings(mesh, batches[0][0], replicated)
	if err != nil {
		return r, err
	}
	fwd, err := rt.NewJitted(func(p nn.Block, x *trace.Array) *trace.Array { return p.Apply(x) },
		rt.InShardings(append(ps, xShard...)...)).Lower(params, batches[0][0])
	if err != nil {
		return r, err
	}
	fc, err := fwd.Compile()
	if err != nil {
		return r, err
	}
	r.ForwardCollectives = countCollectives(fc.OptimizedIR())
	sharded := tr
	sharded.in = append(append([]*ir.NamedSharding{}, ps...), rest...)
	return r, trainBoth(&r, sharded, tr, n, rt.InShardings(sharded.in...), rt.OutShardings(ps...))
}

// fsdpSpec splits a leaf over "fsdp" along its first dimension after skip
// that n divides (none: replicated).
func fsdpSpec(a *trace.Array, skip, n int) ir.PartitionSpec {
	spec := make(ir.PartitionSpec, a.Rank())
	for d := skip; d < a.Rank(); d++ {
		if a.Shape()[d]%n == 0 {
			spec[d] = []string{"fsdp"}
			return spec
		}
	}
	return spec
}

// runFSDP trains the stacked-layer language model FSDP-style (with
// analyse, only lowers and compiles its step).
func runFSDP(n, steps int, s Sizes, analyse bool) (Row, error) {
	mesh, err := mesh1(n, "fsdp")
	if err != nil {
		return Row{}, err
	}
	params := rt.Jit(func(k *trace.Array) nn.TransformerLM {
		return nn.NewTransformerLM(k, ir.Float32, s.Vocab, s.T, s.Layers, s.D, s.Heads, s.FF)
	})(random.NewKey(5))
	opt := optim.Adam[nn.TransformerLM](optim.Constant(1e-3), 0.9, 0.999, 1e-8)
	state, err := opt.Init(params)
	if err != nil {
		return Row{}, err
	}
	// Stacked block leaves split after their layer dimension, the others
	// along their first dimension that n divides.
	blocks := map[*trace.Array]bool{}
	for _, a := range trace.Leaves(params.Blocks) {
		blocks[a] = true
	}
	specOf := map[*trace.Array]ir.PartitionSpec{}
	for _, a := range trace.Leaves(params) {
		skip := 0
		if blocks[a] {
			skip = 1
		}
		specOf[a] = fsdpSpec(a, skip, n)
	}
	pShard, err := shardings(mesh, params, func(a *trace.Array) ir.PartitionSpec { return specOf[a] })
	if err != nil {
		return Row{}, err
	}
	// Adam's moments (Mu, Nu) are laid out like the parameters; its count
	// (a scalar) is whole.
	count, err := ir.NewNamedSharding(mesh, ir.P())
	if err != nil {
		return Row{}, err
	}
	sShard := append(append([]*ir.NamedSharding{count}, pShard...), pShard...)
	if len(sShard) != len(trace.Leaves(state)) {
		return Row{}, fmt.Errorf("Adam's state has %d leaves, want %d", len(trace.Leaves(state)), len(sShard))
	}
	// Inside the scan, each layer's parameters keep the split of their stack.
	layerShard := func(b nn.Block) nn.Block {
		out, err := trace.MapAs(b, func(a *trace.Array) *trace.Array {
			sh, err := ir.NewNamedSharding(mesh, fsdpSpec(a, 0, n))
			if err != nil {
				panic(err)
			}
			return trace.WithShardingConstraint(a, sh)
		})
		if err != nil {
			panic(err)
		}
		return out
	}
	batch := s.Batch / 4
	var batches [][2]*trace.Array
	for _, k := range random.Keys(random.NewKey(6), steps) {
		ids := rt.Jit(func(k *trace.Array) *trace.Array {
			return trace.Convert(trace.Floor(random.Uniform(k, ir.Float32, ir.Shape{batch, s.T + 1}, 0, float64(s.Vocab))), ir.Int32)
		})(k)
		batches = append(batches, [2]*trace.Array{trace.SliceAxis(ids, 1, 0, s.T), trace.SliceAxis(ids, 1, 1, s.T+1)})
	}
	mk := func(opts ...nn.StackOption) func(p nn.TransformerLM, st optim.AdamState[nn.TransformerLM], x, y *trace.Array) (nn.TransformerLM, optim.AdamState[nn.TransformerLM], *trace.Array) {
		return func(p nn.TransformerLM, st optim.AdamState[nn.TransformerLM], x, y *trace.Array) (nn.TransformerLM, optim.AdamState[nn.TransformerLM], *trace.Array) {
			loss, g := trace.ValueAndGrad(func(p nn.TransformerLM) *trace.Array { return p.Loss(x, y, opts...) })(p)
			p, st, err := optim.Step(opt, g, st, p)
			if err != nil {
				panic(err)
			}
			return p, st, loss
		}
	}
	bShard, err := shardings(mesh, batches[0], func(a *trace.Array) ir.PartitionSpec { return fsdpSpec(a, 0, n) })
	if err != nil {
		return Row{}, err
	}
	r := Row{Mode: "fsdp", Devices: n, Mesh: mesh.String(), Steps: steps, ParamBytes: bytesOf(params), StateBytes: bytesOf(state),
		LayerBytes: bytesOf(params.Blocks) / int64(s.Layers), AnalysisOnly: analyse}
	r.ExpectedPerDevice = (r.ParamBytes+r.StateBytes)/int64(n) + r.LayerBytes
	if analyse {
		r.Mode, r.Steps = "fsdp_analysis", 0
	}
	tr := trainer[nn.TransformerLM, optim.AdamState[nn.TransformerLM]]{params: params, state: state, batches: batches,
		step: mk(nn.WithLayerParams(layerShard)), analyse: analyse}
	in := append(append(append([]*ir.NamedSharding{}, pShard...), sShard...), bShard...)
	single := tr
	single.step = mk() // no layer constraints on one device
	tr.in = in
	return r, trainBoth(&r, tr, single, n, rt.InShardings(in...), rt.OutShardings(append(append([]*ir.NamedSharding{}, pShard...), sShard...)...))
}
