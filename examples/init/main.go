// Command init measures the memory of parameter initialisation, the scenarios
// of "out of memory at initialisation" (REFERENCES §2): an attention-style
// pairwise tensor built eagerly op by op and jitted, a large random matrix
// (measured at a size that fits, analysed at f32[32768, 262144]), and 32
// stacked Transformer blocks generated straight into bfloat16: one layer per
// scan step (nn.NewStack), trace.Vmap of nn.NewBlock over the 32 layer keys,
// and the same Vmap written as Equinox users write it (f32 weights, cast to
// bf16 afterwards), each measured at a size that fits and analysed at the
// size of a 7B model (32 layers, d=4096, MLP hidden 14336). The sharded
// cases generate nn.LecunNormal and nn.Zeros
// matrices with the output sharded over 8 devices (rt.OutShardings, meshes
// (8) and (2, 4)): run at the size of random_matrix on 8 virtual CPU devices
// (main sets FERRY_CPU_DEVICES's count to 8 when it is lower) with each
// device's peak measured and the values compared, bit for bit, with the
// unsharded init; and analysed per device at f32[32768, 262144], 4 GiB a
// device.
//
//	go run ./examples/init [-json] [-quiet]
//	FERRY_BACKEND=cuda go run ./examples/init   # on 8 GPUs, from one process
//
// With FERRY_BACKEND=cuda the devices are the host's GPUs (rt.Devices:
// every GPU the driver sees, CUDA_VISIBLE_DEVICES choosing them), all
// driven from this one process; the sharded cases need 8.
//
// While it runs it says on standard error which case it is at ("case 3/20
// attention_jit: compiling and running…"), in place on a terminal, as lines
// otherwise (internal/progress; -quiet or FERRY_PROGRESS=0 silences it). The
// table gives sizes in binary units (KiB, MiB, GiB); -json gives bytes.
//
// Every measured case resets the device pool's peak (rt.ResetPeakMemory) and
// reads rt.MemoryStats(ir.Device).PeakBytesInUse after the call, minus the
// bytes in use before it. Between cases every array of the last one is deleted
// or collected, and the program waits until the pool is back where it was, so
// no case's peak is lowered by an earlier case's memory being freed while it
// runs (see measure). The goal for jitted initialisers is a peak of at most
// 1.05 × the bytes they return; for sharded ones, on every device, 1.05 ×
// the block it holds (rt.DeviceMemoryStats of each device, measureDevices).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	goruntime "runtime"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/ferryml/ferry/backend"
	_ "github.com/ferryml/ferry/cuda"      // FERRY_BACKEND=cuda: the mesh is this host's GPUs
	_ "github.com/ferryml/ferry/cuda/nccl" // their collectives through NCCL
	"github.com/ferryml/ferry/internal/progress"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// sizes are the dimensions of the cases.
type sizes struct {
	Nodes, Channels               int // attention: pairwise tensor f32[N, N, C]
	MatRows, MatCols              int // random_matrix: f32, measured
	FullRows, FullCols            int // random_matrix_full: f32, analysis only
	Layers, DModel, Heads, Hidden int // stack_bf16 and the stack_vmap cases
	// The 7B-size stack (Llama-2 7B's d and heads, Mistral 7B's MLP width):
	// analysis only.
	BigLayers, BigDModel, BigHeads, BigHidden int
}

// programSizes are the sizes the program measures (chosen to run in a few
// seconds on a CPU): a 64 MiB pairwise tensor, a 128 MiB matrix, the 32 GiB
// matrix of the JAX report (analysed only), a 48 MiB bf16 stack and an 11 GiB
// one (analysed only).
var programSizes = sizes{
	Nodes: 512, Channels: 64,
	MatRows: 4096, MatCols: 8192,
	FullRows: 32768, FullCols: 262144,
	Layers: 32, DModel: 256, Heads: 4, Hidden: 1024,
	BigLayers: 32, BigDModel: 4096, BigHeads: 32, BigHidden: 14336,
}

