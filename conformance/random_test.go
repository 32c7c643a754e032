package conformance

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// randomCase is one case of testdata/random.jsonl.gz: a jax.random function
// of a raw u32[2] key (Key) with its parameters, under one setting of
// jax_threefry_partitionable.
type randomCase struct {
	Name          string                     `json:"name"`
	Fn            string                     `json:"fn"`
	Partitionable bool                       `json:"partitionable"`
	Key           []uint32                   `json:"key"`
	Params        map[string]json.RawMessage `json:"params"`
	Out           goldenArray                `json:"out"`
}

func (c *randomCase) param(name string, v any) {
	raw, ok := c.Params[name]
	if !ok {
		panic(fmt.Sprintf("%s: no parameter %q", c.Name, name))
	}
	if err := json.Unmarshal(raw, v); err != nil {
		panic(fmt.Sprintf("%s: parameter %q: %v", c.Name, name, err))
	}
}

func (c *randomCase) dtype() ir.DType {
	var s string
	c.param("dtype", &s)
	dt, err := ir.ParseDType(s)
	if err != nil {
		panic(err)
	}
	return dt
}

func (c *randomCase) shape() ir.Shape {
	var s []int
	c.param("shape", &s)
	return ir.Shape(s)
}

func (c *randomCase) float(name string) float64 {
	var v float64
	c.param(name, &v)
	return v
}

func (c *randomCase) int(name string) int {
	var v int
	c.param(name, &v)
	return v
}

// fn returns the Ferry function of the case's key.
func (c *randomCase) fn() func(key *trace.Array) *trace.Array {
	switch c.Fn {
	case "key":
		var seed uint64
		c.param("seed", &seed)
		return func(*trace.Array) *trace.Array { return random.NewKey(seed) }
	case "split":
		n := c.int("n")
		return func(k *trace.Array) *trace.Array { return random.Split(k, n) }
	case "fold_in":
		var d uint32
		c.param("data", &d)
		return func(k *trace.Array) *trace.Array { return random.FoldIn(k, d) }
	case "bits":
		s := c.shape()
		return func(k *trace.Array) *trace.Array { return random.Bits(k, s...) }
	case "uniform":
		dt, s, lo, hi := c.dtype(), c.shape(), c.float("lo"), c.float("hi")
		return func(k *trace.Array) *trace.Array { return random.Uniform(k, dt, s, lo, hi) }
	case "normal":
		dt, s := c.dtype(), c.shape()
		return func(k *trace.Array) *trace.Array { return random.Normal(k, dt, s) }
	case "truncated_normal":
		dt, s, lo, hi := c.dtype(), c.shape(), c.float("lower"), c.float("upper")
		return func(k *trace.Array) *trace.Array { return random.TruncatedNormal(k, dt, s, lo, hi) }
	case "bernoulli":
		s, p := c.shape(), c.float("p")
		return func(k *trace.Array) *trace.Array { return random.Bernoulli(k, p, s) }
	case "permutation":
		n := c.int("n")
		return func(k *trace.Array) *trace.Array { return random.Permutation(k, n) }
	case "categorical":
		var g goldenArray
		c.param("logits", &g)
		l, err := g.literal()
		if err != nil {
			panic(err)
		}
		axis := c.int("axis")
		return func(k *trace.Array) *trace.Array {
			logits, err := rt.FromLiteral(l)
			if err != nil {
				panic(err)
			}
			return random.Categorical(k, logits, axis)
		}
	}
	return nil
}

// runRandom runs fn on the key eagerly (op by op) or under rt.Jit, with the
// case's bit layout.
func runRandom(c *randomCase, jit bool) (l *ir.Literal, err error) {
	defer trace.Recover(&err)
	defer random.SetPartitionable(random.SetPartitionable(c.Partitionable))
	fn := c.fn()
	if fn == nil {
		return nil, fmt.Errorf("unknown function %q", c.Fn)
	}
	key := rt.FromSlice([]uint32{0, 0}, 2)
	if c.Key != nil {
		key = rt.FromSlice(c.Key, 2)
	}
	var out *trace.Array
	if jit {
		out = rt.Jit(fn)(key)
	} else {
		out = fn(key)
	}
	return out.Literal()
}

