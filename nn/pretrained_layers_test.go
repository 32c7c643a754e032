package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// tensorOf returns a's values and shape as a reference tensor.
func tensorOf(a *trace.Array) tensor {
	return tensor{shape: []int(a.Shape().Clone()), data: a.Float64s()}
}

// refLinear is x [..., in] times W ([in, out], or [out, in] with
// LayoutOutIn) plus the bias, in float64.
func refLinear(x tensor, l nn.Linear) tensor {
	w := tensorOf(l.W)
	in, out := w.shape[0], w.shape[1]
	if l.Layout == nn.LayoutOutIn {
		in, out = out, in
	}
	n := len(x.data) / in
	y := tensor{shape: append(append([]int{}, x.shape[:len(x.shape)-1]...), out), data: make([]float64, n*out)}
	var b []float64
	if l.B != nil {
		b = l.B.Float64s()
	}
	for i := range n {
		for o := range out {
			s := 0.0
			if b != nil {
				s = b[o]
			}
			for k := range in {
				wk := w.data[k*out+o]
				if l.Layout == nn.LayoutOutIn {
					wk = w.data[o*in+k]
				}
				s += x.data[i*in+k] * wk
			}
			y.data[i*out+o] = s
		}
	}
	return y
}

func mapT(x tensor, f func(float64) float64) tensor {
	y := tensor{shape: x.shape, data: make([]float64, len(x.data))}
	for i, e := range x.data {
		y.data[i] = f(e)
	}
	return y
}

func zipT(x, y tensor, f func(a, b float64) float64) tensor {
	z := tensor{shape: x.shape, data: make([]float64, len(x.data))}
	for i := range x.data {
		z.data[i] = f(x.data[i], y.data[i])
	}
	return z
}

func reshapeT(x tensor, shape ...int) tensor { return tensor{shape: shape, data: x.data} }

func geluErfRef(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }
func geluTanhRef(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}
func siluRef(x float64) float64 { return x / (1 + math.Exp(-x)) }

// refNorm is LayerNorm or RMSNorm of x over its last axis, in float64.
func refNorm(x tensor, n nn.Normalizer) tensor {
	d := x.shape[len(x.shape)-1]
	y := tensor{shape: x.shape, data: make([]float64, len(x.data))}
	var scale, bias []float64
	var eps float64
	rms := false
	switch n := n.(type) {
	case nn.LayerNorm:
		eps = n.Eps
		if n.Scale != nil {
			scale = n.Scale.Float64s()
		}
		if n.Bias != nil {
			bias = n.Bias.Float64s()
		}
	case nn.RMSNorm:
		eps, scale, rms = n.Eps, n.Scale.Float64s(), true
	default:
		panic(fmt.Sprintf("refNorm: %T", n))
	}
	for r := 0; r < len(x.data); r += d {
		row := x.data[r : r+d]
		mu := 0.0
		if !rms {
			for _, e := range row {
				mu += e
			}
			mu /= float64(d)
		}
		v := 0.0
		for _, e := range row {
			v += (e - mu) * (e - mu)
		}
		v /= float64(d)
		for j := range d {
			o := (row[j] - mu) / math.Sqrt(v+eps)
			if scale != nil {
				o *= scale[j]
			}
			if bias != nil {
				o += bias[j]
			}
			y.data[r+j] = o
		}
	}
	return y
}

// refRoPE rotates x [B, T, heads, H] at positions pos(b, t), in float64,
// from the definition: pairs (i, i+d/2) or (2i, 2i+1) of the first d
// features rotated by pos·θ^(−2i/d).
func refRoPE(x tensor, r nn.RoPE, pos func(b, t int) int) tensor {
	if r.Style == nn.NoRoPE {
		return x
	}
	B, T, N, H := x.shape[0], x.shape[1], x.shape[2], x.shape[3]
	d := r.Dims
	if d == 0 {
		d = H
	}
	theta := r.Theta
	if theta == 0 {
		theta = 10000
	}
	y := tensor{shape: x.shape, data: append([]float64(nil), x.data...)}
	for b := range B {
		for t := range T {
			for n := range N {
				base := ((b*T+t)*N + n) * H
				for i := range d / 2 {
					ang := float64(pos(b, t)) * math.Pow(theta, -float64(2*i)/float64(d))
					i0, i1 := i, i+d/2
					if r.Style == nn.RoPEInterleaved {
						i0, i1 = 2*i, 2*i+1
					}
					a, c := x.data[base+i0], x.data[base+i1]
					y.data[base+i0] = a*math.Cos(ang) - c*math.Sin(ang)
					y.data[base+i1] = c*math.Cos(ang) + a*math.Sin(ang)
				}
			}
		}
	}
	return y
}

