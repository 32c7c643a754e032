package nn_test

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// randArr returns an f32 array of the given shape with values uniform in
// (-1, 1) and the same values as float64s.
func randArr(r *rand.Rand, shape ...int) (*trace.Array, []float64) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	f := make([]float32, n)
	g := make([]float64, n)
	for i := range f {
		f[i] = float32(2*r.Float64() - 1)
		g[i] = float64(f[i])
	}
	return rt.FromSlice(f, shape...), g
}

func close(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > tol*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// refDense is x [n, in] · w [in, out] + b [out] (b may be nil).
func refDense(x, w, b []float64, in, out int) []float64 {
	n := len(x) / in
	y := make([]float64, n*out)
	for i := range n {
		for o := range out {
			s := 0.0
			if b != nil {
				s = b[o]
			}
			for k := range in {
				s += x[i*in+k] * w[k*out+o]
			}
			y[i*out+o] = s
		}
	}
	return y
}

func refLayerNorm(x, scale, bias []float64, d int, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < len(x); r += d {
		mu, v := 0.0, 0.0
		for _, e := range x[r : r+d] {
			mu += e
		}
		mu /= float64(d)
		for _, e := range x[r : r+d] {
			v += (e - mu) * (e - mu)
		}
		v /= float64(d)
		for j := range d {
			y[r+j] = (x[r+j]-mu)/math.Sqrt(v+eps)*scale[j] + bias[j]
		}
	}
	return y
}

func refGelu(x []float64) []float64 {
	y := make([]float64, len(x))
	for i, e := range x {
		y[i] = 0.5 * e * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(e+0.044715*e*e*e)))
	}
	return y
}

func add(a, b []float64) []float64 {
	y := make([]float64, len(a))
	for i := range a {
		y[i] = a[i] + b[i]
	}
	return y
}

// refAttention is causal multi-head attention of x [b, t, d].
func refAttention(x []float64, a nn.Attention, b, t, d int) []float64 {
	h := a.Heads
	dh := d / h
	q := refDense(x, a.Wq.Float64s(), nil, d, d)
	k := refDense(x, a.Wk.Float64s(), nil, d, d)
	v := refDense(x, a.Wv.Float64s(), nil, d, d)
	o := make([]float64, b*t*d)
	for bi := range b {
		for hi := range h {
			for qi := range t {
				s := make([]float64, qi+1) // only k ≤ q
				mx := math.Inf(-1)
				for ki := 0; ki <= qi; ki++ {
					for j := range dh {
						s[ki] += q[(bi*t+qi)*d+hi*dh+j] * k[(bi*t+ki)*d+hi*dh+j]
					}
					s[ki] /= math.Sqrt(float64(dh))
					mx = math.Max(mx, s[ki])
				}
				z := 0.0
				for ki := range s {
					s[ki] = math.Exp(s[ki] - mx)
					z += s[ki]
				}
				for ki := range s {
					for j := range dh {
						o[(bi*t+qi)*d+hi*dh+j] += s[ki] / z * v[(bi*t+ki)*d+hi*dh+j]
					}
				}
			}
		}
	}
	return refDense(o, a.Wo.Float64s(), nil, d, d)
}

func refBlock(x []float64, bl nn.Block, b, t, d int) []float64 {
	ln := func(n nn.LayerNorm, x []float64) []float64 {
		return refLayerNorm(x, n.Scale.Float64s(), n.Bias.Float64s(), d, n.Eps)
	}
	x = add(x, refAttention(ln(bl.LN1, x), bl.Attn, b, t, d))
	l0, l1 := bl.MLP.Layers[0], bl.MLP.Layers[1]
	hidden := l0.W.Shape()[1]
	m := refGelu(refDense(ln(bl.LN2, x), l0.W.Float64s(), l0.B.Float64s(), d, hidden))
	return add(x, refDense(m, l1.W.Float64s(), l1.B.Float64s(), hidden, d))
}