// sameRandom compares Ferry's result with JAX's: bit for bit (every NaN
// equal), except index results, compared by value (JAX's categorical gives
// int64 indices when x64 is on, Ferry's are i32).
func sameRandom(got, want *ir.Literal) (int, error) {
	if !got.Type.Shape.Equal(want.Type.Shape) {
		return -1, fmt.Errorf("shape %v, JAX's is %v", got.Type.Shape, want.Type.Shape)
	}
	byValue := got.Type.DType.IsInteger() && want.Type.DType.IsInteger() && got.Type.DType != want.Type.DType
	if got.Type.DType != want.Type.DType && !byValue {
		return -1, fmt.Errorf("dtype %v, JAX's is %v", got.Type.DType, want.Type.DType)
	}
	bad := 0
	first := -1
	for i := 0; i < want.Type.Size(); i++ {
		ok := sameElem(got, want, i)
		if byValue {
			ok = got.Float64At(i) == want.Float64At(i)
		}
		if !ok {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad > 0 {
		return bad, fmt.Errorf("%d of %d elements differ; first at %d: got %s, JAX %s", bad, want.Type.Size(), first, elemString(got, first), elemString(want, first))
	}
	return 0, nil
}

// randomULPBound is the largest error allowed for a floating-point random
// case, in ulps of max(1, |x|, |lo|, |hi|) (the size of the terms XLA fuses,
// see scaledULP), with the reason; 0 means bit for bit (gen.py --check
// holds every jax.random golden bit for bit across CPUs too).
//
// XLA:CPU contracts a*b+c into a fused multiply-add (LLVM's fp-contract), so
// JAX computes uniform's scaling u·(hi-lo)+lo, the Horner steps of the erfinv
// polynomial in normal and truncated_normal, and its f64 erfinv with one
// rounding where Ferry's separate multiply and add round twice. Ferry has no
// FMA op; its values are within a few ulps (measured and printed).
func randomULPBound(c *randomCase, dt ir.DType) (int64, string) {
	if dt != ir.Float32 && dt != ir.Float64 {
		return 0, ""
	}
	switch c.Fn {
	case "uniform":
		if c.float("lo") == 0 && c.float("hi") == 1 {
			return 0, ""
		}
		return 4, "XLA fuses u*(hi-lo)+lo into an FMA"
	case "normal", "truncated_normal":
		if dt == ir.Float64 {
			return 16, "XLA's f64 erfinv (its own polynomial, FMA) vs Ferry's Giles polynomial refined by Newton steps on erf"
		}
		return 4, "XLA fuses the erfinv polynomial's multiply-adds (and the bound scaling) into FMAs"
	}
	return 0, ""
}

// scaledULP is |got-want| at i in units of the ulp of max(1, |want|, |lo|,
// |hi|): FMA contraction changes a result by about one rounding of its
// largest term, which is many ulps of a result near zero.
func scaledULP(c *randomCase, got, want *ir.Literal, i int) int64 {
	if isNaN(got, i) || isNaN(want, i) {
		if isNaN(got, i) && isNaN(want, i) {
			return 0
		}
		return math.MaxInt64
	}
	g, w := got.Float64At(i), want.Float64At(i)
	if g == w {
		return 0
	}
	m := max(1, math.Abs(w))
	if c.Fn == "uniform" {
		m = max(m, math.Abs(c.float("lo")), math.Abs(c.float("hi")))
	}
	eps := 0x1p-52
	if want.Type.DType == ir.Float32 {
		eps = 0x1p-23
	}
	_, e := math.Frexp(m) // m = f·2^e, f in [0.5, 1): ulp(m) = eps·2^(e-1)
	return int64(math.Ceil(math.Abs(g-w) / math.Ldexp(eps, e-1)))
}

// TestRandomMatchesJAX compares package random with jax.random bit for bit
// (floats within randomULPBound where XLA uses FMAs), eagerly and under
// rt.Jit, in both Threefry layouts.
func TestRandomMatchesJAX(t *testing.T) {
	var meta struct {
		JAX string `json:"jax"`
	}
	cases := readGolden[randomCase](t, "random.jsonl.gz", &meta)
	if len(cases) == 0 {
		t.Fatal("random.jsonl.gz has no cases")
	}
	t.Logf("golden cases from JAX %s: %d", meta.JAX, len(cases))
	fns := map[string]int{}
	type stat struct {
		max   int64
		bound int64
		n     int
		why   string
	}
	stats := map[string]*stat{}
	for _, c := range cases {
		want, err := c.Out.literal()
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		fns[c.Fn]++
		layout := "original"
		if c.Partitionable {
			layout = "partitionable"
		}
		key := fmt.Sprintf("%-16s %-5s %s", c.Fn, want.Type.DType, layout)
		st := stats[key]
		if st == nil {
			st = &stat{}
			stats[key] = st
		}
		st.n++
		bound, why := randomULPBound(c, want.Type.DType)
		st.bound, st.why = bound, why
		for _, jit := range []bool{false, true} {
			path := "eager"
			if jit {
				path = "jit"
			}
			got, err := runRandom(c, jit)
			if err != nil {
				t.Errorf("%s [%s]: %v", c.Name, path, err)
				continue
			}
			if bound > 0 && got.Type.DType == want.Type.DType && got.Type.Shape.Equal(want.Type.Shape) {
				worst := int64(0)
				for i := 0; i < want.Type.Size(); i++ {
					worst = max(worst, scaledULP(c, got, want, i))
				}
				st.max = max(st.max, worst)
				if worst > bound {
					t.Errorf("%s [%s]: %d ulps from JAX, bound %d (%s)", c.Name, path, worst, bound, why)
				}
				continue
			}
			if _, err := sameRandom(got, want); err != nil {
				t.Errorf("%s [%s]: %v", c.Name, path, err)
			}
		}
	}
	for _, f := range []string{"key", "split", "fold_in", "bits", "uniform", "normal", "truncated_normal", "bernoulli", "categorical", "permutation"} {
		if fns[f] == 0 {
			t.Errorf("no golden case for jax.random.%s", f)
		}
	}
	keys := make([]string, 0, len(stats))
	for k := range stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t.Logf("%-36s %5s %8s %8s  %s", "function dtype layout", "cases", "max err", "bound", "note (err: ulps of max(1,|x|,|lo|,|hi|))")
	for _, k := range keys {
		s := stats[k]
		note := s.why
		if s.bound == 0 {
			note = "bit for bit"
		}
		t.Logf("%-36s %5d %8d %8d  %s", k, s.n, s.max, s.bound, note)
	}
}