// refSelfAttention is SelfAttention in float64: projections, RoPE at
// positions pos, refDPA with the padding mask keep[b][s] and the layer's
// causal flag, output projection.
func refSelfAttention(x tensor, a nn.SelfAttention, keep [][]bool, pos func(b, t int) int) tensor {
	B, T := x.shape[0], x.shape[1]
	kvh := a.KVHeads
	if kvh == 0 {
		kvh = a.Heads
	}
	hd := a.Q.Out() / a.Heads
	q := refRoPE(reshapeT(refLinear(x, a.Q), B, T, a.Heads, hd), a.RoPE, pos)
	k := refRoPE(reshapeT(refLinear(x, a.K), B, T, kvh, hd), a.RoPE, pos)
	v := reshapeT(refLinear(x, a.V), B, T, kvh, hd)
	o := refAttnOpts{causal: a.Causal, scale: a.Scale}
	if keep != nil {
		m := tensor{shape: []int{B, 1, 1, T}, data: make([]float64, B*T)}
		for b := range B {
			for s := range T {
				if keep[b][s] {
					m.data[b*T+s] = 1
				}
			}
		}
		o.mask = &m
	}
	att := refDPA(q, k, v, o)
	return refLinear(reshapeT(att, B, T, a.Heads*hd), a.O)
}

func refFFN(x tensor, f nn.FeedForward) tensor {
	switch f := f.(type) {
	case nn.MLP:
		act := actRef(f.Activation, geluTanhRef)
		for i, l := range f.Layers {
			x = refLinear(x, l)
			if i < len(f.Layers)-1 {
				x = mapT(x, act)
			}
		}
		return x
	case nn.SwiGLU:
		act := actRef(f.Activation, siluRef)
		g := mapT(refLinear(x, f.Gate), act)
		return refLinear(zipT(g, refLinear(x, f.Up), func(a, b float64) float64 { return a * b }), f.Down)
	}
	panic(fmt.Sprintf("refFFN: %T", f))
}

// actRef is the float64 form of one of nn's activations (def for nil).
func actRef(a nn.Activation, def func(float64) float64) func(float64) float64 {
	if a == nil {
		return def
	}
	probe := a(trace.Const([]float64{0.7}, 1)).Float64s()[0]
	for _, f := range []func(float64) float64{geluErfRef, geluTanhRef, siluRef} {
		if math.Abs(f(0.7)-probe) < 1e-12 {
			return f
		}
	}
	panic("actRef: unknown activation")
}

func addT(a, b tensor) tensor { return zipT(a, b, func(x, y float64) float64 { return x + y }) }

// refBlockT is a TransformerBlock in float64, from its definition.
func refBlockT(x tensor, b nn.TransformerBlock, keep [][]bool, pos func(b, t int) int) tensor {
	attn := func(x tensor) tensor { return refSelfAttention(x, b.Attn, keep, pos) }
	switch b.Placement {
	case nn.PreNorm:
		x = addT(x, attn(refNorm(x, b.AttnNorm)))
		return addT(x, refFFN(refNorm(x, b.MLPNorm), b.MLP))
	case nn.PostNorm:
		x = refNorm(addT(x, attn(x)), b.AttnNorm)
		return refNorm(addT(x, refFFN(x, b.MLP)), b.MLPNorm)
	}
	return addT(addT(x, attn(refNorm(x, b.AttnNorm))), refFFN(refNorm(x, b.MLPNorm), b.MLP))
}

