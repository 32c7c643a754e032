// Command cpu measures Ferry's CPU backend in one run:
//
//   - sgemm: GFLOP/s of an n×n×n float32 product for n = 256 … 2048 through
//     cpu/gemm directly (ferry_gflops), through a jitted trace.MatMul
//     (ferry_jit_gflops, which includes the call overhead and the result's
//     allocation), and through gonum's pure-Go Sgemm (gonum_gflops);
//     ratio = ferry_gflops / gonum_gflops;
//   - fused: gelu(x*w+b) (tanh form) over x f32[4096,1024] with w and b
//     f32[1024] broadcast, jitted, against copy() of the same 16 MiB; both
//     count the bytes read and written of the full-size arrays (2×16 MiB),
//     ratio = fused_gbps / copy_gbps;
//   - mlp: one training step of a 784→512→512→10 ReLU MLP with softmax
//     cross-entropy and SGD on a batch of 128, jitted with the parameters
//     donated (mlp_step_ms). bench/gomlx runs the same step in GoMLX;
//   - transformer: examples/transformer's training step at its defaults
//     (nn.TransformerLM, AdamW), its model FLOPs (the forward and backward
//     matrix products, counted by rt.Lowered.CostAnalysis) per second, and
//     that rate as a fraction of the FMA peak (bench/internal/fmapeak: an
//     FMA loop on every core) measured in the same run (not in the default
//     sections: -sections transformer).
//
// Measurements alternate between the contenders and keep each one's best.
//
//	go run ./bench/cpu            # tables
//	go run ./bench/cpu -json      # one JSON object
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/ferryml/ferry/bench/internal/host"
	"github.com/ferryml/ferry/cpu/gemm"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// SgemmRow is one size of the sgemm section.
type SgemmRow struct {
	N        int     `json:"n"`
	Ferry    float64 `json:"ferry_gflops"`
	FerryJit float64 `json:"ferry_jit_gflops"`
	Gonum    float64 `json:"gonum_gflops"`
	Ratio    float64 `json:"ratio"`
}

// FusedRow is the fused elementwise section.
type FusedRow struct {
	Elements int     `json:"elements"`
	Fused    float64 `json:"fused_gbps"`
	Copy     float64 `json:"copy_gbps"`
	Ratio    float64 `json:"ratio"`
}

// MLPRow is the training-step section.
type MLPRow struct {
	Batch  int     `json:"batch"`
	Layers string  `json:"layers"`
	StepMS float64 `json:"mlp_step_ms"`
	Loss   float64 `json:"final_loss"`
}

// Report is the whole run.
type Report struct {
	Machine string     `json:"machine"`
	Threads int        `json:"threads"`
	Kernel  string     `json:"kernel"`
	Sgemm   []SgemmRow `json:"sgemm"`
	Fused   []FusedRow `json:"fused"`
	MLP     []MLPRow   `json:"mlp"`
	// Transformer is the transformer section.
	Transformer []TransformerRow `json:"transformer"`
}