func TestLinear(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	l := nn.NewLinearWith(random.NewKey(0), ir.Float32, 4, 5, nn.LecunNormal, nn.NormalInit(1))
	if got := l.W.Shape(); !reflect.DeepEqual(got, ir.Shape{4, 5}) || l.B.Shape()[0] != 5 {
		t.Fatalf("shapes %v %v", l.W.Shape(), l.B.Shape())
	}
	x, xs := randArr(r, 2, 3, 4)
	y := l.Apply(x)
	if !reflect.DeepEqual(y.Shape(), ir.Shape{2, 3, 5}) {
		t.Fatalf("shape %v", y.Shape())
	}
	close(t, "Linear", y.Float64s(), refDense(xs, l.W.Float64s(), l.B.Float64s(), 4, 5), 1e-5)
	// Without bias.
	l.B = nil
	close(t, "Linear/nobias", l.Apply(x).Float64s(), refDense(xs, l.W.Float64s(), nil, 4, 5), 1e-5)
}

func TestNorms(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x, xs := randArr(r, 3, 2, 6)
	s, ss := randArr(r, 6)
	b, bs := randArr(r, 6)
	ln := nn.NewLayerNorm(ir.Float32, 6)
	ln.Scale, ln.Bias = s, b
	close(t, "LayerNorm", ln.Apply(x).Float64s(), refLayerNorm(xs, ss, bs, 6, ln.Eps), 1e-5)

	rms := nn.NewRMSNorm(ir.Float32, 6)
	rms.Scale = s
	want := make([]float64, len(xs))
	for r := 0; r < len(xs); r += 6 {
		ms := 0.0
		for _, e := range xs[r : r+6] {
			ms += e * e
		}
		ms /= 6
		for j := range 6 {
			want[r+j] = xs[r+j] / math.Sqrt(ms+rms.Eps) * ss[j]
		}
	}
	close(t, "RMSNorm", rms.Apply(x).Float64s(), want, 1e-5)

	// bf16 in, bf16 out (computed in f32).
	xb := trace.Convert(x, ir.BFloat16)
	lb := nn.NewLayerNorm(ir.BFloat16, 6)
	if y := lb.Apply(xb); y.DType() != ir.BFloat16 {
		t.Fatalf("bf16 LayerNorm gave %v", y.DType())
	}
}

func TestEmbedding(t *testing.T) {
	e := nn.NewEmbedding(random.NewKey(5), ir.Float32, 7, 3)
	ids := rt.FromSlice([]int32{0, 6, 2, 2, 5, 1}, 2, 3)
	y := e.Apply(ids)
	if !reflect.DeepEqual(y.Shape(), ir.Shape{2, 3, 3}) {
		t.Fatalf("shape %v", y.Shape())
	}
	tab := e.Table.Float64s()
	var want []float64
	for _, id := range ids.Int32s() {
		want = append(want, tab[id*3:id*3+3]...)
	}
	close(t, "Embedding", y.Float64s(), want, 0)
	// Attend is x·Tableᵀ.
	lg := e.Attend(y)
	if !reflect.DeepEqual(lg.Shape(), ir.Shape{2, 3, 7}) {
		t.Fatalf("Attend shape %v", lg.Shape())
	}
}

func TestAttentionCausal(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const b, tt, d = 2, 5, 8
	a := nn.NewAttention(random.NewKey(7), ir.Float32, d, 2)
	x, xs := randArr(r, b, tt, d)
	y := a.Apply(x)
	close(t, "Attention", y.Float64s(), refAttention(xs, a, b, tt, d), 1e-4)

	// Changing the last position leaves the earlier outputs alone.
	xs2 := append([]float64(nil), xs...)
	f := make([]float32, len(xs2))
	for i := range xs2 {
		if (i/d)%tt == tt-1 {
			xs2[i] += 1
		}
		f[i] = float32(xs2[i])
	}
	y2 := a.Apply(rt.FromSlice(f, b, tt, d)).Float64s()
	y1 := y.Float64s()
	for i := range y1 {
		if (i/d)%tt != tt-1 && y1[i] != y2[i] {
			t.Fatalf("output %d depends on a later position", i)
		}
	}

	// bf16 attention runs (softmax in f32) and stays bf16.
	ab, err := trace.MapAs(a, func(w *trace.Array) *trace.Array { return trace.Convert(w, ir.BFloat16) })
	if err != nil {
		t.Fatal(err)
	}
	yb := ab.Apply(trace.Convert(x, ir.BFloat16))
	if yb.DType() != ir.BFloat16 {
		t.Fatalf("bf16 attention gave %v", yb.DType())
	}
	close(t, "Attention/bf16", yb.Float64s(), y1, 0.1)
}

