// Command soak runs a small jitted MLP training step with its parameters and
// optimizer state donated (rt.Donate(0, 1)) for many steps — a million by
// default — and checks that the process stays flat: every -every steps it
// samples the Go heap in use (after a collection), the device bytes in use
// (rt.MemoryStats), the live arrays (rt.LiveArrays) and the goroutine count,
// and at the end says whether each stayed within 1% of its value after the
// warm-up. It exits with status 1 if one did not.
//
// Donation must hand each step's parameter and state buffers on to the next
// step without growing anything: a training loop runs millions of steps.
//
//	go run ./bench/soak                        # 1,000,000 steps, a line per 100,000
//	go run ./bench/soak -steps 200000 -every 20000
//	go run ./bench/soak -json                  # one JSON object (progress on stderr)
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	goruntime "runtime"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Sample is the process's state after Step steps.
type Sample struct {
	Step        int     `json:"step"`
	HeapBytes   uint64  `json:"go_heap_bytes"`    // Go heap in use after a collection (HeapAlloc)
	DeviceBytes int64   `json:"device_bytes"`     // rt.MemoryStats(device).BytesInUse
	LiveArrays  int     `json:"live_arrays"`      // len(rt.LiveArrays())
	Goroutines  int     `json:"goroutines"`       // runtime.NumGoroutine
	Loss        float64 `json:"loss"`             // the last step's training loss
	StepsPerSec float64 `json:"steps_per_second"` // since the previous sample
}

// Check is the verdict on one quantity: its value after the warm-up, the
// range it took from then on, and whether that range is within Tolerance of
// the reference.
type Check struct {
	Name      string  `json:"name"`
	Reference float64 `json:"reference"`
	Min       float64 `json:"min"`
	Max       float64 `json:"max"`
	Drift     float64 `json:"drift"` // max |value − reference| / reference
	Flat      bool    `json:"flat"`
}

// Report is the whole run, printed by -json.
type Report struct {
	Steps       int      `json:"steps"`
	Every       int      `json:"every"`
	Warmup      int      `json:"warmup"`
	Layers      []int    `json:"layers"`
	Batch       int      `json:"batch"`
	Optimizer   string   `json:"optimizer"`
	Tolerance   float64  `json:"tolerance"`
	Seconds     float64  `json:"seconds"`
	StepsPerSec float64  `json:"steps_per_second"`
	Samples     []Sample `json:"samples"`
	Checks      []Check  `json:"checks"`
	Flat        bool     `json:"flat"`
}

// tolerance is how far (relative) a quantity may move after the warm-up.
const tolerance = 0.01

func main() {
	steps := flag.Int("steps", 1_000_000, "training steps")
	every := flag.Int("every", 0, "sample every N steps (default steps/10)")
	warmup := flag.Int("warmup", 0, "steps before the reference sample (default: the first sample, steps/10)")
	batch := flag.Int("batch", 8, "minibatch size")
	jsonOut := flag.Bool("json", false, "print one JSON object at the end (the sample lines go to stderr)")
	flag.Parse()
	if *steps <= 0 {
		fail("-steps %d: want a positive number", *steps)
	}
	if *every <= 0 {
		*every = max(1, *steps/10)
	}
	if *warmup <= 0 {
		*warmup = *every
	}
	if *warmup >= *steps {
		fail("-warmup %d: want fewer than -steps %d", *warmup, *steps)
	}
	rep, err := run(*steps, *every, *warmup, *batch, func(s Sample) {
		out := os.Stdout
		if *jsonOut {
			out = os.Stderr // progress while the JSON waits for the end
		}
		fmt.Fprintf(out, "step %9d  go heap %10s  device %10s  live arrays %3d  goroutines %3d  loss %.4f  %8.0f steps/s\n",
			s.Step, mib(float64(s.HeapBytes)), mib(float64(s.DeviceBytes)), s.LiveArrays, s.Goroutines, s.Loss, s.StepsPerSec)
	})
	if err != nil {
		fail("%v", err)
	}
	if *jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		fmt.Printf("%d steps in %.1f s (%.0f steps/s); after the warm-up (step %d):\n", rep.Steps, rep.Seconds, rep.StepsPerSec, rep.Warmup)
		for _, c := range rep.Checks {
			verdict := "flat"
			if !c.Flat {
				verdict = "NOT FLAT"
			}
			fmt.Printf("  %-12s %s: reference %.0f, range %.0f..%.0f, drift %.3f%% (limit %.0f%%)\n",
				c.Name, verdict, c.Reference, c.Min, c.Max, 100*c.Drift, 100*rep.Tolerance)
		}
	}
	if !rep.Flat {
		os.Exit(1)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "soak: "+format+"\n", args...)
	os.Exit(2)
}

