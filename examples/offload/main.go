// Command offload builds the 10-layer scanned model of the host-offloading
// tutorial (../shared/REFERENCES.md §1), compiles jit(grad(loss)) with respect to
// the weights, prints Ferry's memory analysis beside XLA's figures, runs it, and
// reports the allocator's measured device peak.
//
//	go run ./examples/offload          # a table
//	go run ./examples/offload -json    # one JSON array of rows
//	go run ./examples/offload -html d  # and d/CASE.html, each case's memory report
//	go run ./examples/offload -budget  # rt.MemoryBudget against hand-written choices (budget.go)
//	FERRY_BACKEND=cuda go run ./examples/offload   # on an NVIDIA GPU
//
// Sizes in the tables are in binary units (KiB, MiB, GiB); -json gives bytes.
// While it compiles and runs it says what it is doing on standard error, in
// place on a terminal, as lines otherwise (internal/progress; -quiet or
// FERRY_PROGRESS=0 silences it).
//
// Cases (REFERENCES.md §1):
//
//   - baseline: a plain scan;
//   - activation_offload: the layer input tagged checkpoint_name(x, "x"), the
//     layer wrapped in remat with save_and_offload_only_these_names(saved=[],
//     offloaded=["x"], device, pinned_host): the scan stacks every layer's
//     input in pinned_host and the backward pass recomputes the rest;
//   - activation_param_offload: as above, with w1 and w2 placed in pinned_host
//     and the layer moving its slice to device (device_put) itself.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"os"
	goruntime "runtime"
	"time"

	"github.com/ferryml/ferry/backend"
	_ "github.com/ferryml/ferry/cuda" // FERRY_BACKEND=cuda runs it on the GPU
	"github.com/ferryml/ferry/internal/progress"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Weights are the stacked layer weights: W1 f32[L,D,H], W2 f32[L,H,D].
type Weights struct{ W1, W2 *trace.Array }

// Model sizes of REFERENCES.md §1.
type Model struct{ Layers, D, H int }

// Row is one line of the report; the JSON keys are the ones the issue names.
type Row struct {
	Case              string  `json:"case"`
	TempBytes         int64   `json:"temp_bytes"`
	ArgumentBytes     int64   `json:"argument_bytes"`
	OutputBytes       int64   `json:"output_bytes"`
	AliasBytes        int64   `json:"alias_bytes"`
	TotalBytes        int64   `json:"total_bytes"`
	HostTempBytes     int64   `json:"host_temp_bytes"`
	HostArgumentBytes int64   `json:"host_argument_bytes"`
	HostOutputBytes   int64   `json:"host_output_bytes"`
	PeakDeviceBytes   int64   `json:"peak_device_bytes"`
	MaxAbsGradDiff    float64 `json:"max_abs_grad_diff"`
	XLATempBytes      int64   `json:"xla_temp_bytes"`
	XLATotalBytes     int64   `json:"xla_total_bytes"`
	Seconds           float64 `json:"seconds"`
	// Dim is the width the analysis is for and ExecDim the width executed
	// (the optimizer cases analyse DIM = 7168 and run a small DIM).
	Dim     int `json:"dim,omitempty"`
	ExecDim int `json:"exec_dim,omitempty"`
}

const mib = 1 << 20

// xla holds XLA's figures from REFERENCES.md §1 (temp, total) in bytes.
var xla = map[string][2]int64{
	"baseline":                 {int64(17.25 * mib), int64(57.50 * mib)},
	"activation_offload":       {int64(6.50 * mib), int64(46.75 * mib)},
	"activation_param_offload": {int64(4.75 * mib), int64(25.00 * mib)},
}

// layer is one layer: y = x @ w1; x = y @ w2.
func layer(x *trace.Array, w Weights) *trace.Array {
	return trace.MatMul(trace.MatMul(x, w.W1), w.W2)
}

// baselineLoss scans the layers over axis 0 of the stacked weights.
func baselineLoss(w Weights, x *trace.Array) *trace.Array {
	final, _ := trace.ScanTree(func(x *trace.Array, w Weights) (*trace.Array, struct{}) {
		return layer(x, w), struct{}{}
	}, x, w)
	return trace.Sum(final)
}

// offloadPolicy offloads the values named "x" to pinned_host and recomputes
// everything else.
var offloadPolicy = trace.SaveAndOffloadOnlyTheseNames(nil, []string{"x"}, ir.Device, ir.PinnedHost)

// offloadedLayer is the layer with its input named "x", under remat.
var offloadedLayer = trace.Remat(func(x *trace.Array, w Weights) *trace.Array {
	return layer(trace.CheckpointName(x, "x"), w)
}, offloadPolicy)

// activationOffloadLoss scans the remat layer: every layer's input is stacked
// in pinned_host by the forward scan and read back by the backward scan.
func activationOffloadLoss(w Weights, x *trace.Array) *trace.Array {
	final, _ := trace.ScanTree(func(x *trace.Array, w Weights) (*trace.Array, struct{}) {
		return offloadedLayer(x, w), struct{}{}
	}, x, w)
	return trace.Sum(final)
}