// row is one case of the report. OutputBytes is always the bytes of the
// whole (global) output. A sharded case also has Sharding, the layout of its
// output, and ShardBytes, the bytes of the block each device holds; its
// PeakDeviceBytes, TempBytes and AnalysedTotalBytes are per device (the
// largest over the mesh's devices where measured), and its Ratio is the
// largest per-device peak (or the analysed per-device total) over
// ShardBytes.
type row struct {
	Case               string  `json:"case"`
	Sharding           string  `json:"sharding,omitempty"`
	OutputBytes        int64   `json:"output_bytes"`
	ShardBytes         int64   `json:"shard_bytes,omitempty"`
	PeakDeviceBytes    int64   `json:"peak_device_bytes"`
	TempBytes          int64   `json:"temp_bytes"`
	AnalysedTotalBytes int64   `json:"analysed_total_bytes"`
	Ratio              float64 `json:"ratio"`
	// PeakPerDevice is the measured peak of every device of a sharded
	// case's mesh, in mesh order.
	PeakPerDevice []int64 `json:"peak_device_bytes_per_device,omitempty"`
	// BitIdentical, for a measured sharded case, says whether the sharded
	// output gathered equals, bit for bit, the output of the same
	// initialiser jitted without a sharding.
	BitIdentical *bool  `json:"bit_identical,omitempty"`
	Note         string `json:"note"`

	analysis passes.MemoryAnalysis // of a jitted case, for the tests
}

// attention builds a pairwise feature tensor f32[n, n, c] for an attention
// block: random node embeddings h, two linear projections q = h·Wq, k = h·Wk,
// the broadcast difference q_i − k_j, then tanh and a per-channel affine map.
// keep, when not nil, is given every intermediate (a user holding references).
func attention(key *trace.Array, n, c int, keep func(*trace.Array)) *trace.Array {
	if keep == nil {
		keep = func(*trace.Array) {}
	}
	ks := random.Keys(key, 5)
	h := random.Normal(ks[0], ir.Float32, ir.Shape{n, c})
	wq := nn.LecunNormal(ks[1], ir.Float32, ir.Shape{c, c})
	wk := nn.LecunNormal(ks[2], ir.Float32, ir.Shape{c, c})
	gamma := trace.Add(trace.Scalar(1), trace.Mul(trace.Scalar(0.02), random.Normal(ks[3], ir.Float32, ir.Shape{c})))
	beta := trace.Mul(trace.Scalar(0.02), random.Normal(ks[4], ir.Float32, ir.Shape{c}))
	q := trace.MatMul(h, wq)
	k := trace.MatMul(h, wk)
	diff := trace.Sub(trace.Reshape(q, n, 1, c), trace.Reshape(k, 1, n, c))
	keep(diff)
	act := trace.Tanh(diff)
	keep(act)
	scaled := trace.Mul(act, gamma)
	keep(scaled)
	return trace.Add(scaled, beta)
}

// randomMatrix returns an initialiser of f32[rows, cols] with N(0, 0.02²)
// values. The generator's counters are u32, so a matrix of more than 2³⁰
// elements is generated by a scan over blocks of rows (one folded-in key per
// block), each block written straight into its slice of the scan's output;
// the result is then f32[nb, rows/nb, cols], the row blocks of the matrix.
func randomMatrix(rows, cols int) func(key *trace.Array) *trace.Array {
	// The partitionable layout numbers elements by their 64-bit index, so one
	// request covers all 2^33 elements of the full matrix, as in JAX.
	return func(key *trace.Array) *trace.Array {
		return trace.Mul(trace.Scalar(0.02), random.Normal(key, ir.Float32, ir.Shape{rows, cols}))
	}
}

// vmapStack returns an initialiser of L stacked Transformer blocks in
// bfloat16 written with trace.Vmap: nn.NewBlock is vectorised over the L keys
// of random.Split(key, L), so every leaf of the result has a leading layer
// axis. Layer i is nn.NewBlock(Index(keys, i)), bit for bit.
//
// With dt = bf16 the blocks are generated straight into bf16. With dt = f32
// it is the pattern of Equinox's filter_vmap over layer keys: f32 weights
// for every layer, then every leaf cast to bf16 (trace.Convert). Jitted, the
// compiler fuses the cast into the generator, so no f32 weight is ever
// stored; as nn's bf16 initialisers draw in f32 and round once, both give the
// same bits.
func vmapStack(dt ir.DType, L, d, heads, hidden int) func(key *trace.Array) nn.Block {
	return func(key *trace.Array) nn.Block {
		blocks := trace.Vmap(func(k *trace.Array) nn.Block {
			return nn.NewBlock(k, dt, d, heads, hidden)
		})(random.Split(key, L))
		out, err := trace.MapAs(blocks, func(a *trace.Array) *trace.Array { return trace.Convert(a, ir.BFloat16) })
		if err != nil {
			panic(err)
		}
		return out
	}
}

// vmapID is the id (see jitted) of vmapStack(dt, L, d, heads, hidden).
func vmapID(dt ir.DType, L, d, heads, hidden int) string {
	return fmt.Sprintf("vmap %v %d %d %d %d", dt, L, d, heads, hidden)
}

