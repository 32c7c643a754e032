// Command serve times all-MiniLM-L6-v2's sentence encoder in Ferry beside
// ONNX Runtime on the CPU, the same batch with the same number of threads,
// in one run.
//
//	bash scripts/venv                       # pinned onnx and onnxruntime
//	go run ./bench/serve [-batch 8] [-seq 32] [-rounds 10] [-reps 10]
//
// ort_bert.py builds the encoder as an ONNX graph straight from the
// checkpoint's safetensors (embeddings, attention and feed-forward layers
// with the erf GELU, LayerNorm, mean pooling, L2 normalisation) and runs it
// in ONNX Runtime with intra-op threads = GOMAXPROCS, inter-op 1. Ferry runs
// nn/serve's BertEmbedder (the jitted program the server runs). Both embed
// one batch of -batch sentences padded to -seq tokens; their embeddings
// must agree within -tol. Then the two alternate, -reps calls each per
// round (who goes first alternates too), and it prints each one's median
// and best call and the ratio Ferry/ORT of the medians.
//
// The model directory is -model (default $FERRY_HF_MODELS/all-MiniLM-L6-v2,
// FERRY_HF_MODELS defaulting to ~/.cache/ferry-hf-models; .ci/hf.sh puts it
// there).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/ferryml/ferry/cpu/gemm"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn/hf"
	"github.com/ferryml/ferry/nn/serve"
	"github.com/ferryml/ferry/tokenizer"
)

// sentences fill the batch, in turn.
var sentences = []string{
	"A man is eating food.",
	"A man is eating a piece of bread.",
	"The girl is carrying a baby.",
	"A man is riding a horse.",
	"A woman is playing violin.",
	"Two men pushed carts through the woods.",
	"Stock markets fell sharply on Tuesday after the central bank raised interest rates again.",
	"The quick brown fox jumps over the lazy dog.",
}

// options are the command's flags.
type options struct {
	model, python, cpuprofile string
	batch, seq, threads       int
	rounds, reps              int
	tol                       float64
}

// defaultModel is $FERRY_HF_MODELS/all-MiniLM-L6-v2, by default in
// ~/.cache/ferry-hf-models (hf.ModelDir).
func defaultModel() string { return hf.ModelDir("all-MiniLM-L6-v2") }

// makeBatch tokenizes o.batch sentences into one batch padded to o.seq.
func makeBatch(dir string, o options) (serve.Batch, error) {
	t, err := tokenizer.Load(dir)
	if err != nil {
		return serve.Batch{}, err
	}
	tok, err := serve.Tokenize(t)
	if err != nil {
		return serve.Batch{}, err
	}
	b := serve.Batch{Size: o.batch, Len: o.seq, Rows: o.batch}
	b.IDs, b.Types, b.Mask = make([]int32, o.batch*o.seq), make([]int32, o.batch*o.seq), make([]int32, o.batch*o.seq)
	for i := range o.batch {
		row, err := tok(sentences[i%len(sentences)])
		if err != nil {
			return b, err
		}
		if len(row.IDs) > o.seq {
			return b, fmt.Errorf("%q has %d tokens, more than -seq %d", sentences[i%len(sentences)], len(row.IDs), o.seq)
		}
		copy(b.IDs[i*o.seq:], row.IDs)
		copy(b.Types[i*o.seq:], row.Types)
		for j := range row.IDs {
			b.Mask[i*o.seq+j] = 1
		}
	}
	return b, nil
}

// ortWorker is ort_bert.py running: it answers "time K".
type ortWorker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startORT starts ort_bert.py on batch b and returns it with its
// embeddings and versions.
func startORT(o options, b serve.Batch) (*ortWorker, [][]float32, string, error) {
	rows := func(v []int32) [][]int32 {
		r := make([][]int32, b.Size)
		for i := range r {
			r[i] = v[i*b.Len : (i+1)*b.Len]
		}
		return r
	}
	f, err := os.CreateTemp("", "ort-inputs-*.json")
	if err != nil {
		return nil, nil, "", err
	}
	defer os.Remove(f.Name())
	json.NewEncoder(f).Encode(map[string]any{"ids": rows(b.IDs), "types": rows(b.Types), "mask": rows(b.Mask)})
	f.Close()
	_, self, _, _ := goruntime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "ort_bert.py")
	w := &ortWorker{cmd: exec.Command(o.python, script, "--model", o.model, "--inputs", f.Name(), "--threads", fmt.Sprint(o.threads))}
	w.cmd.Stderr = os.Stderr
	if w.in, err = w.cmd.StdinPipe(); err != nil {
		return nil, nil, "", err
	}
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, nil, "", err
	}
	w.out = bufio.NewScanner(stdout)
	w.out.Buffer(nil, 64<<20)
	if err := w.cmd.Start(); err != nil {
		return nil, nil, "", fmt.Errorf("%v (make the virtualenv with bash scripts/venv)", err)
	}
	var first struct {
		Embeddings [][]float32
		ORT, ONNX  string
	}
	if err := w.read(&first); err != nil {
		return nil, nil, "", err
	}
	return w, first.Embeddings, fmt.Sprintf("onnxruntime %s, onnx %s", first.ORT, first.ONNX), nil
}

// read decodes the worker's next line into v.
func (w *ortWorker) read(v any) error {
	if !w.out.Scan() {
		return fmt.Errorf("ort_bert.py ended: %v", w.out.Err())
	}
	return json.Unmarshal(w.out.Bytes(), v)
}