func seqPos(_, t int) int { return t }

// Linear in both layouts against float64; the same key gives the same layer
// in both; the [out, in] layout compiles to a dot_general without a
// transpose.
func TestLinearLayouts(t *testing.T) {
	r := testseed.Rand(t, 10)
	in, out := 1+r.IntN(6), 1+r.IntN(6)
	key := random.NewKey(r.Uint64())
	a := nn.NewLinearLayout(key, ir.Float32, in, out, nn.LayoutInOut, nn.LecunNormal, nn.NormalInit(1))
	b := nn.NewLinearLayout(key, ir.Float32, in, out, nn.LayoutOutIn, nn.LecunNormal, nn.NormalInit(1))
	if !b.W.Shape().Equal(ir.Shape{out, in}) || b.In() != in || b.Out() != out || a.In() != in || a.Out() != out {
		t.Fatalf("shapes: %v (In %d Out %d), want [%d %d]", b.W.Shape(), b.In(), b.Out(), out, in)
	}
	x, xr := randT(r, ir.Float32, 1, 2, 3, in)
	checkClose(t, "Linear in,out", a.Apply(x), ir.Float32, refLinear(xr, a), 1e-5)
	checkClose(t, "Linear out,in", b.Apply(x), ir.Float32, refLinear(xr, b), 1e-5)
	close(t, "same key, both layouts", b.Apply(x).Float64s(), a.Apply(x).Float64s(), 1e-6)
	// A weight stored [out, in] (as PyTorch) used as it is.
	w, _ := randT(r, ir.Float32, 1, out, in)
	l := nn.Linear{W: w, Layout: nn.LayoutOutIn}
	checkClose(t, "Linear torch weight", l.Apply(x), ir.Float32, refLinear(xr, l), 1e-5)
	low, err := rt.Lower(func(l nn.Linear, x *trace.Array) *trace.Array { return l.Apply(x) }, l, x)
	if err != nil {
		t.Fatal(err)
	}
	if ir := low.IR(); strings.Contains(ir, "transpose") || !strings.Contains(ir, "dot_general") {
		t.Fatalf("LayoutOutIn should be one dot_general without a transpose:\n%s", ir)
	}
	// The gradient has the weight's layout.
	g := trace.Grad(func(l nn.Linear) *trace.Array { return trace.Sum(l.Apply(x)) })(l)
	if !g.W.Shape().Equal(ir.Shape{out, in}) || g.Layout != nn.LayoutOutIn {
		t.Fatalf("gradient %v %v", g.W.Type(), g.Layout)
	}
}

// The activations against their float64 formulas.
func TestActivations(t *testing.T) {
	r := testseed.Rand(t, 11)
	x, xr := randT(r, ir.Float32, 4, 64)
	checkClose(t, "GeluErf", nn.GeluErf(x), ir.Float32, mapT(xr, geluErfRef), 1e-5)
	checkClose(t, "GeluTanh", nn.GeluTanh(x), ir.Float32, mapT(xr, geluTanhRef), 1e-5)
	checkClose(t, "Gelu", nn.Gelu(x), ir.Float32, mapT(xr, geluTanhRef), 1e-5)
	checkClose(t, "Silu", nn.Silu(x), ir.Float32, mapT(xr, siluRef), 1e-5)
	// The two forms differ by more than rounding, so using one for the other
	// is visible.
	d := 0.0
	for _, e := range xr.data {
		d = math.Max(d, math.Abs(geluErfRef(e)-geluTanhRef(e)))
	}
	if d < 1e-4 {
		t.Fatalf("erf and tanh GELU differ by only %g on these inputs", d)
	}
}