// settleTimeout bounds how long measure waits for garbage to be freed.
const settleTimeout = 10 * time.Second

// measure runs f, which returns its outputs, and returns the peak of
// device 0 while it ran above what was in use before it, and the device bytes
// of its outputs on device 0, which it then deletes (measureDevices).
func measure(f func() []*trace.Array) (peak, output int64, err error) {
	peaks, outputs, err := measureDevices(f)
	if err != nil {
		return 0, 0, err
	}
	return peaks[0], outputs[0], nil
}

// measureDevices runs f, which returns its outputs, and returns, for every
// device (indexed by its ID), the device pool's peak while f ran above what
// was in use before it, and the device bytes of f's outputs on that device
// (the blocks of a sharded output on theirs, rt.Shards); it then deletes the
// outputs.
//
// That difference is the case's peak only if nothing in use before f is freed
// while it runs: memory freed then lowers the level that f's allocations
// climb from, so a 64 MiB output once read as a 0.4 MB peak. Eager
// intermediates that f drops are freed by garbage-collector cleanups, which
// run some time after a collection, so measureDevices
//   - before f, collects garbage and waits until nothing more is freed;
//   - after f, deletes the outputs and waits until every device's pool is
//     back to the bytes in use before f, so that f's garbage is gone before
//     the next case (an error after settleTimeout, naming what is still
//     alive);
//   - checks that the bytes in use on each device after f are at least those
//     before f plus the outputs there, which fails if memory held before f
//     was freed during it (an error: the peak would be too small).
func measureDevices(f func() []*trace.Array) (peaks, outputs []int64, err error) {
	quiesce()
	base := inUse()
	rt.ResetPeakMemory()
	outs := f()
	after, peak := inUse(), peakInUse()
	outputs = make([]int64, len(base))
	for _, a := range outs {
		if a.Space() != ir.Device {
			continue
		}
		shards, err := rt.Shards(a)
		if err != nil {
			return nil, nil, err
		}
		for _, s := range shards {
			outputs[s.Device.ID] += bytesOf(s.Array)
		}
	}
	for _, a := range outs {
		if err := a.Delete(); err != nil {
			return nil, nil, err
		}
	}
	for d := range base {
		if after[d]-base[d] < outputs[d] {
			return nil, nil, fmt.Errorf("%d bytes in use on device %d before the case were freed while it ran, so its peak there (%d bytes above the %d before) "+
				"would not hold its %d-byte output: delete earlier arrays before measuring", base[d]+outputs[d]-after[d], d, peak[d]-base[d], base[d], outputs[d])
		}
	}
	if err := settle(base); err != nil {
		return nil, nil, err
	}
	peaks = make([]int64, len(base))
	for d := range base {
		peaks[d] = peak[d] - base[d]
	}
	return peaks, outputs, nil
}

// inUse returns the bytes in use of every device's pool, by device ID.
func inUse() []int64 {
	return deviceStats(func(s rt.MemStats) int64 { return s.BytesInUse })
}

// peakInUse returns the peak bytes in use of every device's pool, by device
// ID.
func peakInUse() []int64 {
	return deviceStats(func(s rt.MemStats) int64 { return s.PeakBytesInUse })
}

// deviceStats returns field of the device pool statistics of every device,
// by device ID.
func deviceStats(field func(rt.MemStats) int64) []int64 {
	devs := rt.Devices()
	out := make([]int64, len(devs))
	for _, d := range devs {
		st, err := rt.DeviceMemoryStats(d, ir.Device)
		if err != nil {
			panic(err) // every device of the default backend has a device pool
		}
		out[d.ID] = field(st)
	}
	return out
}

// quiesce collects garbage until the device pools' bytes in use stop
// falling: the cleanups of unreachable arrays have run.
func quiesce() {
	last := int64(-1)
	for range 100 {
		goruntime.GC()
		time.Sleep(time.Millisecond)
		var n int64
		for _, b := range inUse() {
			n += b
		}
		if n == last {
			return
		}
		last = n
	}
}

// settle collects garbage until every device pool's bytes in use are at most
// want (by device ID), or returns an error naming the largest live arrays
// after settleTimeout.
func settle(want []int64) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		n := inUse()
		over := -1
		for d := range want {
			if n[d] > want[d] {
				over = d
				break
			}
		}
		if over < 0 {
			return nil
		}
		if time.Now().After(deadline) {
			live := rt.LiveArrays()
			return fmt.Errorf("%d bytes still in use on device %d %v after the case, %d more than before it; largest live: %v",
				n[over], over, settleTimeout, n[over]-want[over], live[:min(len(live), 3)])
		}
		goruntime.GC()
		time.Sleep(time.Millisecond)
	}
}

