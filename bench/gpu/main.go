// Command gpu runs Ferry's side of the GPU benchmarks (bench/gpu/README.md)
// on the CUDA backend: the scan model of shared/REFERENCES.md §1 (10 layers,
// jit(grad(loss)) with respect to w1, w2) with and without activation
// offload, one step of chain(clip_by_global_norm(1.0), adam(0.1)) on the
// optimizer model at DIM (7168), and the training step of
// examples/transformer at the size of transformerConfig. Each prints one
// JSON line with the median step time after warm-up (device time between
// CUDA events on the compute stream; wall time beside it), the memory
// analysis and the measured peak.
//
//	gpu -case scan|scan_offload|optimizer|transformer [-dim 7168] [-steps 10] [-warmup 2]
//	gpu -case copy_h2d|copy_d2h  # 1 GiB between pinned_host and device: GB/s
//	gpu -case probe    # the CUDA libraries found; exit 1 when the driver loads and NVRTC, cuBLASLt or NCCL do not
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"sort"
	"time"

	"github.com/ferryml/ferry/cuda"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

func f32(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }

func traceFn(name string, params []ir.Type, fn func(xs []*trace.Array) []*trace.Array) *ir.Func {
	tr := trace.NewFuncTracer(name)
	tr.Push()
	var xs []*trace.Array
	for _, p := range params {
		xs = append(xs, tr.Param(p))
	}
	for _, o := range fn(xs) {
		tr.Func().Body.Results = append(tr.Func().Body.Results, tr.Output(o))
	}
	tr.Pop()
	tr.Close()
	return tr.Func()
}

// scanModel is grad(sum(final x)) w.r.t. w1, w2 of x ← (x @ w1[i]) @ w2[i].
func scanModel(offload bool) *ir.Func {
	return traceFn("scan", []ir.Type{f32(256, 256), f32(10, 256, 1024), f32(10, 1024, 256)}, func(a []*trace.Array) []*trace.Array {
		loss := func(ws []*trace.Array) []*trace.Array {
			layer := func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
				x := c[0]
				if offload {
					x = trace.CheckpointName(x, "x")
				}
				return []*trace.Array{trace.MatMul(trace.MatMul(x, xs[0]), xs[1])}, nil
			}
			if offload {
				pol := trace.SaveAndOffloadOnlyTheseNames(nil, []string{"x"}, ir.Device, ir.PinnedHost)
				inner := layer
				layer = func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
					out := trace.Checkpoint(func(args []*trace.Array) []*trace.Array {
						n, _ := inner(args[:1], args[1:])
						return n
					}, pol)(append(c, xs...)...)
					return out, nil
				}
			}
			c, _ := trace.Scan(layer, []*trace.Array{a[0]}, ws)
			return []*trace.Array{trace.Sum(c[0])}
		}
		_, pb := trace.VJP(loss, a[1:])
		return pb([]*trace.Array{trace.Scalar(1.0)})
	})
}

// optimizerModel is one Adam step (lr 0.1) after clipping by global norm 1.0
// on the four-layer gelu model; params, m, v and the step count in, new
// ones out.
func optimizerModel(dim int) *ir.Func {
	var ps []ir.Type
	ps = append(ps, f32(dim, dim)) // input
	for range 12 {
		ps = append(ps, f32(dim, dim)) // w1..4, m1..4, v1..4
	}
	ps = append(ps, f32())
	return traceFn("adam_step", ps, func(a []*trace.Array) []*trace.Array {
		in, ws, ms, vs, t := a[0], a[1:5], a[5:9], a[9:13], a[13]
		loss := func(w []*trace.Array) []*trace.Array {
			x := in
			for _, wi := range w {
				x = trace.Gelu(trace.MatMul(x, wi), true)
			}
			d := trace.Sub(x, in)
			l := trace.Mean(trace.Mul(d, d))
			for _, wi := range w {
				l = trace.Add(l, trace.Mul(trace.Scalar(0.001), trace.Sum(trace.Mul(wi, wi))))
			}
			return []*trace.Array{l}
		}
		_, pb := trace.VJP(loss, ws)
		gs := pb([]*trace.Array{trace.Scalar(1.0)})
		var sq *trace.Array
		for _, g := range gs {
			s := trace.Sum(trace.Mul(g, g))
			if sq == nil {
				sq = s
			} else {
				sq = trace.Add(sq, s)
			}
		}
		norm := trace.Sqrt(sq)
		scale := trace.Div(trace.Scalar(1.0), trace.Maximum(norm, trace.Scalar(1.0)))
		t1 := trace.Add(t, trace.Scalar(1.0))
		bc1 := trace.Sub(trace.Scalar(1.0), trace.Pow(trace.Scalar(0.9), t1))
		bc2 := trace.Sub(trace.Scalar(1.0), trace.Pow(trace.Scalar(0.999), t1))
		var out []*trace.Array
		var nm, nv []*trace.Array
		for i, g := range gs {
			g = trace.Mul(g, scale)
			m := trace.Add(trace.Mul(trace.Scalar(0.9), ms[i]), trace.Mul(trace.Scalar(0.1), g))
			v := trace.Add(trace.Mul(trace.Scalar(0.999), vs[i]), trace.Mul(trace.Scalar(0.001), trace.Mul(g, g)))
			upd := trace.Div(trace.Div(m, bc1), trace.Add(trace.Sqrt(trace.Div(v, bc2)), trace.Scalar(1e-8)))
			out = append(out, trace.Sub(ws[i], trace.Mul(trace.Scalar(0.1), upd)))
			nm, nv = append(nm, m), append(nv, v)
		}
		return append(append(append(out, nm...), nv...), t1)
	})
}