// RoPE in both conventions, whole and partial, with shared and per-batch
// positions, f32 and bf16, against float64; its gradient against finite
// differences; and the property that makes it a relative encoding.
func TestRoPE(t *testing.T) {
	r := testseed.Rand(t, 12)
	B, T, N, H := 2, 2+r.IntN(4), 1+r.IntN(3), 2*(1+r.IntN(4))
	for _, style := range []nn.RoPEStyle{nn.RoPEHalf, nn.RoPEInterleaved} {
		for _, dims := range []int{0, 2} {
			for _, dt := range []ir.DType{ir.Float32, ir.BFloat16} {
				rope := nn.RoPE{Style: style, Theta: []float64{0, 500000}[r.IntN(2)], Dims: dims}
				x, xr := randT(r, dt, 1, B, T, N, H)
				tol := 2e-5
				if dt == ir.BFloat16 {
					tol = 2e-2
				}
				name := fmt.Sprintf("%v dims=%d theta=%v %v", style, dims, rope.Theta, dt)
				checkClose(t, name, rope.Apply(x, nil), dt, refRoPE(xr, rope, seqPos), tol)
				p := make([]int32, B*T)
				for i := range p {
					p[i] = int32(r.IntN(100))
				}
				pos := rt.FromSlice(p, B, T)
				checkClose(t, name+" positions", rope.Apply(x, pos), dt, refRoPE(xr, rope, func(b, t int) int { return int(p[b*T+t]) }), tol)
			}
		}
		// q·k after rotation depends only on the distance of the positions.
		rope := nn.RoPE{Style: style}
		q, _ := randT(r, ir.Float64, 1, 1, 1, 1, H)
		k, _ := randT(r, ir.Float64, 1, 1, 1, 1, H)
		dot := func(pq, pk int32) float64 {
			a := rope.Apply(q, rt.FromSlice([]int32{pq}, 1))
			b := rope.Apply(k, rt.FromSlice([]int32{pk}, 1))
			return trace.Sum(trace.Mul(a, b)).Item()
		}
		if d1, d2 := dot(7, 3), dot(24, 20); math.Abs(d1-d2) > 1e-9 {
			t.Fatalf("%v: q·k at (7, 3) is %v, at (24, 20) %v", style, d1, d2)
		}
		// Gradient against finite differences, in f64.
		x, _ := randT(r, ir.Float64, 1, B, T, N, H)
		w, _ := randT(r, ir.Float64, 1, B, T, N, H)
		f := func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(rope.Apply(x, nil), w)) }
		fdCheck(t, r, fmt.Sprintf("RoPE %v grad", style), func(x *trace.Array) float64 { return f(x).Item() }, x, trace.Grad(f)(x), 6)
	}
	var err error
	func() {
		defer trace.Recover(&err)
		nn.RoPE{Style: nn.RoPEHalf, Dims: 3}.Apply(trace.Zeros(ir.Shape{1, 2, 1, 4}, ir.Float32), nil)
	}()
	if err == nil || !strings.Contains(err.Error(), "even") {
		t.Fatalf("odd Dims: got %v", err)
	}
}

// RMSNorm and LayerNorm (with its Eps) against float64, and their gradients
// against finite differences.
func TestNormsPretrained(t *testing.T) {
	r := testseed.Rand(t, 13)
	d := 2 + r.IntN(8)
	x, xr := randT(r, ir.Float64, 2, 3, d)
	s, _ := randT(r, ir.Float64, 1, d)
	bias, _ := randT(r, ir.Float64, 1, d)
	for _, n := range []nn.Normalizer{
		nn.RMSNorm{Scale: s, Eps: 1e-5},
		nn.LayerNorm{Scale: s, Bias: bias, Eps: 1e-12},
		nn.LayerNorm{Scale: s, Eps: 0.5}, // no bias, a large eps that shows
	} {
		name := fmt.Sprintf("%T", n)
		checkClose(t, name, n.Apply(x), ir.Float64, refNorm(xr, n), 1e-10)
		w, _ := randT(r, ir.Float64, 1, 3, d)
		f := func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(n.Apply(x), w)) }
		fdCheck(t, r, name+" grad", func(x *trace.Array) float64 { return f(x).Item() }, x, trace.Grad(f)(x), 6)
	}
	if n := nn.NewLayerNormEps(ir.Float32, 4, 1e-12); n.Eps != 1e-12 || n.Scale == nil || n.Bias == nil {
		t.Fatalf("NewLayerNormEps: %+v", n)
	}
}