func bytesOf(a *trace.Array) int64 { return a.Type().Bytes() }

// measureCase measures one case into a row: name, peak, output and ratio. A
// compiled call that fails (see jitted) is reported as the case's error.
func measureCase(name, note string, f func() []*trace.Array) (r row, err error) {
	defer recoverCall(name, &r, &err)
	peak, out, err := measure(f)
	if err != nil {
		return row{}, fmt.Errorf("%s: %w", name, err)
	}
	r = row{Case: name, OutputBytes: out, PeakDeviceBytes: peak, Note: note}
	if out > 0 {
		r.Ratio = float64(peak) / float64(out)
	}
	return r, nil
}

// callError is the panic of a function returned by jitted whose call failed.
type callError struct{ err error }

// recoverCall, deferred by a case, turns a callError panic (a compiled call
// that failed) into the case's error; other panics go on.
func recoverCall(name string, r *row, err *error) {
	if e := recover(); e != nil {
		re, ok := e.(callError)
		if !ok {
			panic(e)
		}
		*r, *err = row{}, fmt.Errorf("%s: %w", name, re.err)
	}
}

// programs holds the programs jitted compiled, by case: running the cases
// again in one process (the tests do) does not trace and compile them again.
var programs sync.Map // string → *rt.Compiled

// jitted lowers and compiles fn for key (or finds the program compiled for
// the case named by id before) and returns a function that runs the compiled
// program (the measured call neither traces nor compiles), and its memory
// analysis. id must name the function, every size it depends on and the
// options (rt.OutShardings) it is jitted with. The function panics with a
// callError if the call fails (measureCase reports it).
func jitted[T any](id string, fn func(*trace.Array) T, key *trace.Array, opts ...rt.Option) (func(*trace.Array) T, passes.MemoryAnalysis, error) {
	var cc *rt.Compiled
	if p, ok := programs.Load(id); ok {
		cc = p.(*rt.Compiled)
	} else {
		c, err := rt.NewJitted(fn, opts...).Lower(key)
		if err != nil {
			return nil, passes.MemoryAnalysis{}, err
		}
		if cc, err = c.Compile(); err != nil {
			return nil, passes.MemoryAnalysis{}, err
		}
		programs.Store(id, cc)
	}
	call := func(k *trace.Array) T {
		outs, err := cc.Call(k)
		if err != nil {
			panic(callError{err})
		}
		out, ok := outs[0].(T)
		if !ok {
			panic(callError{fmt.Errorf("the compiled call returned %T, want %T", outs[0], out)})
		}
		return out
	}
	return call, cc.MemoryAnalysis(), nil
}

// withAnalysis adds a compiled analysis to a measured row.
func withAnalysis(r row, m passes.MemoryAnalysis) row {
	r.TempBytes, r.AnalysedTotalBytes, r.analysis = m.TempBytes, m.TotalBytes(), m
	return r
}

// analysed is the row of a case that is lowered and compiled, never run: its
// ratio is the analysed total over the output.
func analysed(name, note string, m passes.MemoryAnalysis) row {
	r := row{Case: name, OutputBytes: m.OutputBytes, TempBytes: m.TempBytes, AnalysedTotalBytes: m.TotalBytes(), Note: note, analysis: m}
	if r.OutputBytes > 0 {
		r.Ratio = float64(r.AnalysedTotalBytes) / float64(r.OutputBytes)
	}
	return r
}

// status reports which case the program is at; nil (the tests) reports
// nothing.
var status *progress.Reporter

// caseLog numbers the cases as run goes through them, for the status line.
type caseLog struct{ n, total int }

// begin says that case name starts, doing what.
func (c *caseLog) begin(name, what string) {
	c.n++
	status.Phase("case %d/%d %s: %s…", c.n, c.total, name, what)
}

// caseCount is the number of rows run returns.
func caseCount(analyses bool) int {
	sharded := len(shardInits) * len(shardLayouts)
	n := 3 + 1 + sharded + 2 + 2 // attention ×3, random_matrix, sharded, stacks, vmap stacks
	if analyses {
		n += 1 + sharded + 3 // random_matrix_full, sharded _full, the 7B stacks
	}
	return n
}