func main() {
	which := flag.String("case", "scan", "scan, scan_offload, optimizer, transformer, copy_h2d, copy_d2h, or probe")
	dim := flag.Int("dim", 7168, "optimizer model size")
	steps := flag.Int("steps", 10, "timed steps after the warm-up steps")
	warmup := flag.Int("warmup", 2, "untimed warm-up steps")
	flag.Parse()
	if *which == "probe" {
		if !printProbe(os.Stdout, probeLibraries()) {
			os.Exit(1)
		}
		return
	}
	be, err := cuda.Register()
	if err != nil {
		log.Fatalf("CUDA backend: %v", err)
	}
	f, donated, lits, err := buildCase(*which, *dim)
	if err != nil {
		log.Fatal(err)
	}
	exe, err := be.Compile(f, rt.CompileOptions{Donated: donated})
	if err != nil {
		log.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	args := make([]trace.Buffer, len(f.Body.Params))
	for i, p := range f.Body.Params {
		var l *ir.Literal
		if lits != nil {
			l = lits[i]
		} else {
			l = ir.NewLiteral(p.Type)
			for j := range p.Type.Size() {
				l.SetFloat64At(j, (rng.Float64()*2-1)*0.02)
			}
		}
		b, err := be.FromLiteral(l)
		if err != nil {
			log.Fatal(err)
		}
		args[i] = b
	}
	// Donated arguments take, in order, the first results of each step.
	var donatedIdx []int
	for i, d := range donated {
		if d {
			donatedIdx = append(donatedIdx, i)
		}
	}
	timer, err := be.NewTimer()
	if err != nil {
		log.Fatal(err)
	}
	defer timer.Close()
	var devMS, wallMS []float64
	for s := 0; s < *steps+*warmup; s++ {
		t0 := time.Now()
		if err := timer.Start(); err != nil {
			log.Fatal(err)
		}
		outs, err := exe.Execute(args, rt.ExecOptions{})
		if err != nil {
			log.Fatal(err)
		}
		dev, err := timer.Stop()
		if err != nil {
			log.Fatal(err)
		}
		wall := time.Since(t0).Seconds() * 1e3
		if s >= *warmup {
			devMS, wallMS = append(devMS, dev), append(wallMS, wall)
		}
		for k, o := range outs {
			if k < len(donatedIdx) {
				args[donatedIdx[k]] = o
			} else if d, ok := o.(interface{ Delete() error }); ok {
				d.Delete()
			}
		}
	}
	ma := exe.Program().Analysis
	res := map[string]any{
		"framework": "ferry", "case": *which, "device": be.Devices()[0].Kind,
		"median_step_ms": median(devMS), "median_wall_ms": median(wallMS), "timing": "cuda events on the compute stream",
		"steps": *steps, "warmup": *warmup,
		"temp_bytes": ma.TempBytes, "argument_bytes": ma.ArgumentBytes, "output_bytes": ma.OutputBytes,
		"alias_bytes": ma.AliasBytes, "total_bytes": ma.TotalBytes(), "host_temp_bytes": ma.HostTempBytes,
		"peak_bytes": be.PeakBytes(),
	}
	if *which == "copy_h2d" || *which == "copy_d2h" {
		res["bytes"] = copyBytes
		res["gb_per_s"] = float64(copyBytes) / (median(devMS) * 1e6)
	}
	if ok, why := be.MatmulStatus(); ok {
		res["matmul"] = "cublaslt"
	} else {
		res["matmul"] = fmt.Sprintf("generated (%v)", why)
	}
	if hs, ok := exe.(interface{ HostSteps() []string }); ok {
		res["host_fallback_steps"] = len(hs.HostSteps())
		if len(hs.HostSteps()) > 0 {
			res["host_fallback"] = hs.HostSteps()
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}

// buildCase returns the traced program of a case, which of its parameters
// are donated, and its initial arguments (nil: random ones).
func buildCase(which string, dim int) (f *ir.Func, donated []bool, lits []*ir.Literal, err error) {
	switch which {
	case "scan":
		f = scanModel(false)
	case "scan_offload":
		f = scanModel(true)
	case "optimizer":
		f = optimizerModel(dim)
		donated = make([]bool, len(f.Body.Params))
		for i := 1; i < len(donated); i++ {
			donated[i] = true
		}
	case "copy_h2d", "copy_d2h":
		f = copyModel(which == "copy_h2d")
	case "transformer":
		return transformerStep()
	default:
		return nil, nil, nil, fmt.Errorf("unknown case %q", which)
	}
	return f, donated, nil, nil
}

// median of xs (the upper middle one for an even count, 0 when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}