// SwiGLU against float64, in both layouts.
func TestSwiGLU(t *testing.T) {
	r := testseed.Rand(t, 14)
	d, h := 2+r.IntN(6), 2+r.IntN(10)
	for _, layout := range []nn.LinearLayout{nn.LayoutInOut, nn.LayoutOutIn} {
		m := nn.NewSwiGLU(random.NewKey(r.Uint64()), ir.Float32, d, h, layout, nn.NormalInit(0.5))
		x, xr := randT(r, ir.Float32, 1, 2, 3, d)
		checkClose(t, "SwiGLU "+layout.String(), m.Apply(x), ir.Float32, refFFN(xr, m), 1e-5)
	}
}

// attnCase draws a random attention configuration.
func attnCase(r *rand.Rand) nn.AttentionConfig {
	kv := 1 + r.IntN(2)
	heads := kv * (1 + r.IntN(2))
	hd := 2 * (1 + r.IntN(3))
	return nn.AttentionConfig{
		D: 2 + r.IntN(8), Heads: heads, KVHeads: kv, HeadDim: hd,
		QKVBias: r.IntN(2) == 0, OutBias: r.IntN(2) == 0, Causal: r.IntN(2) == 0,
		RoPE:   nn.RoPE{Style: nn.RoPEStyle(r.IntN(3))},
		Layout: nn.LinearLayout(r.IntN(2)),
		Init:   nn.NormalInit(0.5),
	}
}

// randomize replaces every leaf of a tree with random values of its shape
// and dtype (so that biases and norm scales are not trivial).
func randomize[T any](r *rand.Rand, tree T, a float64) T {
	out, err := trace.MapAs(tree, func(x *trace.Array) *trace.Array {
		y, _ := randT(r, x.DType(), a, x.Shape()...)
		return y
	})
	if err != nil {
		panic(err)
	}
	return out
}

// SelfAttention against float64 over random configurations (biases, GQA,
// causal, RoPE, both layouts), with a padding mask.
func TestSelfAttention(t *testing.T) {
	r := testseed.Rand(t, 15)
	for it := range 12 {
		c := attnCase(r)
		a := randomize(r, nn.NewSelfAttention(random.NewKey(r.Uint64()), ir.Float32, c), 0.6)
		B, T := 2, 1+r.IntN(5)
		x, xr := randT(r, ir.Float32, 1, B, T, c.D)
		keep := make([][]bool, B)
		flat := make([]bool, B*T)
		for b := range B {
			keep[b] = make([]bool, T)
			for s := range T {
				keep[b][s] = s == 0 || r.IntN(4) != 0
				flat[b*T+s] = keep[b][s]
			}
		}
		ctx := nn.Context{Padding: rt.FromSlice(flat, B, T)}
		name := fmt.Sprintf("case %d %+v", it, c)
		checkClose(t, name, a.Apply(x, ctx), ir.Float32, refSelfAttention(xr, a, keep, seqPos), 1e-4)
	}
}

// A padded batch gives the real tokens the outputs of the unpadded
// sequence, with the padding given as Hugging Face's int attention_mask,
// whatever the padding tokens hold.
func TestSelfAttentionPadding(t *testing.T) {
	r := testseed.Rand(t, 16)
	c := attnCase(r)
	c.RoPE = nn.RoPE{Style: nn.RoPEHalf}
	a := nn.NewSelfAttention(random.NewKey(r.Uint64()), ir.Float32, c)
	T, pad := 2+r.IntN(4), 1+r.IntN(3)
	x, _ := randT(r, ir.Float32, 1, 1, T, c.D)
	want := a.Apply(x, nn.Context{})
	junk, _ := randT(r, ir.Float32, 5, 1, pad, c.D)
	xp := trace.Concatenate(1, x, junk)
	m := make([]int32, T+pad)
	for i := range T {
		m[i] = 1
	}
	got := a.Apply(xp, nn.Context{Padding: rt.FromSlice(m, 1, T+pad)})
	close(t, "padded", trace.SliceAxis(got, 1, 0, T).Float64s(), want.Float64s(), 1e-5)
	// Left padding with positions that skip it.
	xl := trace.Concatenate(1, junk, x)
	ml := make([]int32, T+pad)
	pl := make([]int32, T+pad)
	for i := range T {
		ml[pad+i], pl[pad+i] = 1, int32(i)
	}
	got = a.Apply(xl, nn.Context{Padding: rt.FromSlice(ml, 1, T+pad), Positions: rt.FromSlice(pl, 1, T+pad)})
	close(t, "left padded", trace.SliceAxis(got, 1, pad, pad+T).Float64s(), want.Float64s(), 1e-5)
}