// run measures every case in sequence, in this process, at sizes s, and,
// when analyses is set, adds the analysis-only rows (lowered and compiled,
// never run).
func run(s sizes, analyses bool) ([]row, error) {
	key := random.NewKey(0)
	var rows []row
	cases := &caseLog{total: caseCount(analyses)}
	add := func(r row, err error) error {
		if err == nil {
			rows = append(rows, r)
		}
		return err
	}
	one := func(a *trace.Array) []*trace.Array { return []*trace.Array{a} }

	// Attention, eager, references dropped as the user's code goes.
	cases.begin("attention_eager", "running op by op")
	if err := add(measureCase("attention_eager", "eager, op by op; intermediates are freed only when garbage collected",
		func() []*trace.Array { return one(attention(key, s.Nodes, s.Channels, nil)) })); err != nil {
		return nil, err
	}

	// Attention, eager, the user keeps every intermediate (the JAX report).
	var kept int
	cases.begin("attention_eager_kept", "running op by op")
	r, err := measureCase("attention_eager_kept", "", func() []*trace.Array {
		var held []*trace.Array
		out := attention(key, s.Nodes, s.Channels, func(a *trace.Array) { held = append(held, a) })
		kept = len(held)
		return append(held, out)
	})
	if err != nil {
		return nil, err
	}
	// Only the result is the output; the kept intermediates count in the peak.
	r.OutputBytes = int64(s.Nodes) * int64(s.Nodes) * int64(s.Channels) * 4
	r.Ratio = float64(r.PeakDeviceBytes) / float64(r.OutputBytes)
	r.Note = fmt.Sprintf("eager, %d full-size intermediates kept alive by the caller", kept)
	rows = append(rows, r)

	// Attention, jitted.
	attn := func(k *trace.Array) *trace.Array { return attention(k, s.Nodes, s.Channels, nil) }
	cases.begin("attention_jit", "compiling and running")
	ja, m, err := jitted(fmt.Sprint("attention", s.Nodes, s.Channels), attn, key)
	if err != nil {
		return nil, err
	}
	r, err = measureCase("attention_jit", "jitted: the pairwise chain is one fused kernel writing the output",
		func() []*trace.Array { return one(ja(key)) })
	if err != nil {
		return nil, err
	}
	rows = append(rows, withAnalysis(r, m))

	// A large random matrix, jitted, measured.
	cases.begin("random_matrix", "compiling and running")
	jm, m, err := jitted(fmt.Sprint("random_matrix", s.MatRows, s.MatCols), randomMatrix(s.MatRows, s.MatCols), key)
	if err != nil {
		return nil, err
	}
	r, err = measureCase("random_matrix", fmt.Sprintf("f32[%d, %d], counter-based bits fused into the output", s.MatRows, s.MatCols),
		func() []*trace.Array { return one(jm(key)) })
	if err != nil {
		return nil, err
	}
	rows = append(rows, withAnalysis(r, m))

	// The full f32[32768, 262144] of the JAX report: analysis only.
	if analyses {
		cases.begin("random_matrix_full", "compiling (analysis only)")
		if _, m, err = jitted(fmt.Sprint("random_matrix", s.FullRows, s.FullCols), randomMatrix(s.FullRows, s.FullCols), key); err != nil {
			return nil, err
		}
		rows = append(rows, analysed("random_matrix_full", fmt.Sprintf("f32[%d, %d] lowered and compiled, never run; ratio = analysed total / output (JAX: 112 GiB for 32 GiB)", s.FullRows, s.FullCols), m))
	}

	// Sharded initialisers over 8 devices.
	sr, err := shardedRows(s, key, analyses, cases)
	if err != nil {
		return nil, err
	}
	rows = append(rows, sr...)

	// Stacked Transformer blocks straight into bf16.
	stack := func(key *trace.Array) nn.Stack {
		return nn.NewStack(key, ir.BFloat16, s.Layers, s.DModel, s.Heads, s.Hidden)
	}
	cases.begin("stack_bf16", "compiling and running")
	js, m, err := jitted(fmt.Sprint("stack", s.Layers, s.DModel, s.Heads, s.Hidden), stack, key)
	if err != nil {
		return nil, err
	}
	r, err = measureCase("stack_bf16", fmt.Sprintf("nn.NewStack(bf16, L=%d, d=%d, hidden=%d): one layer per scan step", s.Layers, s.DModel, s.Hidden),
		func() []*trace.Array { return trace.Leaves(js(key)) })
	if err != nil {
		return nil, err
	}
	rows = append(rows, withAnalysis(r, m))

	// The same stack initialised in f32 and then cast to bf16 in the same jit:
	// the compiler moves the cast into the scan (pass scan-sink), so no f32
	// stack is stored.
	stackCast := func(key *trace.Array) nn.Stack {
		st := nn.NewStack(key, ir.Float32, s.Layers, s.DModel, s.Heads, s.Hidden)
		out, err := trace.MapAs(st, func(a *trace.Array) *trace.Array { return trace.Convert(a, ir.BFloat16) })
		if err != nil {
			panic(err)
		}
		return out
	}
	cases.begin("stack_f32_cast", "compiling and running")
	jc, m, err := jitted(fmt.Sprint("stack f32 cast", s.Layers, s.DModel, s.Heads, s.Hidden), stackCast, key)
	if err != nil {
		return nil, err
	}
	r, err = measureCase("stack_f32_cast", fmt.Sprintf("nn.NewStack(f32, L=%d, d=%d, hidden=%d) then trace.Convert to bf16 in the same jit: the cast moves into the scan", s.Layers, s.DModel, s.Hidden),
		func() []*trace.Array { return trace.Leaves(jc(key)) })
	if err != nil {
		return nil, err
	}
	rows = append(rows, withAnalysis(r, m))

	// The same stack with trace.Vmap over the layer keys: straight into bf16,
	// and f32 then cast (the Equinox pattern), jitted.
	vmapCases := []struct {
		name string
		dt   ir.DType
		note string
	}{
		{"stack_vmap_bf16", ir.BFloat16, "trace.Vmap(nn.NewBlock(bf16)) over random.Split(key, %d), d=%d, hidden=%d: straight into bf16"},
		{"stack_vmap_f32_cast", ir.Float32, "trace.Vmap(nn.NewBlock(f32)) over random.Split(key, %d), d=%d, hidden=%d, then trace.Convert to bf16 in the same jit: the cast is fused into the generator"},
	}
	for _, c := range vmapCases {
		cases.begin(c.name, "compiling and running")
		jv, m, err := jitted(vmapID(c.dt, s.Layers, s.DModel, s.Heads, s.Hidden), vmapStack(c.dt, s.Layers, s.DModel, s.Heads, s.Hidden), key)
		if err != nil {
			return nil, err
		}
		r, err = measureCase(c.name, fmt.Sprintf(c.note, s.Layers, s.DModel, s.Hidden),
			func() []*trace.Array { return trace.Leaves(jv(key)) })
		if err != nil {
			return nil, err
		}
		rows = append(rows, withAnalysis(r, m))
	}

	if !analyses {
		return rows, nil
	}
	// The 7B-size stack, analysis only: the scan, and both Vmap cases.
	big := fmt.Sprintf("L=%d, d=%d, heads=%d, hidden=%d, bf16 output; lowered and compiled, never run; ratio = analysed total / output",
		s.BigLayers, s.BigDModel, s.BigHeads, s.BigHidden)
	bigStack := func(key *trace.Array) nn.Stack {
		return nn.NewStack(key, ir.BFloat16, s.BigLayers, s.BigDModel, s.BigHeads, s.BigHidden)
	}
	cases.begin("stack_bf16_7b", "compiling (analysis only)")
	if _, m, err = jitted(fmt.Sprint("stack", s.BigLayers, s.BigDModel, s.BigHeads, s.BigHidden), bigStack, key); err != nil {
		return nil, err
	}
	rows = append(rows, analysed("stack_bf16_7b", "nn.NewStack, "+big, m))
	for _, c := range vmapCases {
		cases.begin(c.name+"_7b", "compiling (analysis only)")
		if _, m, err = jitted(vmapID(c.dt, s.BigLayers, s.BigDModel, s.BigHeads, s.BigHidden), vmapStack(c.dt, s.BigLayers, s.BigDModel, s.BigHeads, s.BigHidden), key); err != nil {
			return nil, err
		}
		how := "trace.Vmap(nn.NewBlock(bf16)), "
		if c.dt != ir.BFloat16 {
			how = "trace.Vmap(nn.NewBlock(f32)) then trace.Convert to bf16, "
		}
		rows = append(rows, analysed(c.name+"_7b", how+big, m))
	}
	return rows, nil
}

