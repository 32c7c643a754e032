package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The Go side of every row runs once at tiny sizes (no Python: the JAX side
// is checked by `go run ./bench/vsjax -tiny`, .ci/vsjax.sh), its results
// compared with float64 references computed here from the arrays the JAX side
// would get.

func f32s(t Tensor) []float32 {
	out := make([]float32, len(t.Data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out
}

func i32s(t Tensor) []int32 {
	out := make([]int32, len(t.Data)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out
}

func arrayByName(t *testing.T, c *Case, name string) Tensor {
	t.Helper()
	for _, a := range c.Arrays {
		if a.Name == name {
			return a
		}
	}
	t.Fatalf("%s: no array %q", c.Name, name)
	return Tensor{}
}

func matmul64(a, b []float32, m, n, k int) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			s := 0.0
			for p := range k {
				s += float64(a[i*k+p]) * float64(b[p*n+j])
			}
			c[i*n+j] = s
		}
	}
	return c
}

func closeTo(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol*(1+math.Abs(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// mlpLoss64 is the mean softmax cross-entropy of the MLP in float64.
func mlpLoss64(w0, b0, w1, b1, x []float32, y []int32, batch, in, hidden, classes int) float64 {
	h := matmul64(x, w0, batch, hidden, in)
	for i := range h {
		h[i] = math.Max(0, h[i]+float64(b0[i%hidden]))
	}
	h32 := make([]float32, len(h))
	for i, v := range h {
		h32[i] = float32(v) // the reference's hidden layer is only as exact as f32 inputs allow
	}
	lg := matmul64(h32, w1, batch, classes, hidden)
	total := 0.0
	for r := range batch {
		row := lg[r*classes : (r+1)*classes]
		mx := math.Inf(-1)
		for j := range row {
			row[j] += float64(b1[j])
			mx = math.Max(mx, row[j])
		}
		se := 0.0
		for _, v := range row {
			se += math.Exp(v - mx)
		}
		total += mx + math.Log(se) - row[y[r]]
	}
	return total / float64(batch)
}

// perExampleNorms64 is each example's squared gradient norm of mlpLoss64's
// two-layer ReLU MLP on that example alone, by backpropagation in float64.
func perExampleNorms64(w0, b0, w1, b1, x []float32, y []int32, batch, in, hidden, classes int) []float64 {
	out := make([]float64, batch)
	for r := range batch {
		xr := x[r*in : (r+1)*in]
		h := make([]float64, hidden)
		for j := range hidden {
			z := float64(b0[j])
			for k := range in {
				z += float64(xr[k]) * float64(w0[k*hidden+j])
			}
			h[j] = math.Max(0, z)
		}
		lg := make([]float64, classes)
		mx := math.Inf(-1)
		for c := range classes {
			lg[c] = float64(b1[c])
			for j := range hidden {
				lg[c] += h[j] * float64(w1[j*classes+c])
			}
			mx = math.Max(mx, lg[c])
		}
		se := 0.0
		for _, v := range lg {
			se += math.Exp(v - mx)
		}
		dz := make([]float64, classes) // softmax − one-hot
		for c := range classes {
			dz[c] = math.Exp(lg[c]-mx) / se
		}
		dz[y[r]]--
		n := 0.0
		for c := range classes {
			n += dz[c] * dz[c] // b1
		}
		for j := range hidden {
			dh := 0.0
			for c := range classes {
				g := h[j] * dz[c] // w1
				n += g * g
				dh += dz[c] * float64(w1[j*classes+c])
			}
			if h[j] <= 0 {
				continue
			}
			n += dh * dh // b0
			for k := range in {
				g := float64(xr[k]) * dh // w0
				n += g * g
			}
		}
		out[r] = n
	}
	return out
}

func TestRowsTiny(t *testing.T) {
	sz := TinySizes
	rows := Rows(sz)
	if len(rows) != len(Rows(DefaultSizes)) {
		t.Fatalf("tiny sizes give %d rows, the default %d", len(rows), len(Rows(DefaultSizes)))
	}
	seen := map[string]bool{}
	for _, r := range rows {
		t.Run(r.Name, func(t *testing.T) {
			c, err := r.Build()
			if err != nil {
				t.Fatal(err)
			}
			if c.Name != r.Name || seen[c.Name] {
				t.Fatalf("row %q builds case %q (seen before: %v)", r.Name, c.Name, seen[c.Name])
			}
			seen[c.Name] = true
			for _, a := range c.Arrays {
				n := 4
				for _, d := range a.Shape {
					n *= d
				}
				if len(a.Data) != n {
					t.Fatalf("array %s: %d bytes for shape %v", a.Name, len(a.Data), a.Shape)
				}
			}
			res, err := c.Check()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Call(); err != nil { // one timed-path call
				t.Fatal(err)
			}
			switch c.JAXCase {
			case "add":
				closeTo(t, "add", res.Out, []float64{1.25}, 0)
			case "matmul":
				a, b := arrayByName(t, c, "a"), arrayByName(t, c, "b")
				m, k, n := a.Shape[0], a.Shape[1], b.Shape[1]
				closeTo(t, c.Name, res.Out, matmul64(f32s(a), f32s(b), m, n, k), 1e-5)
			case "gelu":
				x, w, b := f32s(arrayByName(t, c, "x")), f32s(arrayByName(t, c, "w")), f32s(arrayByName(t, c, "b"))
				cols := len(w)
				want := make([]float64, len(x))
				for i, xv := range x {
					z := float64(xv)*float64(w[i%cols]) + float64(b[i%cols])
					want[i] = 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z)))
				}
				closeTo(t, c.Name, res.Out, want, 1e-5)
			case "mlp":
				m := sz.MLP
				want := mlpLoss64(f32s(arrayByName(t, c, "w0")), f32s(arrayByName(t, c, "b0")),
					f32s(arrayByName(t, c, "w1")), f32s(arrayByName(t, c, "b1")),
					f32s(arrayByName(t, c, "x")), i32s(arrayByName(t, c, "y")), m.Batch, m.In, m.Hidden, m.Classes)
				if len(res.Losses) != c.Steps || math.Abs(res.Losses[0]-want) > 1e-5*(1+want) {
					t.Fatalf("losses %v, want %d of them, the first %v", res.Losses, c.Steps, want)
				}
				if !(res.Losses[2] < res.Losses[0]) {
					t.Fatalf("Adam on one batch: losses %v do not decrease", res.Losses)
				}
			case "per_example":
				m := sz.PerExample
				want := perExampleNorms64(f32s(arrayByName(t, c, "w0")), f32s(arrayByName(t, c, "b0")),
					f32s(arrayByName(t, c, "w1")), f32s(arrayByName(t, c, "b1")),
					f32s(arrayByName(t, c, "x")), i32s(arrayByName(t, c, "y")), m.Batch, m.In, m.Hidden, m.Classes)
				closeTo(t, c.Name, res.Out, want, 1e-5)
			case "transformer":
				s := sz.TF
				d, l := s.D, s.Layers
				want := map[string][]int{"tok": {s.Vocab, d}, "pos": {s.Seq, d},
					"ln1_scale": {l, d}, "ln1_bias": {l, d}, "wq": {l, d, d}, "wk": {l, d, d}, "wv": {l, d, d}, "wo": {l, d, d},
					"ln2_scale": {l, d}, "ln2_bias": {l, d}, "w1": {l, d, 4 * d}, "b1": {l, 4 * d}, "w2": {l, 4 * d, d}, "b2": {l, d},
					"norm_scale": {d}, "norm_bias": {d}, "x": {s.Batch, s.Seq}, "y": {s.Batch, s.Seq}}
				if len(c.Arrays) != len(want) {
					t.Fatalf("%d arrays, want %d", len(c.Arrays), len(want))
				}
				for _, a := range c.Arrays {
					if !slices.Equal(a.Shape, want[a.Name]) {
						t.Fatalf("array %s has shape %v, want %v (leaf order changed? bench.py's TF_LEAVES must follow)", a.Name, a.Shape, want[a.Name])
					}
				}
				// LayerNorm scales start at one: the leaf named ln1_scale must be it.
				for _, v := range f32s(arrayByName(t, c, "ln1_scale")) {
					if v != 1 {
						t.Fatalf("ln1_scale holds %v, want ones", v)
					}
				}
				ls := res.Losses
				if len(ls) != 3 || math.Abs(ls[0]-math.Log(float64(s.Vocab))) > 1 {
					t.Fatalf("losses %v: want 3, the first near ln %d = %.3f", ls, s.Vocab, math.Log(float64(s.Vocab)))
				}
				// The warmup schedule's learning rate is 0 at step 0: the second
				// loss equals the first; the third differs.
				if ls[1] != ls[0] || ls[2] == ls[1] {
					t.Fatalf("losses %v: want the first two equal (lr 0) and the third different", ls)
				}
			default:
				t.Fatalf("no test for case %q", c.JAXCase)
			}
		})
	}
}

func TestAgreement(t *testing.T) {
	step := &Case{Name: "s", Steps: 2, Tol: 1e-3}
	if d, ok, err := agreement(step, Result{Losses: []float64{2, 1}}, Result{Losses: []float64{2, 1.0005}}); err != nil || !ok || math.Abs(d-0.0005/1.0005) > 1e-12 {
		t.Fatalf("close losses: %v %v %v", d, ok, err)
	}
	if _, ok, _ := agreement(step, Result{Losses: []float64{2, 1}}, Result{Losses: []float64{2, 1.01}}); ok {
		t.Fatal("losses 1% apart agree")
	}
	if _, ok, _ := agreement(step, Result{Losses: []float64{math.NaN(), 1}}, Result{Losses: []float64{2, 1}}); ok {
		t.Fatal("a NaN loss agrees")
	}
	if _, _, err := agreement(step, Result{Losses: []float64{2}}, Result{Losses: []float64{2, 1}}); err == nil {
		t.Fatal("different loss counts: no error")
	}
	fn := &Case{Name: "f", Tol: 1e-4}
	if d, ok, _ := agreement(fn, Result{Out: []float32{100, 1}}, Result{Out: []float32{100, 1.001}}); !ok || math.Abs(d-1e-5) > 1e-9 {
		t.Fatalf("outputs within 1e-5 of the largest: %v %v", d, ok)
	}
	if _, ok, _ := agreement(fn, Result{Out: []float32{100, 1}}, Result{Out: []float32{100, 1.1}}); ok {
		t.Fatal("outputs 1e-3 apart (relative to the largest) agree")
	}
	if _, ok, _ := agreement(fn, Result{Out: []float32{float32(math.NaN()), 1}}, Result{Out: []float32{100, 1}}); ok {
		t.Fatal("a NaN output agrees")
	}
}

func TestReadReply(t *testing.T) {
	payload := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	in := bufio.NewReader(bytes.NewReader(append([]byte(`{"first_call_ms": 2.5, "nbytes": 8}`+"\n"), payload...)))
	var v struct {
		FirstMS float64 `json:"first_call_ms"`
	}
	got, err := readReply(in, "check", &v)
	if err != nil || v.FirstMS != 2.5 || !bytes.Equal(got, payload) {
		t.Fatalf("readReply = %v, %v (first %v)", got, err, v.FirstMS)
	}
	_, err = readReply(bufio.NewReader(strings.NewReader(`{"error": "setup: ValueError: boom"}`+"\n")), "setup", nil)
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error reply: %v", err)
	}
	_, err = readReply(bufio.NewReader(strings.NewReader(`{"nbytes": 8}`+"\n"+"abc")), "check", nil)
	if err == nil || !strings.Contains(err.Error(), "8 bytes") {
		t.Fatalf("short payload: %v", err)
	}
	_, err = readReply(bufio.NewReader(strings.NewReader("")), "time", nil)
	if err == nil || !strings.Contains(err.Error(), "no reply") {
		t.Fatalf("closed pipe: %v", err)
	}
}