// paramOffloadLayer also moves the layer's weights (pinned_host slices of the
// stacked weights) to device, inside the remat: the backward pass copies them
// in again rather than keeping them.
var paramOffloadLayer = trace.Remat(func(x *trace.Array, w Weights) *trace.Array {
	w = Weights{W1: trace.DevicePut(w.W1, ir.Device), W2: trace.DevicePut(w.W2, ir.Device)}
	return layer(trace.CheckpointName(x, "x"), w)
}, offloadPolicy)

// paramOffloadLoss is activationOffloadLoss over weights kept in pinned_host.
func paramOffloadLoss(w Weights, x *trace.Array) *trace.Array {
	final, _ := trace.ScanTree(func(x *trace.Array, w Weights) (*trace.Array, struct{}) {
		return paramOffloadLayer(x, w), struct{}{}
	}, x, w)
	return trace.Sum(final)
}

// unrolledLoss is the same model as a plain Go loop: the reference.
func unrolledLoss(w Weights, x *trace.Array) *trace.Array {
	n := w.W1.Shape()[0]
	for i := 0; i < n; i++ {
		x = layer(x, Weights{W1: trace.Index(w.W1, i), W2: trace.Index(w.W2, i)})
	}
	return trace.Sum(x)
}

func gradOf(loss func(Weights, *trace.Array) *trace.Array) func(Weights, *trace.Array) Weights {
	return func(w Weights, x *trace.Array) Weights {
		return trace.Grad(func(w Weights) *trace.Array { return loss(w, x) })(w)
	}
}

func randn(r *rand.Rand, scale float64, shape ...int) *trace.Array {
	n := 1
	for _, d := range shape {
		n *= d
	}
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64() * scale)
	}
	return rt.FromSlice(s, shape...)
}

func maxAbsDiff(a hostGrads, b Weights) float64 {
	m := 0.0
	for _, p := range []struct {
		x []float32
		y *trace.Array
	}{{a.W1, b.W1}, {a.W2, b.W2}} {
		x, y := p.x, p.y.Float32s()
		for i := range x {
			m = math.Max(m, math.Abs(float64(x[i])-float64(y[i])))
		}
	}
	return m
}

// hostGrads are gradients copied out of the device pool as Go slices.
type hostGrads struct{ W1, W2 []float32 }

// hostCopy copies the gradients into Go slices and deletes the device buffers,
// so they do not count in the next case's measured peak.
func hostCopy(g Weights) hostGrads {
	h := hostGrads{W1: g.W1.Float32s(), W2: g.W2.Float32s()}
	_ = g.W1.Delete()
	_ = g.W2.Delete()
	return h
}