func main() {
	asJSON := flag.Bool("json", false, "print one JSON array of rows")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	quiet := flag.Bool("quiet", false, "no progress lines on standard error")
	flag.Parse()
	start := time.Now()
	status = progress.New(os.Stderr).SetQuiet(*quiet)
	status.Phase("measuring %d initialisation cases (compiling each takes a moment)…", caseCount(true))
	// The sharded cases need a mesh of meshDevices devices: give the CPU
	// backend that many before any array is made.
	if n := len(rt.Devices()); n < meshDevices && rt.DefaultBackend().Name() != "cpu" {
		log.Fatalf("the sharded cases need %d devices; the %s backend has %d", meshDevices, rt.DefaultBackend().Name(), n)
	} else if n < meshDevices {
		if err := rt.SetCPUDeviceCount(meshDevices); err != nil {
			log.Fatal(err)
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	rows, err := run(programSizes, true)
	if err != nil {
		status.Clear()
		log.Fatal(err)
	}
	status.Done("%d cases done in %s", len(rows), progress.Seconds(time.Since(start)))
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			log.Fatal(err)
		}
		return
	}
	printTable(os.Stdout, rows)
}

// printTable writes the rows as a table, sizes in binary units; a peak of
// "-" is a case analysed, never run, and its ratio is the analysed total
// over the output (or the block, if sharded).
func printTable(w io.Writer, rows []row) {
	fmt.Fprintf(w, "%-26s %10s %10s %10s %10s %12s  %s\n", "case", "output", "shard", "peak", "temp", "ratio", "note")
	for _, r := range rows {
		shard, peak := "-", "-"
		if r.ShardBytes > 0 {
			shard = backend.FormatBytes(r.ShardBytes)
		}
		if r.PeakDeviceBytes > 0 {
			peak = backend.FormatBytes(r.PeakDeviceBytes)
		}
		fmt.Fprintf(w, "%-26s %10s %10s %10s %10s %12.9f  %s\n", r.Case, backend.FormatBytes(r.OutputBytes), shard, peak,
			backend.FormatBytes(r.TempBytes), r.Ratio, r.Note)
	}
}