func TestBlock(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const b, tt, d = 2, 4, 8
	bl := nn.NewBlock(random.NewKey(9), ir.Float32, d, 2, 16)
	// Non-trivial norms and biases.
	bl.LN1.Scale, _ = randArr(r, d)
	bl.LN2.Bias, _ = randArr(r, d)
	bl.MLP.Layers[0].B, _ = randArr(r, 16)
	x, xs := randArr(r, b, tt, d)
	close(t, "Block", bl.Apply(x).Float64s(), refBlock(xs, bl, b, tt, d), 1e-4)
}

func TestSoftmaxCrossEntropy(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	lg, ls := randArr(r, 2, 3, 5)
	labels := []int32{0, 4, 2, 1, 1, 3}
	got := nn.SoftmaxCrossEntropy(lg, rt.FromSlice(labels, 2, 3)).Item()
	want := 0.0
	for i, lab := range labels {
		row := ls[i*5 : i*5+5]
		z := 0.0
		for _, e := range row {
			z += math.Exp(e)
		}
		want += math.Log(z) - row[lab]
	}
	want /= float64(len(labels))
	close(t, "SoftmaxCrossEntropy", []float64{got}, []float64{want}, 1e-5)
}

func TestDropout(t *testing.T) {
	x := trace.Ones(ir.Shape{100, 100}, ir.Float32)
	if y := nn.Dropout(random.NewKey(1), x, 0.5, false); y != x {
		t.Fatal("Dropout with train=false changed x")
	}
	y := nn.Dropout(random.NewKey(1), x, 0.25, true).Float64s()
	kept := 0
	for _, e := range y {
		switch {
		case e == 0:
		case math.Abs(e-1/0.75) < 1e-6:
			kept++
		default:
			t.Fatalf("dropout value %v", e)
		}
	}
	if f := float64(kept) / float64(len(y)); math.Abs(f-0.75) > 0.03 {
		t.Fatalf("kept fraction %v, want 0.75", f)
	}
}

func TestInitializers(t *testing.T) {
	const in, out = 256, 384
	cases := []struct {
		name string
		init nn.Initializer
		v    float64
	}{
		{"LecunNormal", nn.LecunNormal, 1.0 / in},
		{"GlorotUniform", nn.GlorotUniform, 2.0 / (in + out)},
		{"GlorotNormal", nn.GlorotNormal, 2.0 / (in + out)},
		{"HeUniform", nn.HeUniform, 2.0 / in},
		{"HeNormal", nn.HeNormal, 2.0 / in},
		{"TruncatedNormal(0.02)", nn.TruncatedNormalInit(0.02), 0.02 * 0.02 * 0.87962566103423978 * 0.87962566103423978},
		{"Normal(0.5)", nn.NormalInit(0.5), 0.25},
		{"Zeros", nn.Zeros, 0},
		{"Ones", nn.Ones, 0},
	}
	for _, dt := range []ir.DType{ir.Float32, ir.BFloat16} {
		for _, c := range cases {
			w := c.init(random.NewKey(11), dt, ir.Shape{in, out})
			if w.DType() != dt || !reflect.DeepEqual(w.Shape(), ir.Shape{in, out}) {
				t.Fatalf("%s %v: got %v", c.name, dt, w.Type())
			}
			vals := w.Float64s()
			mu, v := 0.0, 0.0
			for _, e := range vals {
				mu += e
			}
			mu /= float64(len(vals))
			for _, e := range vals {
				v += (e - mu) * (e - mu)
			}
			v /= float64(len(vals))
			switch c.name {
			case "Zeros", "Ones":
				if want := map[string]float64{"Zeros": 0, "Ones": 1}[c.name]; mu != want || v != 0 {
					t.Fatalf("%s %v: mean %v var %v", c.name, dt, mu, v)
				}
				continue
			}
			if math.Abs(v/c.v-1) > 0.05 || math.Abs(mu) > 3*math.Sqrt(c.v/float64(len(vals)))+1e-3*math.Sqrt(c.v) {
				t.Errorf("%s %v: mean %v var %v, want 0 and %v", c.name, dt, mu, v, c.v)
			}
		}
	}
	// Fans of a stacked [L, in, out] shape include the receptive field L.
	if i, o := nn.Fans(ir.Shape{3, 4, 5}); i != 12 || o != 15 {
		t.Fatalf("Fans = %v, %v", i, o)
	}
}