// Grouped-query attention equals multi-head attention whose key and value
// projections repeat each key/value head for its group.
func TestSelfAttentionGQA(t *testing.T) {
	r := testseed.Rand(t, 17)
	c := nn.AttentionConfig{D: 8, Heads: 4, KVHeads: 2, Causal: true, RoPE: nn.RoPE{Style: nn.RoPEHalf}, QKVBias: true, Layout: nn.LayoutOutIn}
	a := randomize(r, nn.NewSelfAttention(random.NewKey(r.Uint64()), ir.Float32, c), 0.5)
	// Repeat the [out, in] rows of K and V head by head: out = kv·hd → kv·G·hd.
	rep := func(l nn.Linear) nn.Linear {
		hd, in := 2, l.In()
		w := trace.Reshape(l.W, 2, 1, hd, in)
		w = trace.Reshape(trace.BroadcastInDim(w, ir.Shape{2, 2, hd, in}, []int{0, 1, 2, 3}), 8, in)
		b := trace.Reshape(trace.BroadcastInDim(trace.Reshape(l.B, 2, 1, hd), ir.Shape{2, 2, hd}, []int{0, 1, 2}), 8)
		return nn.Linear{W: w, B: b, Layout: nn.LayoutOutIn}
	}
	m := a
	m.K, m.V, m.KVHeads = rep(a.K), rep(a.V), 0
	x, _ := randT(r, ir.Float32, 1, 2, 5, 8)
	close(t, "GQA = repeated MHA", a.Apply(x, nn.Context{}).Float64s(), m.Apply(x, nn.Context{}).Float64s(), 1e-5)
}

// blockConfigs are the three families' block shapes at tiny sizes.
func blockConfigs(r *rand.Rand) map[string]nn.BlockConfig {
	d := 8 * (1 + r.IntN(2))
	return map[string]nn.BlockConfig{
		"bert": {Attention: nn.AttentionConfig{D: d, Heads: 2, QKVBias: true, OutBias: true, Layout: nn.LayoutOutIn, Init: nn.NormalInit(0.5)},
			Hidden: 2 * d, NormEps: 1e-12, Placement: nn.PostNorm, Activation: nn.GeluErf, MLPBias: true},
		"gpt2": {Attention: nn.AttentionConfig{D: d, Heads: 2, QKVBias: true, OutBias: true, Causal: true, Init: nn.NormalInit(0.5)},
			Hidden: 4 * d, NormEps: 1e-5, Activation: nn.GeluTanh, MLPBias: true},
		"llama": {Attention: nn.AttentionConfig{D: d, Heads: 4, KVHeads: 2, Causal: true, RoPE: nn.RoPE{Style: nn.RoPEHalf}, Layout: nn.LayoutOutIn, Init: nn.NormalInit(0.5)},
			Hidden: 3 * d, Norm: nn.RMSNormKind, NormEps: 1e-6, FFN: nn.SwiGLUKind},
		"gptj": {Attention: nn.AttentionConfig{D: d, Heads: 2, HeadDim: 4, Causal: true, RoPE: nn.RoPE{Style: nn.RoPEInterleaved, Dims: 2}, Init: nn.NormalInit(0.5)},
			Hidden: 2 * d, NormEps: 1e-5, Placement: nn.ParallelResidual, Activation: nn.GeluTanh, MLPBias: true},
	}
}

