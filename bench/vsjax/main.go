// Command vsjax times Ferry and JAX side by side on the same programs, in one
// run:
//
//   - add: a jitted scalar f32 add, the cost of one call (µs per call);
//   - matmul_M×N×K: jitted f32 products a[m,k]·b[k,n] for 16×128×32,
//     128×128×256 and 1536×1920×1024;
//   - gelu: bench/cpu's fused gelu(x*w+b) (tanh form), x f32[4096,1024], w
//     and b f32[1024] broadcast;
//   - mlp_step: examples/mlp's training step (784-512-10 ReLU, mean softmax
//     cross-entropy, Adam 1e-3, batch 128, params and optimizer state donated);
//   - transformer_step: examples/transformer's training step at its defaults
//     (batch 32, seq 64, 4 scanned blocks, d 128, 4 heads, tied embedding,
//     clip-by-global-norm and AdamW under a warmup-cosine schedule, params and
//     optimizer state donated), vocab 96, random tokens.
//
// The Ferry side runs in this process; the JAX side (JAX + optax, jitted on
// the CPU) in bench/jax/bench.py, a long-lived Python subprocess driven over
// its stdin and stdout. The Python is $FERRY_PYTHON or the repository's
// .venv/bin/python (make it with `bash scripts/venv`).
//
// For each row both sides get the same inputs (the training steps the same
// initial parameters, copied from Ferry to JAX as raw bytes) and first run a
// check: a function's output, or a training step's losses over three steps,
// must agree within a loose tolerance, so that both sides are known to run
// the same program. That first call, which traces and compiles, is reported
// separately (first_call_ms). Then the two sides alternate — Ferry, JAX,
// Ferry, JAX, … — for -rounds rounds, each round a batch of calls lasting
// about -round-ms, every call waited for (block_until_ready on the JAX side;
// Ferry's CPU calls return finished). The table gives each side's median time
// per call and the ratio Ferry / JAX (below 1: Ferry is faster).
//
// Both sides use every core: Go's GOMAXPROCS and XLA's CPU thread pool default
// to the number of CPUs. On a GPU machine, FERRY_BACKEND=cuda runs Ferry's
// side on the CUDA backend (whose calls return finished, as the CPU's do) and
// JAX uses its default device, the GPU, so the table compares the two there.
//
//	go run ./bench/vsjax              # Markdown table
//	go run ./bench/vsjax -json        # one JSON object (progress on stderr)
//	go run ./bench/vsjax -rows mlp_step,add -rounds 9
//	go run ./bench/vsjax -tiny -rounds 1 -round-ms 1   # tiny sizes: do the two sides agree?
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/ferryml/ferry/bench/internal/host"
	_ "github.com/ferryml/ferry/cuda" // FERRY_BACKEND=cuda runs Ferry's side on the GPU
)

// RowResult is one row of the report. Times are medians over the rounds, in
// µs per call.
type RowResult struct {
	Name          string    `json:"name"`
	What          string    `json:"what"`
	FerryUS       float64   `json:"ferry_us"`
	JAXUS         float64   `json:"jax_us"`
	Ratio         float64   `json:"ratio"`        // Ferry / JAX, of the medians
	RatioRounds   []float64 `json:"ratio_rounds"` // Ferry / JAX of each round (adjacent batches)
	FerryRoundsUS []float64 `json:"ferry_rounds_us"`
	JAXRoundsUS   []float64 `json:"jax_rounds_us"`
	FerryCalls    int       `json:"ferry_calls_per_round"`
	JAXCalls      int       `json:"jax_calls_per_round"`
	FerryFirstMS  float64   `json:"ferry_first_call_ms"`
	JAXFirstMS    float64   `json:"jax_first_call_ms"`
	CheckRelDiff  float64   `json:"check_rel_diff"`
	Agree         bool      `json:"agree"`
	FerryLosses   []float64 `json:"ferry_losses,omitempty"`
	JAXLosses     []float64 `json:"jax_losses,omitempty"`
}