func TestStack(t *testing.T) {
	const L, b, tt, d, h, hid = 3, 2, 4, 8, 2, 16
	initJ := rt.Jit(func(k *trace.Array) nn.Stack { return nn.NewStack(k, ir.Float32, L, d, h, hid) })
	s := initJ(random.NewKey(13))
	leaves := trace.Leaves(s)
	if len(leaves) != 12 {
		t.Fatalf("%d leaves", len(leaves))
	}
	for _, l := range leaves {
		if l.Shape()[0] != L || l.DType() != ir.Float32 {
			t.Fatalf("leaf %v lacks the layer axis", l.Type())
		}
	}
	if s.Layers() != L || s.Blocks.Attn.Heads != h || s.Blocks.LN1.Eps != 1e-6 {
		t.Fatalf("static fields lost: %+v", s.Blocks.Attn.Heads)
	}
	// Layers differ (one key per layer).
	if reflect.DeepEqual(s.Layer(0).Attn.Wq.Float64s(), s.Layer(1).Attn.Wq.Float64s()) {
		t.Fatal("layers 0 and 1 are equal")
	}
	// Eager NewStack equals the jitted one.
	close(t, "NewStack eager", nn.NewStack(random.NewKey(13), ir.Float32, L, d, h, hid).Blocks.MLP.Layers[1].W.Float64s(),
		s.Blocks.MLP.Layers[1].W.Float64s(), 1e-6)

	r := rand.New(rand.NewPCG(11, 12))
	x, _ := randArr(r, b, tt, d)
	want := x
	for i := range L {
		want = s.Layer(i).Apply(want)
	}
	got := rt.Jit(func(s nn.Stack, x *trace.Array) *trace.Array { return s.Apply(x) })(s, x)
	close(t, "Stack", got.Float64s(), want.Float64s(), 1e-4)
	gotRemat := rt.Jit(func(s nn.Stack, x *trace.Array) *trace.Array {
		return s.Apply(x, nn.WithRemat(trace.NothingSaveable))
	})(s, x)
	close(t, "Stack/remat", gotRemat.Float64s(), want.Float64s(), 1e-4)

	// Parameters in pinned host memory, copied in per layer, with the layer
	// inputs offloaded for the backward pass.
	offload := []nn.StackOption{nn.WithParamOffload(),
		nn.WithRemat(trace.SaveAndOffloadOnlyTheseNames(nil, []string{nn.BlockInput}, ir.Device, ir.PinnedHost))}
	toHost := func(s nn.Stack) nn.Stack {
		h, err := trace.MapAs(s, func(a *trace.Array) *trace.Array { return trace.DevicePut(a, ir.PinnedHost) })
		if err != nil {
			panic(err)
		}
		return h
	}
	gotOff := rt.Jit(func(s nn.Stack, x *trace.Array) *trace.Array { return toHost(s).Apply(x, offload...) })(s, x)
	close(t, "Stack/offload", gotOff.Float64s(), want.Float64s(), 1e-4)

	// Gradients through the remat'd scan equal the plain ones.
	loss := func(opts ...nn.StackOption) func(nn.Stack) *trace.Array {
		return func(s nn.Stack) *trace.Array { return trace.Mean(trace.Square(s.Apply(x, opts...))) }
	}
	g1 := rt.Jit(trace.Grad(loss()))(s)
	g2 := rt.Jit(trace.Grad(loss(nn.WithRemat(trace.NothingSaveable))))(s)
	g3 := rt.Jit(trace.Grad(func(s nn.Stack) *trace.Array { return loss(offload...)(toHost(s)) }))(s)
	l1, l2, l3 := trace.Leaves(g1), trace.Leaves(g2), trace.Leaves(g3)
	for i := range l1 {
		close(t, "Stack grad/remat", l2[i].Float64s(), l1[i].Float64s(), 1e-4)
		close(t, "Stack grad/offload", l3[i].Float64s(), l1[i].Float64s(), 1e-4)
	}
}