// collect lets buffers that are garbage go back to the pools before a measurement.
func collect() {
	for range 3 {
		goruntime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

// status says what the program is doing; nil (the tests) says nothing.
var status *progress.Reporter

// run compiles and runs one case and fills its row.
// Only the arguments may be live while a case runs, so that the measured peak
// is the program's own.
func run(name string, loss func(Weights, *trace.Array) *trace.Array, w Weights, x *trace.Array) (Row, Weights, error) {
	status.Phase("%s: tracing and compiling jit(grad(loss))…", name)
	j := rt.NewJitted(gradOf(loss), rt.WithName(name))
	low, err := j.Lower(w, x)
	if err != nil {
		return Row{}, Weights{}, err
	}
	c, err := low.Compile()
	if err != nil {
		return Row{}, Weights{}, err
	}
	if err := writeHTML(name, c); err != nil {
		return Row{}, Weights{}, err
	}
	m := c.MemoryAnalysis()
	status.Update("%s: running…", name)
	collect()
	rt.ResetPeakMemory()
	start := time.Now()
	outs, err := c.Call(w, x)
	if err != nil {
		return Row{}, Weights{}, err
	}
	secs := time.Since(start).Seconds()
	peak := rt.MemoryStats(ir.Device).PeakBytesInUse
	g := outs[0].(Weights)
	row := Row{
		Case: name, TempBytes: m.TempBytes, ArgumentBytes: m.ArgumentBytes, OutputBytes: m.OutputBytes,
		AliasBytes: m.AliasBytes, TotalBytes: m.TotalBytes(), HostTempBytes: m.HostTempBytes,
		HostArgumentBytes: m.HostArgumentBytes, HostOutputBytes: m.HostOutputBytes,
		PeakDeviceBytes: peak, XLATempBytes: xla[name][0], XLATotalBytes: xla[name][1], Seconds: secs,
	}
	return row, g, nil
}

func main() {
	asJSON := flag.Bool("json", false, "print one JSON array of rows")
	layers := flag.Int("layers", 10, "number of scanned layers")
	d := flag.Int("d", 256, "model width (x is f32[d,d])")
	h := flag.Int("h", 1024, "hidden width")
	seed := flag.Uint64("seed", 1, "random seed for the weights and input")
	optDim := flag.Int("opt-dim", 7168, "optimizer cases: width analysed")
	optExec := flag.Int("opt-exec-dim", 256, "optimizer cases: width executed and compared")
	flag.StringVar(&htmlDir, "html", "", "write each case's memory report (CASE.html) into this directory")
	quiet := flag.Bool("quiet", false, "no progress lines on standard error")
	flag.Parse()
	start := time.Now()
	status = progress.New(os.Stderr).SetQuiet(*quiet)
	status.Phase("making the %d-layer model's weights…", *layers)

	r := rand.New(rand.NewPCG(*seed, 2))
	x := randn(r, 1, *d, *d)
	w := Weights{W1: randn(r, 1/math.Sqrt(float64(*d)), *layers, *d, *h), W2: randn(r, 1/math.Sqrt(float64(*h)), *layers, *h, *d)}

	// The weights again, in pinned_host, for the parameter-offload case.
	wHost := Weights{W1: trace.DevicePut(w.W1, ir.PinnedHost), W2: trace.DevicePut(w.W2, ir.PinnedHost)}
	if *budgetFlag { // budget.go
		if err := runBudget(w, wHost, x, *asJSON); err != nil {
			status.Clear()
			log.Fatal(err)
		}
		return
	}

	var rows []Row
	var grads []hostGrads
	for _, c := range []struct {
		name string
		loss func(Weights, *trace.Array) *trace.Array
		host bool // the weights live in pinned_host
	}{{"baseline", baselineLoss, false}, {"activation_offload", activationOffloadLoss, false}, {"activation_param_offload", paramOffloadLoss, true}} {
		cw := w
		if c.host {
			// Only the host copy may be live: free the device weights.
			cw = wHost
			_ = w.W1.Delete()
			_ = w.W2.Delete()
		}
		row, g, err := run(c.name, c.loss, cw, x)
		if err != nil {
			status.Clear()
			log.Fatal(err)
		}
		// Keep the gradients on the host side of the comparison only: copy them
		// out and free the device buffers before the next case.
		rows, grads = append(rows, row), append(grads, hostCopy(g))
	}
	// The reference: the unrolled program's gradient, computed after the
	// measured runs (from the host copy of the weights, moved back).
	status.Phase("the reference: compiling and running the unrolled loop's gradient…")
	w = Weights{W1: trace.DevicePut(wHost.W1, ir.Device), W2: trace.DevicePut(wHost.W2, ir.Device)}
	ref, err := rt.Jit(func(w Weights, x *trace.Array) (Weights, error) { return gradOf(unrolledLoss)(w, x), nil })(w, x)
	if err != nil {
		status.Clear()
		log.Fatal(err)
	}
	for i := range rows {
		rows[i].MaxAbsGradDiff = maxAbsDiff(grads[i], ref)
	}
	ref, w, wHost, x = Weights{}, Weights{}, Weights{}, nil
	optRows, err := optimizerRows(*optDim, *optExec, *seed)
	if err != nil {
		status.Clear()
		log.Fatal(err)
	}
	rows = append(rows, optRows...)
	status.Done("%d cases compiled and run in %s", len(rows), progress.Seconds(time.Since(start)))

	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			log.Fatal(err)
		}
		return
	}
	fmt.Printf("jit(grad(loss)) of the %d-layer scanned model, x f32[%d,%d], w1 f32[%d,%d,%d], w2 f32[%d,%d,%d]; device memory:\n\n",
		*layers, *d, *d, *layers, *d, *h, *layers, *h, *d)
	printTables(os.Stdout, rows)
	fmt.Printf("\noptimizer cases: analysis at DIM = %d, executed (peak, max|Δ| of params and state vs the device-only run after 3 steps) at DIM = %d\n", *optDim, *optExec)
}

// printTables writes the rows' device memory (analysis, measured peak, XLA's
// figures) and then their host memory, sizes in binary units.
func printTables(w io.Writer, rows []Row) {
	f := func(b int64) string { return fmt.Sprintf("%10s", backend.FormatBytes(b)) }
	fmt.Fprintf(w, "%-26s %10s %10s %10s %10s %10s %10s %10s %10s %12s\n", "case", "temp", "argument", "output", "alias", "total", "peak", "XLA temp", "XLA total", "max|Δgrad|")
	for _, r := range rows {
		fmt.Fprintf(w, "%-26s %s %s %s %s %s %s %s %s %12.3g\n", r.Case, f(r.TempBytes), f(r.ArgumentBytes), f(r.OutputBytes),
			f(r.AliasBytes), f(r.TotalBytes), f(r.PeakDeviceBytes), f(r.XLATempBytes), f(r.XLATotalBytes), r.MaxAbsGradDiff)
	}
	fmt.Fprintln(w, "\nhost (pinned_host) memory:")
	fmt.Fprintf(w, "%-26s %10s %10s %10s\n", "case", "temp", "argument", "output")
	for _, r := range rows {
		fmt.Fprintf(w, "%-26s %s %s %s\n", r.Case, f(r.HostTempBytes), f(r.HostArgumentBytes), f(r.HostOutputBytes))
	}
}