func main() {
	jsonOut := flag.Bool("json", false, "print one JSON object")
	rounds := flag.Int("rounds", 3, "alternating rounds per measurement (best of N)")
	sizesFlag := flag.String("sizes", "256,512,1024,2048", "sgemm sizes")
	steps := flag.Int("steps", 20, "MLP training steps per round")
	sections := flag.String("sections", "sgemm,fused,mlp", "sections to run")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}

	rep := Report{Machine: host.CPU(), Threads: runtime.GOMAXPROCS(0), Kernel: gemm.Kernel()}
	if strings.Contains(*sections, "sgemm") {
		for _, f := range strings.Split(*sizesFlag, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				log.Fatalf("bad size %q", f)
			}
			rep.Sgemm = append(rep.Sgemm, benchSgemm(n, *rounds))
		}
	}
	if strings.Contains(*sections, "fused") {
		rep.Fused = append(rep.Fused, benchFused(4096, 1024, *rounds))
	}
	if strings.Contains(*sections, "mlp") {
		rep.MLP = append(rep.MLP, benchMLP(128, []int{784, 512, 512, 10}, *steps, *rounds))
	}
	if strings.Contains(*sections, "transformer") {
		rep.Transformer = append(rep.Transformer, benchTransformer(*steps, *rounds))
	}
	if *jsonOut {
		enc := json.NewEncoder(os.Stdout)
		if err := enc.Encode(rep); err != nil {
			log.Fatal(err)
		}
		return
	}
	fmt.Printf("machine: %s, %d threads, gemm kernel %s\n\n", rep.Machine, rep.Threads, rep.Kernel)
	if len(rep.Sgemm) > 0 {
		fmt.Println("| n | ferry GFLOP/s | ferry jit GFLOP/s | gonum GFLOP/s | ratio |")
		fmt.Println("| --- | --- | --- | --- | --- |")
		for _, r := range rep.Sgemm {
			fmt.Printf("| %d | %.1f | %.1f | %.1f | %.1f× |\n", r.N, r.Ferry, r.FerryJit, r.Gonum, r.Ratio)
		}
		fmt.Println()
	}
	for _, r := range rep.Fused {
		fmt.Printf("fused gelu(x*w+b), %d f32: %.1f GB/s; copy: %.1f GB/s; ratio %.2f\n", r.Elements, r.Fused, r.Copy, r.Ratio)
	}
	for _, r := range rep.MLP {
		fmt.Printf("MLP training step, batch %d, %s: %.2f ms/step (loss %.4f)\n", r.Batch, r.Layers, r.StepMS, r.Loss)
	}
	for _, r := range rep.Transformer {
		fmt.Printf("Transformer training step, %s: %.1f ms/step, %.2f GFLOP a step, %.1f GFLOP/s; FMA peak %.1f GFLOP/s (%s): %.1f%% of peak (loss %.4f)\n",
			r.Config, r.StepMS, r.ModelGFLOP, r.GFLOPS, r.PeakGFLOPS, r.PeakISA, 100*r.OfPeak, r.Loss)
	}
}

func randF32(n int, seed uint64, scale float32) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	s := make([]float32, n)
	for i := range s {
		s[i] = (rng.Float32()*2 - 1) * scale
	}
	return s
}

// timeIt returns the time of one call of f, averaged over enough calls to
// last about minMS milliseconds.
func timeIt(f func(), minMS int) time.Duration {
	reps := 1
	for {
		t0 := time.Now()
		for i := 0; i < reps; i++ {
			f()
		}
		d := time.Since(t0)
		if d >= time.Duration(minMS)*time.Millisecond || reps >= 1<<20 {
			return d / time.Duration(reps)
		}
		reps *= 2
	}
}

// best alternates the functions for rounds rounds and returns each one's
// best time.
func best(rounds int, minMS []int, fs ...func()) []time.Duration {
	out := make([]time.Duration, len(fs))
	for i, f := range fs {
		f() // warm up (and compile)
		out[i] = time.Hour
	}
	for r := 0; r < rounds; r++ {
		for i, f := range fs {
			out[i] = min(out[i], timeIt(f, minMS[i]))
		}
	}
	return out
}

func benchSgemm(n, rounds int) SgemmRow {
	a, b, c := randF32(n*n, 1, 1), randF32(n*n, 2, 1), make([]float32, n*n)
	var impl gonum.Implementation
	ferry := func() { gemm.Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n) }
	gon := func() { impl.Sgemm(blas.NoTrans, blas.NoTrans, n, n, n, 1, a, n, b, n, 0, c, n) }
	mm := rt.Jit(func(x, y *trace.Array) *trace.Array { return trace.MatMul(x, y) })
	xa, ya := rt.FromSlice(a, n, n), rt.FromSlice(b, n, n)
	jit := func() {
		z := mm(xa, ya)
		if err := z.Delete(); err != nil {
			log.Fatal(err)
		}
	}
	ts := best(rounds, []int{20, 20, 2}, ferry, jit, gon)
	flop := 2 * float64(n) * float64(n) * float64(n)
	g := func(d time.Duration) float64 { return flop / d.Seconds() / 1e9 }
	r := SgemmRow{N: n, Ferry: g(ts[0]), FerryJit: g(ts[1]), Gonum: g(ts[2])}
	r.Ratio = r.Ferry / r.Gonum
	return r
}