func TestFindPythonMessages(t *testing.T) {
	t.Setenv("FERRY_PYTHON", "")
	t.Chdir(t.TempDir())
	if _, _, err := findPython(); err == nil || !strings.Contains(err.Error(), "bench/jax/bench.py not found") {
		t.Fatalf("outside the repository: %v", err)
	}
	// A repository without .venv: the message says how to make it.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bench", "jax"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"go.mod", filepath.Join("bench", "jax", "bench.py")} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(filepath.Join(root, "bench"))
	if _, _, err := findPython(); err == nil || !strings.Contains(err.Error(), "bash scripts/venv") {
		t.Fatalf("no .venv: %v", err)
	}
	t.Setenv("FERRY_PYTHON", "/some/python")
	py, script, err := findPython()
	if err != nil || py != "/some/python" || script != filepath.Join(root, "bench", "jax", "bench.py") {
		t.Fatalf("FERRY_PYTHON: %q %q %v", py, script, err)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

// BenchmarkFerry times the Ferry side of every row at the default sizes
// (no Python): go test -run XXX -bench Ferry ./bench/vsjax
func BenchmarkFerry(b *testing.B) {
	for _, r := range Rows(DefaultSizes) {
		b.Run(r.Name, func(b *testing.B) {
			c, err := r.Build()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.Check(); err != nil { // compile
				b.Fatal(err)
			}
			for b.Loop() {
				if err := c.Call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