func TestBlockGrad(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	bl := nn.NewBlock(random.NewKey(15), ir.Float32, 8, 2, 16)
	x, _ := randArr(r, 2, 4, 8)
	labels := rt.FromSlice([]int32{0, 1, 2, 3, 4, 5, 6, 7}, 2, 4)
	g := trace.Grad(func(b nn.Block) *trace.Array {
		return nn.SoftmaxCrossEntropy(b.Apply(x), labels)
	})(bl)
	if reflect.TypeOf(g) != reflect.TypeOf(bl) {
		t.Fatalf("grad type %T", g)
	}
	d1, _ := trace.Structure(bl)
	d2, _ := trace.Structure(g)
	if !d1.Equal(d2) {
		t.Fatalf("grad structure differs: %s", d1.Diff(d2))
	}
	pl, gl := trace.Leaves(bl), trace.Leaves(g)
	for i := range pl {
		if !reflect.DeepEqual(pl[i].Type(), gl[i].Type()) {
			t.Fatalf("grad leaf %d: %v, param %v", i, gl[i].Type(), pl[i].Type())
		}
	}
	// A central finite difference in f64 on one weight of each of Wq and the
	// first MLP layer matches the gradient.
	b64, err := trace.MapAs(bl, func(a *trace.Array) *trace.Array { return trace.Convert(a, ir.Float64) })
	if err != nil {
		t.Fatal(err)
	}
	x64 := trace.Convert(x, ir.Float64)
	lossOf := func(b nn.Block) float64 { return nn.SoftmaxCrossEntropy(b.Apply(x64), labels).Item() }
	g64 := trace.Grad(func(b nn.Block) *trace.Array { return nn.SoftmaxCrossEntropy(b.Apply(x64), labels) })(b64)
	bump := func(a *trace.Array, i int, h float64) *trace.Array {
		v := a.Float64s()
		v[i] += h
		return rt.FromSlice(v, a.Shape()...)
	}
	const eps = 1e-6
	for _, i := range []int{0, 13} {
		p, m := b64, b64
		p.Attn.Wq, m.Attn.Wq = bump(b64.Attn.Wq, i, eps), bump(b64.Attn.Wq, i, -eps)
		fd := (lossOf(p) - lossOf(m)) / (2 * eps)
		close(t, "dLoss/dWq", []float64{g64.Attn.Wq.Float64s()[i]}, []float64{fd}, 1e-5)

		p.Attn.Wq, m.Attn.Wq = b64.Attn.Wq, b64.Attn.Wq
		p.MLP.Layers = []nn.Linear{{W: bump(b64.MLP.Layers[0].W, i, eps), B: b64.MLP.Layers[0].B}, b64.MLP.Layers[1]}
		m.MLP.Layers = []nn.Linear{{W: bump(b64.MLP.Layers[0].W, i, -eps), B: b64.MLP.Layers[0].B}, b64.MLP.Layers[1]}
		fd = (lossOf(p) - lossOf(m)) / (2 * eps)
		close(t, "dLoss/dW1", []float64{g64.MLP.Layers[0].W.Float64s()[i]}, []float64{fd}, 1e-5)
	}
}

func TestStackInitMemory(t *testing.T) {
	const L, d, h, hid = 8, 256, 4, 1024
	j := rt.NewJitted(func(k *trace.Array) nn.Stack { return nn.NewStack(k, ir.BFloat16, L, d, h, hid) })
	low, err := j.Lower(random.NewKey(0))
	if err != nil {
		t.Fatal(err)
	}
	c, err := low.Compile()
	if err != nil {
		t.Fatal(err)
	}
	m := c.MemoryAnalysis()
	t.Logf("NewStack(bf16, L=%d, d=%d, hidden=%d): %v; temp/output = %.4f", L, d, hid, m, float64(m.TempBytes)/float64(m.OutputBytes))
	// The arena holds no float32 (or wider) buffer: samples are generated
	// straight into bf16, the f32 sampling arithmetic stays inside fusions.
	var walk func(p *passes.RegionPlan)
	walk = func(p *passes.RegionPlan) {
		for v, b := range p.Values {
			if b.Kind == passes.BufTemp && b.Size >= 4096 && v.Type.DType != ir.BFloat16 {
				t.Errorf("temp %v (%d bytes) is not bf16", v.Type, b.Size)
			}
		}
		for _, subs := range p.Sub {
			for _, s := range subs {
				walk(s)
			}
		}
	}
	walk(c.Program().Plan)
	// Each scan step writes its layer straight into its slice of the stacked
	// outputs, so the jitted initialiser peaks at the size of what it returns:
	// temporaries are at most 5 % of the output (the goal of REFERENCES §2).
	if float64(m.TempBytes) > 0.05*float64(m.OutputBytes) {
		t.Errorf("TempBytes %d is more than 5%% of the output %d", m.TempBytes, m.OutputBytes)
	}
}