// time runs the batch n times in ONNX Runtime and returns each call's time.
func (w *ortWorker) time(n int) ([]time.Duration, error) {
	fmt.Fprintf(w.in, "time %d\n", n)
	var r struct{ Seconds []float64 }
	if err := w.read(&r); err != nil {
		return nil, err
	}
	d := make([]time.Duration, len(r.Seconds))
	for i, s := range r.Seconds {
		d[i] = time.Duration(s * float64(time.Second))
	}
	return d, nil
}

// close ends the worker.
func (w *ortWorker) close() {
	fmt.Fprintln(w.in, "quit")
	w.in.Close()
	w.cmd.Wait()
}

// maxDiff returns the largest |a−b| over the rows.
func maxDiff(a, b [][]float32) float64 {
	d := 0.0
	for i := range a {
		for j := range a[i] {
			d = max(d, math.Abs(float64(a[i][j]-b[i][j])))
		}
	}
	return d
}

// median and best of durations.
func stats(d []time.Duration) (med, best time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2], s[0]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// run compares Ferry and ONNX Runtime as o says, printing to w.
func run(w io.Writer, o options) error {
	b, err := makeBatch(o.model, o)
	if err != nil {
		return err
	}
	m, _, err := hf.LoadBert(o.model, ir.Float32)
	if err != nil {
		return err
	}
	emb := serve.NewBertEmbedder(m)
	ferry, err := emb.Run(b)
	if err != nil {
		return err
	}
	ort, ortEmb, versions, err := startORT(o, b)
	if err != nil {
		return err
	}
	defer ort.close()
	real := 0
	for _, v := range b.Mask {
		real += int(v)
	}
	fmt.Fprintf(w, "all-MiniLM-L6-v2, %d sentences × %d tokens (%d real), %d threads (GOMAXPROCS; ORT intra-op), %s\n",
		b.Size, b.Len, real, o.threads, versions)
	d := maxDiff(ferry, ortEmb)
	fmt.Fprintf(w, "embeddings: Ferry and ORT differ by at most %.2g (tolerance %g)\n", d, o.tol)
	if d > o.tol {
		return fmt.Errorf("Ferry's embeddings differ from ONNX Runtime's by %g, more than %g", d, o.tol)
	}
	var tf, to []time.Duration
	for r := range o.rounds {
		ferryRound := func() error {
			for range o.reps {
				t0 := time.Now()
				if _, err := emb.Run(b); err != nil {
					return err
				}
				tf = append(tf, time.Since(t0))
			}
			return nil
		}
		ortRound := func() error {
			t, err := ort.time(o.reps)
			to = append(to, t...)
			return err
		}
		first, second := ferryRound, ortRound
		if r%2 == 1 {
			first, second = ortRound, ferryRound
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
	}
	fm, fb := stats(tf)
	om, ob := stats(to)
	fmt.Fprintf(w, "Ferry: median %.2f ms, best %.2f ms over %d calls (%.0f sentences/s)\n", ms(fm), ms(fb), len(tf), float64(b.Size)/fm.Seconds())
	if pc := gemm.PackCache(); pc.Limit > 0 {
		fmt.Fprintf(w, "Ferry's packed-weight cache: %d weights, %.1f MiB, %d products read them (FERRY_GEMM_PACK_CACHE=off turns it off)\n",
			pc.Entries, float64(pc.Bytes)/(1<<20), pc.Hits)
	}
	fmt.Fprintf(w, "ORT:   median %.2f ms, best %.2f ms over %d calls (%.0f sentences/s)\n", ms(om), ms(ob), len(to), float64(b.Size)/om.Seconds())
	fmt.Fprintf(w, "Ferry/ORT: %.2f× (medians), %.2f× (best)\n", float64(fm)/float64(om), float64(fb)/float64(ob))
	if o.cpuprofile != "" {
		return profileFerry(w, o, emb, b)
	}
	return nil
}

// profileFerry writes a CPU profile of o.rounds×o.reps more of Ferry's
// calls (ORT idle) to o.cpuprofile.
func profileFerry(w io.Writer, o options, emb *serve.BertEmbedder, b serve.Batch) error {
	f, err := os.Create(o.cpuprofile)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	for range o.rounds * o.reps {
		if _, err := emb.Run(b); err != nil {
			pprof.StopCPUProfile()
			return err
		}
	}
	pprof.StopCPUProfile()
	fmt.Fprintf(w, "wrote a CPU profile of %d of Ferry's calls to %s (go tool pprof %s)\n", o.rounds*o.reps, o.cpuprofile, o.cpuprofile)
	return nil
}

func main() {
	o := options{threads: goruntime.GOMAXPROCS(0)}
	flag.StringVar(&o.model, "model", defaultModel(), "all-MiniLM-L6-v2's directory")
	flag.StringVar(&o.python, "python", ".venv/bin/python", "the virtualenv's Python with onnx and onnxruntime (bash scripts/venv)")
	flag.IntVar(&o.batch, "batch", 8, "sentences in the batch")
	flag.IntVar(&o.seq, "seq", 32, "tokens per sentence, padded")
	flag.IntVar(&o.rounds, "rounds", 10, "rounds of alternation")
	flag.IntVar(&o.reps, "reps", 10, "calls of each per round")
	flag.Float64Var(&o.tol, "tol", 1e-5, "largest difference allowed between the two's embeddings")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "after the comparison, write a CPU profile of as many more of Ferry's calls to this file")
	flag.Parse()
	if err := run(os.Stdout, o); err != nil {
		log.Fatal(err)
	}
}