func mib(b float64) string { return fmt.Sprintf("%.3f MiB", b/(1<<20)) }

// run trains a 16→32→4 ReLU MLP with Adam on one fixed random batch of a
// learnable task (the class is the argmax of the first four features), the
// parameters and state donated to every step, and samples every `every`
// steps (and after the last).
func run(steps, every, warmup, batch int, report func(Sample)) (Report, error) {
	layers := []int{16, 32, 4}
	rep := Report{Steps: steps, Every: every, Warmup: warmup, Layers: layers, Batch: batch, Optimizer: "adam", Tolerance: tolerance}
	opt := optim.Adam[nn.MLP](optim.Constant(1e-3), 0.9, 0.999, 1e-8)
	params := rt.Jit(func(key *trace.Array) nn.MLP {
		return nn.NewMLP(key, ir.Float32, layers, nn.Relu)
	})(random.NewKey(1))
	state, err := opt.Init(params)
	if err != nil {
		return rep, err
	}
	step := rt.Jit(func(p nn.MLP, s optim.AdamState[nn.MLP], x, y *trace.Array) (nn.MLP, optim.AdamState[nn.MLP], *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p nn.MLP) *trace.Array {
			return nn.SoftmaxCrossEntropy(p.Apply(x), y)
		})(p)
		p, s, err := optim.Step(opt, g, s, p)
		return p, s, loss, err
	}, rt.Donate(0, 1), rt.WithName("soak_step"))

	rng := rand.New(rand.NewPCG(1, 2))
	xs := make([]float32, batch*layers[0])
	ys := make([]int32, batch)
	for i := range batch {
		best := 0
		for j := range layers[0] {
			xs[i*layers[0]+j] = float32(rng.NormFloat64())
			if j < layers[2] && xs[i*layers[0]+j] > xs[i*layers[0]+best] {
				best = j
			}
		}
		ys[i] = int32(best)
	}
	x := rt.FromSlice(xs, batch, layers[0])
	y := rt.FromSlice(ys, batch)

	start := time.Now()
	last, lastStep := start, 0
	var loss *trace.Array
	for i := 1; i <= steps; i++ {
		if loss != nil {
			_ = loss.Delete()
		}
		if params, state, loss, err = step(params, state, x, y); err != nil {
			return rep, fmt.Errorf("step %d: %w", i, err)
		}
		if i%every != 0 && i != steps {
			continue
		}
		now := time.Now()
		s := sample(i)
		s.Loss = loss.Item()
		s.StepsPerSec = float64(i-lastStep) / now.Sub(last).Seconds()
		last, lastStep = time.Now(), i
		rep.Samples = append(rep.Samples, s)
		report(s)
		if math.IsNaN(s.Loss) {
			return rep, fmt.Errorf("step %d: the loss is NaN", i)
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	rep.StepsPerSec = float64(steps) / rep.Seconds
	rep.Checks, rep.Flat = check(rep.Samples, warmup)
	return rep, nil
}

// sample reads the process's state after step steps.
func sample(step int) Sample {
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.GC() // the first collection runs the cleanups that free pool memory
	goruntime.ReadMemStats(&ms)
	return Sample{
		Step:        step,
		HeapBytes:   ms.HeapAlloc,
		DeviceBytes: rt.MemoryStats(ir.Device).BytesInUse,
		LiveArrays:  len(rt.LiveArrays()),
		Goroutines:  goruntime.NumGoroutine(),
	}
}

// check compares every sample from step warmup on with the first of them.
func check(samples []Sample, warmup int) ([]Check, bool) {
	quantities := []struct {
		name string
		get  func(Sample) float64
	}{
		{"go_heap", func(s Sample) float64 { return float64(s.HeapBytes) }},
		{"device", func(s Sample) float64 { return float64(s.DeviceBytes) }},
		{"live_arrays", func(s Sample) float64 { return float64(s.LiveArrays) }},
		{"goroutines", func(s Sample) float64 { return float64(s.Goroutines) }},
	}
	var after []Sample
	for _, s := range samples {
		if s.Step >= warmup {
			after = append(after, s)
		}
	}
	var checks []Check
	flat := true
	for _, q := range quantities {
		ref := q.get(after[0])
		c := Check{Name: q.name, Reference: ref, Min: ref, Max: ref}
		for _, s := range after {
			v := q.get(s)
			c.Min, c.Max = min(c.Min, v), max(c.Max, v)
		}
		dev := max(c.Max-ref, ref-c.Min)
		if ref > 0 {
			c.Drift = dev / ref
		} else if dev > 0 {
			c.Drift = math.Inf(1)
		}
		c.Flat = c.Drift <= tolerance
		flat = flat && c.Flat
		checks = append(checks, c)
	}
	return checks, flat
}