// meshDevices is the number of devices of the sharded cases' meshes: main
// gives the CPU backend that many virtual devices when it has fewer.
const meshDevices = 8

// shardLayout is a mesh and the partition spec of a sharded case's output.
type shardLayout struct {
	name  string // the case's suffix
	shape []int
	axes  []string
	spec  ir.PartitionSpec
}

// shardLayouts are the layouts of the sharded cases: rows split
// over a mesh of 8, and rows over x and columns over y of a 2×4 mesh.
var shardLayouts = []shardLayout{
	{"8", []int{8}, []string{"x"}, ir.P("x", "")},
	{"2x4", []int{2, 4}, []string{"x", "y"}, ir.P("x", "y")},
}

// sharding returns the layout's NamedSharding.
func (l shardLayout) sharding() (*ir.NamedSharding, error) {
	m, err := ir.NewMesh(l.shape, l.axes)
	if err != nil {
		return nil, err
	}
	return ir.NewNamedSharding(m, l.spec)
}

// shardInits are the initialisers of the sharded cases.
var shardInits = []struct {
	name string
	init nn.Initializer
}{
	{"lecun", nn.LecunNormal},
	{"zeros", nn.Zeros},
}

// initMatrix returns the initialiser of an f32[rows, cols] matrix by init.
func initMatrix(init nn.Initializer, rows, cols int) func(key *trace.Array) *trace.Array {
	return func(key *trace.Array) *trace.Array { return init(key, ir.Float32, ir.Shape{rows, cols}) }
}

// shardBytes returns the bytes of the block of an f32[rows, cols] array
// that each device holds under sh.
func shardBytes(sh *ir.NamedSharding, rows, cols int) (int64, error) {
	shape, err := sh.ShardShape(ir.Shape{rows, cols})
	if err != nil {
		return 0, err
	}
	return int64(shape.Size()) * int64(ir.Float32.Size()), nil
}