// Each family's block against its float64 definition; L stacked blocks
// scanned (plain and rematerialised) equal the blocks applied one by one;
// gradients through the scan equal those through the unrolled layers.
func TestTransformerBlocks(t *testing.T) {
	r := testseed.Rand(t, 18)
	for _, fam := range []string{"bert", "gpt2", "llama", "gptj"} {
		c := blockConfigs(r)[fam]
		blk := randomize(r, nn.NewTransformerBlock(random.NewKey(r.Uint64()), ir.Float32, c), 0.5)
		B, T := 2, 2+r.IntN(4)
		x, xr := randT(r, ir.Float32, 1, B, T, c.Attention.D)
		keep := [][]bool{make([]bool, T), make([]bool, T)}
		flat := make([]bool, B*T)
		for b := range B {
			for s := range T {
				keep[b][s] = b == 0 || s < T-1
				flat[b*T+s] = keep[b][s]
			}
		}
		ctx := nn.Context{Padding: rt.FromSlice(flat, B, T)}
		checkClose(t, fam+" block", blk.Apply(x, ctx), ir.Float32, refBlockT(xr, blk, keep, seqPos), 1e-4)

		const L = 3
		st := rt.Jit(func(k *trace.Array) nn.TransformerStack { return nn.NewTransformerStack(k, ir.Float32, L, c) })(random.NewKey(r.Uint64()))
		st = randomize(r, st, 0.5)
		if st.Layers() != L {
			t.Fatalf("%s: %d layers", fam, st.Layers())
		}
		for _, l := range trace.Leaves(st) {
			if l.Shape()[0] != L || l.DType() != ir.Float32 {
				t.Fatalf("%s: leaf %v lacks the layer axis", fam, l.Type())
			}
		}
		want := x
		for i := range L {
			want = st.Layer(i).Apply(want, ctx)
		}
		scanned := rt.Jit(func(s nn.TransformerStack, x, pad *trace.Array) *trace.Array {
			return s.Apply(x, nn.Context{Padding: pad})
		})(st, x, ctx.Padding)
		close(t, fam+" scanned", scanned.Float64s(), want.Float64s(), 1e-5)
		remat := rt.Jit(func(s nn.TransformerStack, x, pad *trace.Array) *trace.Array {
			return s.Apply(x, nn.Context{Padding: pad}, nn.WithRemat(trace.NothingSaveable))
		})(st, x, ctx.Padding)
		close(t, fam+" scanned remat", remat.Float64s(), want.Float64s(), 1e-5)

		gScan := rt.Jit(trace.Grad(func(s nn.TransformerStack) *trace.Array {
			return trace.Mean(trace.Square(s.Apply(x, ctx, nn.WithRemat(trace.NothingSaveable))))
		}))(st)
		gUnrolled := trace.Grad(func(s nn.TransformerStack) *trace.Array {
			y := x
			for i := range L {
				y = s.Layer(i).Apply(y, ctx)
			}
			return trace.Mean(trace.Square(y))
		})(st)
		ls, lu := trace.Leaves(gScan), trace.Leaves(gUnrolled)
		paths, _ := trace.Structure(gScan)
		for i := range ls {
			close(t, fam+" grad "+paths.Paths()[i], ls[i].Float64s(), lu[i].Float64s(), 1e-4)
		}
	}
}

// The leaves of a block have readable paths for loading checkpoints.
func TestTransformerBlockPaths(t *testing.T) {
	c := blockConfigs(rand.New(rand.NewPCG(1, 2)))["llama"]
	d, err := trace.Structure(nn.NewTransformerBlock(random.NewKey(0), ir.Float32, c))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(d.Paths(), " ")
	want := "AttnNorm.Scale Attn.Q.W Attn.K.W Attn.V.W Attn.O.W MLPNorm.Scale MLP.Gate.W MLP.Up.W MLP.Down.W"
	if got != want {
		t.Fatalf("paths %q, want %q", got, want)
	}
}