func benchFused(rows, cols, rounds int) FusedRow {
	n := rows * cols
	xs := randF32(n, 3, 2)
	x := rt.FromSlice(xs, rows, cols)
	w, b := rt.FromSlice(randF32(cols, 4, 1), cols), rt.FromSlice(randF32(cols, 5, 1), cols)
	f := rt.Jit(func(x, w, b *trace.Array) *trace.Array {
		return trace.Gelu(trace.Add(trace.Mul(x, w), b), true)
	})
	fused := func() {
		y := f(x, w, b)
		if err := y.Delete(); err != nil {
			log.Fatal(err)
		}
	}
	dst := make([]float32, n)
	cp := func() { copy(dst, xs) }
	ts := best(rounds, []int{50, 50}, fused, cp)
	bytes := 2 * 4 * float64(n)
	r := FusedRow{Elements: n, Fused: bytes / ts[0].Seconds() / 1e9, Copy: bytes / ts[1].Seconds() / 1e9}
	r.Ratio = r.Fused / r.Copy
	return r
}

// Layer is one dense layer's parameters.
type Layer struct{ W, B *trace.Array }

// MLP is the model's parameters.
type MLP struct{ Layers []Layer }

func forward(p MLP, x *trace.Array) *trace.Array {
	h := x
	for i, l := range p.Layers {
		h = trace.Add(trace.MatMul(h, l.W), l.B)
		if i < len(p.Layers)-1 {
			h = trace.Relu(h)
		}
	}
	return h
}

// lossFn is the mean softmax cross-entropy of the logits against one-hot
// labels.
func lossFn(p MLP, x, onehot *trace.Array) *trace.Array {
	logp := trace.LogSoftmax(forward(p, x), -1)
	return trace.Neg(trace.Mean(trace.Sum(trace.Mul(onehot, logp), 1)))
}

func benchMLP(batch int, sizes []int, steps, rounds int) MLPRow {
	var p MLP
	for i := 0; i+1 < len(sizes); i++ {
		in, out := sizes[i], sizes[i+1]
		scale := float32(math.Sqrt(6 / float64(in))) // He-uniform
		p.Layers = append(p.Layers, Layer{
			W: rt.FromSlice(randF32(in*out, uint64(10+i), scale), in, out),
			B: rt.FromSlice(make([]float32, out), out),
		})
	}
	x := rt.FromSlice(randF32(batch*sizes[0], 7, 1), batch, sizes[0])
	labels := make([]float32, batch*sizes[len(sizes)-1])
	for i := 0; i < batch; i++ {
		labels[i*sizes[len(sizes)-1]+i%sizes[len(sizes)-1]] = 1
	}
	y := rt.FromSlice(labels, batch, sizes[len(sizes)-1])
	const lr = 0.01
	step := rt.Jit(func(p MLP, x, y *trace.Array) (MLP, *trace.Array) {
		loss, g := trace.ValueAndGrad(func(p MLP) *trace.Array { return lossFn(p, x, y) })(p)
		var np MLP
		for i, l := range p.Layers {
			np.Layers = append(np.Layers, Layer{
				W: trace.Sub(l.W, trace.Mul(trace.Scalar(lr), g.Layers[i].W)),
				B: trace.Sub(l.B, trace.Mul(trace.Scalar(lr), g.Layers[i].B)),
			})
		}
		return np, loss
	}, rt.Donate(0))
	var loss float64
	run := func() {
		for i := 0; i < steps; i++ {
			var l *trace.Array
			p, l = step(p, x, y)
			loss = l.Item()
		}
	}
	run() // compile, warm up
	bestT := time.Hour
	for r := 0; r < rounds; r++ {
		t0 := time.Now()
		run()
		bestT = min(bestT, time.Since(t0)/time.Duration(steps))
	}
	var names []string
	for _, s := range sizes {
		names = append(names, strconv.Itoa(s))
	}
	return MLPRow{Batch: batch, Layers: strings.Join(names, "→"), StepMS: float64(bestT.Microseconds()) / 1000, Loss: loss}
}