// shardedRows returns the sharded initialiser cases: each of
// shardInits generates an f32[MatRows, MatCols] matrix straight into its
// blocks on the devices of each of shardLayouts, jitted with rt.OutShardings
// (the partitioned program computes the random bits of its device's block
// only). Each case's per-device peaks are measured and its values compared,
// bit for bit, with the same initialiser jitted unsharded. With analyses,
// the same cases at f32[FullRows, FullCols] are lowered and compiled, never
// run (rows named with the suffix _full).
func shardedRows(s sizes, key *trace.Array, analyses bool, cases *caseLog) ([]row, error) {
	var rows, full []row
	for _, in := range shardInits {
		for _, l := range shardLayouts {
			sh, err := l.sharding()
			if err != nil {
				return nil, err
			}
			name := in.name + "_sharded_" + l.name
			cases.begin(name, fmt.Sprintf("compiling and running on %d devices", sh.Mesh.NumDevices()))
			r, err := measureSharded(name, in.init, sh, s.MatRows, s.MatCols, key)
			if err != nil {
				return nil, err
			}
			rows = append(rows, r)
			if !analyses {
				continue
			}
			cases.begin(name+"_full", "compiling (analysis only)")
			_, m, err := jitted(fmt.Sprint(name, " ", sh, " ", s.FullRows, s.FullCols), initMatrix(in.init, s.FullRows, s.FullCols), key, rt.OutShardings(sh))
			if err != nil {
				return nil, fmt.Errorf("%s_full: %w", name, err)
			}
			shard, err := shardBytes(sh, s.FullRows, s.FullCols)
			if err != nil {
				return nil, err
			}
			full = append(full, row{
				Case: name + "_full", Sharding: sh.String(),
				OutputBytes: int64(s.FullRows) * int64(s.FullCols) * 4, ShardBytes: shard,
				TempBytes: m.TempBytes, AnalysedTotalBytes: m.TotalBytes(), Ratio: float64(m.TotalBytes()) / float64(shard),
				Note: fmt.Sprintf("f32[%d, %d] over %v, lowered and compiled, never run; temp and analysed total per device; ratio = analysed per-device total / shard_bytes",
					s.FullRows, s.FullCols, sh.Mesh),
				analysis: m,
			})
		}
	}
	return append(rows, full...), nil
}

// measureSharded measures the case name: init's f32[rows, cols] jitted with
// its output laid out as sh, run on sh's mesh. The row's PeakPerDevice
// holds each mesh device's peak above what it held before, PeakDeviceBytes
// the largest, and Ratio the largest peak over the device's block; every
// device must hold its block of the output (an error if not). BitIdentical
// compares the gathered output with the unsharded jit's.
func measureSharded(name string, init nn.Initializer, sh *ir.NamedSharding, rows, cols int, key *trace.Array) (r row, err error) {
	defer recoverCall(name, &r, &err)
	fn := initMatrix(init, rows, cols)
	js, m, err := jitted(fmt.Sprint(name, " ", sh, " ", rows, cols), fn, key, rt.OutShardings(sh))
	if err != nil {
		return row{}, fmt.Errorf("%s: %w", name, err)
	}
	shard, err := shardBytes(sh, rows, cols)
	if err != nil {
		return row{}, err
	}
	peaks, outputs, err := measureDevices(func() []*trace.Array { return []*trace.Array{js(key)} })
	if err != nil {
		return row{}, fmt.Errorf("%s: %w", name, err)
	}
	r = row{Case: name, Sharding: sh.String(), OutputBytes: int64(rows) * int64(cols) * 4, ShardBytes: shard,
		Note: fmt.Sprintf("f32[%d, %d] over %v, run on its %d devices; peak, temp, analysed total per device; ratio = largest per-device peak / shard_bytes",
			rows, cols, sh.Mesh, sh.Mesh.NumDevices())}
	for _, d := range sh.Mesh.Devices() {
		if outputs[d] != shard {
			return row{}, fmt.Errorf("%s: device %d holds %d bytes of the output, want its %d-byte block", name, d, outputs[d], shard)
		}
		r.PeakPerDevice = append(r.PeakPerDevice, peaks[d])
		r.PeakDeviceBytes = max(r.PeakDeviceBytes, peaks[d])
		r.Ratio = max(r.Ratio, float64(peaks[d])/float64(shard))
	}
	r = withAnalysis(r, m)
	same, err := sameBits(js, fn, name, rows, cols, key)
	if err != nil {
		return row{}, fmt.Errorf("%s: %w", name, err)
	}
	r.BitIdentical = &same
	return r, nil
}

// sameBits reports whether the sharded initialiser js (fn jitted with an
// output sharding) gives, gathered, the bits of fn jitted unsharded for key.
func sameBits(js, fn func(*trace.Array) *trace.Array, name string, rows, cols int, key *trace.Array) (bool, error) {
	ju, _, err := jitted(fmt.Sprint(name, " unsharded ", rows, cols), fn, key)
	if err != nil {
		return false, err
	}
	// A literal of a device array is its pool memory: compare before
	// deleting.
	a, b := js(key), ju(key)
	la, err := a.Literal()
	if err != nil {
		return false, err
	}
	lb, err := b.Literal()
	if err != nil {
		return false, err
	}
	same := la.Type.EqualUnsharded(lb.Type) && bytes.Equal(la.Data, lb.Data)
	if err := a.Delete(); err != nil {
		return false, err
	}
	return same, b.Delete()
}