// Report is the whole run.
type Report struct {
	Date       string      `json:"date"`
	Machine    string      `json:"machine"`
	CPUs       int         `json:"cpus"`
	GOMAXPROCS int         `json:"gomaxprocs"`
	Go         string      `json:"go"`
	JAX        JAXInfo     `json:"jax"`
	LoadStart  string      `json:"loadavg_start"`
	LoadEnd    string      `json:"loadavg_end"`
	Rounds     int         `json:"rounds"`
	RoundMS    int         `json:"round_ms"`
	Rows       []RowResult `json:"rows"`
}

func main() {
	jsonOut := flag.Bool("json", false, "print one JSON object (progress goes to stderr)")
	rounds := flag.Int("rounds", 7, "alternating rounds per row (the median is reported)")
	roundMS := flag.Int("round-ms", 200, "about how long each side's batch of calls lasts in a round")
	rowsFlag := flag.String("rows", "", "comma-separated row names to run (default: all)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process (the Ferry side) to this file")
	tiny := flag.Bool("tiny", false, "tiny sizes: checks that both sides agree in seconds (the timings mean little)")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "vsjax:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	sz := DefaultSizes
	if *tiny {
		sz = TinySizes
	}
	if err := run(os.Stdout, os.Stderr, sz, *jsonOut, *rounds, *roundMS, *rowsFlag); err != nil {
		fmt.Fprintln(os.Stderr, "vsjax:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(stdout, log io.Writer, sz Sizes, jsonOut bool, rounds, roundMS int, rowsFlag string) error {
	if rounds < 1 || roundMS < 1 {
		return fmt.Errorf("-rounds %d, -round-ms %d: both must be positive", rounds, roundMS)
	}
	rows := Rows(sz)
	if rowsFlag != "" {
		var names []string
		for _, r := range rows {
			names = append(names, r.Name)
		}
		var pick []Row
		for _, want := range strings.Split(rowsFlag, ",") {
			want = strings.TrimSpace(want)
			i := slices.Index(names, want)
			if i < 0 {
				return fmt.Errorf("-rows: no row %q (rows: %s)", want, strings.Join(names, ", "))
			}
			pick = append(pick, rows[i])
		}
		rows = pick
	}
	python, script, err := findPython()
	if err != nil {
		return err
	}
	jp, err := startJAX(python, script)
	if err != nil {
		return err
	}
	defer jp.close()
	info, err := jp.hello()
	if err != nil {
		return err
	}
	rep := Report{
		Date: time.Now().UTC().Format(time.RFC3339), Machine: host.CPU(), CPUs: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(), JAX: info,
		LoadStart: host.LoadAverage(), Rounds: rounds, RoundMS: roundMS,
	}
	fmt.Fprintf(log, "vsjax: Ferry (GOMAXPROCS %d) vs JAX %s (%s), %d rounds of ~%d ms; load average %s\n",
		rep.GOMAXPROCS, info.JAX, strings.Join(info.Devices, ","), rounds, roundMS, rep.LoadStart)
	disagree := false
	for _, r := range rows {
		c, err := r.Build()
		if err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
		res, err := measure(c, jp, rounds, time.Duration(roundMS)*time.Millisecond)
		if err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
		if err := jp.drop(c); err != nil {
			return err
		}
		disagree = disagree || !res.Agree
		fmt.Fprintf(log, "  %-22s Ferry %10s  JAX %10s  ratio %5.2f  check %.1e %s\n",
			res.Name, fmtUS(res.FerryUS), fmtUS(res.JAXUS), res.Ratio, res.CheckRelDiff, agreeWord(res.Agree))
		rep.Rows = append(rep.Rows, res)
	}
	rep.LoadEnd = host.LoadAverage()
	if jsonOut {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printTable(stdout, rep)
	}
	if disagree {
		return fmt.Errorf("Ferry and JAX disagree on a row (the check column): the programs differ")
	}
	return nil
}

func agreeWord(ok bool) string {
	if ok {
		return "agree"
	}
	return "DISAGREE"
}

// measure checks c on both sides, then alternates timed rounds.
func measure(c *Case, jp *jaxProc, rounds int, round time.Duration) (RowResult, error) {
	res := RowResult{Name: c.Name, What: c.What}
	fr, err := c.Check()
	if err != nil {
		return res, fmt.Errorf("Ferry: %w", err)
	}
	if err := jp.setup(c); err != nil {
		return res, err
	}
	jr, err := jp.check(c)
	if err != nil {
		return res, err
	}
	res.FerryFirstMS, res.JAXFirstMS = fr.FirstMS, jr.FirstMS
	res.FerryLosses, res.JAXLosses = fr.Losses, jr.Losses
	if res.CheckRelDiff, res.Agree, err = agreement(c, fr, jr); err != nil {
		return res, err
	}

	// Calibrate: the calls per round from two warm calls on each side.
	ferryOnce := func(n int) (float64, error) { return timeCalls(c.Call, n) }
	jaxOnce := func(n int) (float64, error) { return jp.time(c, n) }
	calls := func(once func(int) (float64, error)) (int, error) {
		best := 0.0
		for i := range 2 {
			ns, err := once(1)
			if err != nil {
				return 0, err
			}
			if i == 0 || ns < best {
				best = ns
			}
		}
		return max(1, min(1<<20, int(float64(round.Nanoseconds())/max(best, 1)))), nil
	}
	if res.FerryCalls, err = calls(ferryOnce); err != nil {
		return res, fmt.Errorf("Ferry: %w", err)
	}
	if res.JAXCalls, err = calls(jaxOnce); err != nil {
		return res, err
	}
	for range rounds {
		ns, err := ferryOnce(res.FerryCalls)
		if err != nil {
			return res, fmt.Errorf("Ferry: %w", err)
		}
		res.FerryRoundsUS = append(res.FerryRoundsUS, ns/1e3)
		if ns, err = jaxOnce(res.JAXCalls); err != nil {
			return res, err
		}
		res.JAXRoundsUS = append(res.JAXRoundsUS, ns/1e3)
		res.RatioRounds = append(res.RatioRounds, res.FerryRoundsUS[len(res.FerryRoundsUS)-1]/(ns/1e3))
	}
	res.FerryUS, res.JAXUS = median(res.FerryRoundsUS), median(res.JAXRoundsUS)
	res.Ratio = res.FerryUS / res.JAXUS
	return res, nil
}

// timeCalls runs call n times and returns the ns per call.
func timeCalls(call func() error, n int) (float64, error) {
	t0 := time.Now()
	for range n {
		if err := call(); err != nil {
			return 0, err
		}
	}
	return float64(time.Since(t0).Nanoseconds()) / float64(n), nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func now() time.Time { return time.Now() }

func sinceMS(t time.Time) float64 { return float64(time.Since(t).Nanoseconds()) / 1e6 }

// fmtUS formats µs with a unit that keeps three or so digits.
func fmtUS(us float64) string {
	switch {
	case us >= 1000:
		return fmt.Sprintf("%.2f ms", us/1000)
	case us >= 100:
		return fmt.Sprintf("%.0f µs", us)
	default:
		return fmt.Sprintf("%.1f µs", us)
	}
}

func printTable(w io.Writer, rep Report) {
	fmt.Fprintf(w, "machine: %s, %d CPUs, GOMAXPROCS %d; JAX %s, optax %s (%s); %d rounds of ~%d ms, medians\n",
		rep.Machine, rep.CPUs, rep.GOMAXPROCS, rep.JAX.JAX, rep.JAX.Optax, strings.Join(rep.JAX.Devices, ","), rep.Rounds, rep.RoundMS)
	fmt.Fprintf(w, "load average: %s at the start, %s at the end\n\n", rep.LoadStart, rep.LoadEnd)
	fmt.Fprintln(w, "| row | Ferry | JAX | Ferry / JAX | per round | first call, Ferry / JAX | check (rel. diff) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "| %s | %s | %s | %.2f× | %.2f–%.2f | %.0f / %.0f ms | %s (%.1e) |\n",
			r.What, fmtUS(r.FerryUS), fmtUS(r.JAXUS), r.Ratio, slices.Min(r.RatioRounds), slices.Max(r.RatioRounds),
			r.FerryFirstMS, r.JAXFirstMS, agreeWord(r.Agree), r.CheckRelDiff)
	}
}
