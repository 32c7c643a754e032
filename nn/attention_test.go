package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// tensor is a float64 reference array: a shape and row-major values.
type tensor struct {
	shape []int
	data  []float64
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// at returns the element at idx, broadcasting: axes of size 1 are read at 0,
// and idx may have more (leading) axes than t.
func (t tensor) at(idx ...int) float64 {
	off := len(idx) - len(t.shape)
	f := 0
	for d, n := range t.shape {
		i := idx[off+d]
		if n == 1 {
			i = 0
		}
		f = f*n + i
	}
	return t.data[f]
}

// randT returns an array of dtype dt with values uniform in (-a, a), and its
// values (after rounding to dt) as a reference.
func randT(r *rand.Rand, dt ir.DType, a float64, shape ...int) (*trace.Array, tensor) {
	l := ir.NewLiteral(ir.TypeOf(dt, shape...))
	for i := range numel(shape) {
		l.SetFloat64At(i, a*(2*r.Float64()-1))
	}
	return trace.FromLiteral(l), tensor{shape: shape, data: l.Float64s()}
}

// boolT returns a random bool array with P(true) = p, and its values as 0/1.
func boolT(r *rand.Rand, p float64, shape ...int) (*trace.Array, tensor) {
	b := make([]bool, numel(shape))
	t := tensor{shape: shape, data: make([]float64, len(b))}
	for i := range b {
		if r.Float64() < p {
			b[i], t.data[i] = true, 1
		}
	}
	return rt.FromSlice(b, shape...), t
}

// refAttnOpts are the options of refDPA; nil tensors are absent.
type refAttnOpts struct {
	bias, mask  *tensor
	scale       float64
	causal      bool
	qLen, kvLen []int
}

// refDPA is dot-product attention in float64, written from the definition:
// for each batch b, query head n (key head n/G), query t: softmax over keys s
// of scale·q·k + bias, masked logits set to the masked value; then the
// weighted sum of the values.
func refDPA(q, k, v tensor, o refAttnOpts) tensor {
	B, T, N, H := q.shape[0], q.shape[1], q.shape[2], q.shape[3]
	S, K, Hv := k.shape[1], k.shape[2], v.shape[3]
	G := N / K
	scale := o.scale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(H))
	}
	out := tensor{shape: []int{B, T, N, Hv}, data: make([]float64, B*T*N*Hv)}
	for b := range B {
		for n := range N {
			kh := n / G
			for t := range T {
				s := make([]float64, S)
				mx := math.Inf(-1)
				for j := range S {
					for h := range H {
						s[j] += q.at(b, t, n, h) * k.at(b, j, kh, h)
					}
					s[j] *= scale
					if o.bias != nil {
						s[j] += o.bias.at(b, n, t, j)
					}
					ok := true
					if o.mask != nil && o.mask.at(b, n, t, j) == 0 {
						ok = false
					}
					if o.causal && j > t {
						ok = false
					}
					if o.qLen != nil && t >= o.qLen[b] {
						ok = false
					}
					if o.kvLen != nil && j >= o.kvLen[b] {
						ok = false
					}
					if !ok {
						s[j] = -0.7 * math.MaxFloat32
					}
					mx = math.Max(mx, s[j])
				}
				z := 0.0
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					z += s[j]
				}
				for j := range S {
					for h := range Hv {
						out.data[((b*T+t)*N+n)*Hv+h] += s[j] / z * v.at(b, j, kh, h)
					}
				}
			}
		}
	}
	return out
}

// checkClose compares got (dtype dt, the reference's shape) with want: every
// value within tol·max(1, |want|).
func checkClose(t *testing.T, name string, got *trace.Array, dt ir.DType, want tensor, tol float64) {
	t.Helper()
	if got.DType() != dt || !got.Shape().Equal(ir.Shape(want.shape)) {
		t.Fatalf("%s: %v, want %v%v", name, got.Type(), dt, want.shape)
	}
	g := got.Float64s()
	for i := range g {
		if !(math.Abs(g[i]-want.data[i]) <= tol*math.Max(1, math.Abs(want.data[i]))) {
			t.Fatalf("%s: element %d = %v, want %v (tolerance %g)", name, i, g[i], want.data[i], tol)
		}
	}
}

// broadcastShape draws a random shape broadcastable to full (each axis full
// or 1, leading axes sometimes dropped).
func broadcastShape(r *rand.Rand, full []int) []int {
	s := make([]int, len(full))
	for i, d := range full {
		if r.IntN(2) == 0 {
			s[i] = 1
		} else {
			s[i] = d
		}
	}
	drop := r.IntN(3)
	for drop > 0 && len(s) > 0 && s[0] == 1 {
		s, drop = s[1:], drop-1
	}
	return s
}

// DotProductAttention against the float64 definition: random sizes, grouped
// heads, biases and masks of random broadcast shapes, causal masks, sequence
// lengths, scales, in f32, f16 and bf16, plain and blocked.
func TestDotProductAttention(t *testing.T) {
	r := testseed.Rand(t, 1)
	for it := range 24 {
		B, T, K, G, H, Hv := 1+r.IntN(2), 1+r.IntN(5), 1+r.IntN(2), 1+r.IntN(3), 1+r.IntN(6), 1+r.IntN(5)
		S := T
		if r.IntN(2) == 0 {
			S = 1 + r.IntN(6)
		}
		N := K * G
		dt := ir.Float32
		tol := 2e-5
		switch it % 4 {
		case 2:
			dt, tol = ir.Float16, 5e-3
		case 3:
			dt, tol = ir.BFloat16, 1e-2
		}
		q, qr := randT(r, dt, 1.5, B, T, N, H)
		k, kr := randT(r, dt, 1.5, B, S, K, H)
		v, vr := randT(r, dt, 1, B, S, K, Hv)
		var opts nn.AttentionOptions
		var ro refAttnOpts
		if r.IntN(2) == 0 {
			b, br := randT(r, ir.Float32, 2, broadcastShape(r, []int{B, N, T, S})...)
			opts.Bias, ro.bias = b, &br
		}
		if r.IntN(2) == 0 {
			m, mr := boolT(r, 0.7, broadcastShape(r, []int{B, N, T, S})...)
			opts.Mask, ro.mask = m, &mr
		}
		if r.IntN(3) == 0 {
			opts.Scale = 0.1 + r.Float64()
			ro.scale = opts.Scale
		}
		opts.IsCausal = r.IntN(3) == 0
		ro.causal = opts.IsCausal
		if r.IntN(3) == 0 {
			ql, kl := make([]int32, B), make([]int32, B)
			ro.qLen, ro.kvLen = make([]int, B), make([]int, B)
			for b := range B {
				ql[b], kl[b] = int32(r.IntN(T+1)), int32(1+r.IntN(S))
				ro.qLen[b], ro.kvLen[b] = int(ql[b]), int(kl[b])
			}
			opts.QuerySeqLengths, opts.KeyValueSeqLengths = rt.FromSlice(ql, B), rt.FromSlice(kl, B)
		}
		want := refDPA(qr, kr, vr, ro)
		name := fmt.Sprintf("case %d: B=%d T=%d S=%d N=%d K=%d H=%d Hv=%d %v bias=%v mask=%v causal=%v lens=%v",
			it, B, T, S, N, K, H, Hv, dt, ro.bias != nil, ro.mask != nil, ro.causal, ro.qLen != nil)
		checkClose(t, name, nn.DotProductAttention(q, k, v, opts), dt, want, tol)
		// Blocked, with the largest block size below S that divides it.
		for bs := S - 1; bs >= 1; bs-- {
			if S%bs == 0 {
				bo := opts
				bo.BlockSize = bs
				checkClose(t, name+fmt.Sprintf(" BlockSize=%d", bs), nn.DotProductAttention(q, k, v, bo), dt, want, tol)
				break
			}
		}
		// Without the batch axis.
		if B == 1 && opts.QuerySeqLengths == nil && opts.KeyValueSeqLengths == nil && (opts.Bias == nil || opts.Bias.Rank() < 4) && (opts.Mask == nil || opts.Mask.Rank() < 4) {
			got := nn.DotProductAttention(trace.Squeeze(q, 0), trace.Squeeze(k, 0), trace.Squeeze(v, 0), opts)
			want3 := tensor{shape: want.shape[1:], data: want.data}
			checkClose(t, name+" unbatched", got, dt, want3, tol)
		}
	}
}

// repeatHeads is jnp.repeat(x, g, axis=2) of x [B, S, K, H].
func repeatHeads(x *trace.Array, g int) *trace.Array {
	s := x.Shape()
	y := trace.BroadcastInDim(x, ir.Shape{s[0], s[1], s[2], g, s[3]}, []int{0, 1, 2, 4})
	return trace.Reshape(y, s[0], s[1], s[2]*g, s[3])
}

// Grouped-query attention equals multi-head attention with each key/value
// head repeated for its group, in the plain and blocked forms.
func TestDotProductAttentionGQA(t *testing.T) {
	r := testseed.Rand(t, 2)
	B, T, K, G, H := 2, 3+r.IntN(4), 2, 2+r.IntN(2), 4
	q, _ := randT(r, ir.Float32, 1, B, T, K*G, H)
	k, _ := randT(r, ir.Float32, 1, B, T, K, H)
	v, _ := randT(r, ir.Float32, 1, B, T, K, H)
	opts := nn.AttentionOptions{IsCausal: true}
	got := nn.DotProductAttention(q, k, v, opts)
	want := nn.DotProductAttention(q, repeatHeads(k, G), repeatHeads(v, G), opts)
	close(t, "GQA", got.Float64s(), want.Float64s(), 1e-6)
	opts.BlockSize = 1
	close(t, "GQA blocked", nn.DotProductAttention(q, k, v, opts).Float64s(), want.Float64s(), 1e-5)
}

// A padding mask over keys: the outputs of the real queries of a padded
// batch equal those of the unpadded sequence, whatever the padding holds.
func TestDotProductAttentionPadding(t *testing.T) {
	r := testseed.Rand(t, 3)
	const N, H = 2, 4
	T := 2 + r.IntN(4)
	pad := 1 + r.IntN(3)
	q, _ := randT(r, ir.Float32, 1, 1, T, N, H)
	k, _ := randT(r, ir.Float32, 1, 1, T, N, H)
	v, _ := randT(r, ir.Float32, 1, 1, T, N, H)
	padded := func(x *trace.Array) *trace.Array {
		junk, _ := randT(r, ir.Float32, 5, 1, pad, N, H)
		return trace.Concatenate(1, x, junk)
	}
	want := nn.DotProductAttention(q, k, v, nn.AttentionOptions{IsCausal: true})
	keep := make([]bool, T+pad)
	for i := range T {
		keep[i] = true
	}
	mask := trace.Reshape(rt.FromSlice(keep, 1, T+pad), 1, 1, 1, T+pad)
	for _, opts := range []nn.AttentionOptions{
		{Mask: mask, IsCausal: true},
		{KeyValueSeqLengths: rt.FromSlice([]int32{int32(T)}, 1), IsCausal: true},
		{Mask: mask, IsCausal: true, BlockSize: 1},
	} {
		got := nn.DotProductAttention(padded(q), padded(k), padded(v), opts)
		close(t, "padded", trace.SliceAxis(got, 1, 0, T).Float64s(), want.Float64s(), 1e-6)
	}
}

// fdCheck compares the gradient g of f at x with central finite differences
// of f (both float64) at n random coordinates.
func fdCheck(t *testing.T, r *rand.Rand, name string, f func(*trace.Array) float64, x, g *trace.Array, n int) {
	t.Helper()
	xs := x.Float64s()
	gs := g.Float64s()
	if len(gs) != len(xs) {
		t.Fatalf("%s: gradient has %d values, want %d", name, len(gs), len(xs))
	}
	const eps = 1e-6
	for range n {
		i := r.IntN(len(xs))
		p := append([]float64(nil), xs...)
		m := append([]float64(nil), xs...)
		p[i] += eps
		m[i] -= eps
		fd := (f(rt.FromSlice(p, x.Shape()...)) - f(rt.FromSlice(m, x.Shape()...))) / (2 * eps)
		if math.Abs(fd-gs[i]) > 1e-6*math.Max(1, math.Abs(fd)) {
			t.Fatalf("%s: d/dx[%d] = %v, finite difference %v", name, i, gs[i], fd)
		}
	}
}

// The gradients of DotProductAttention with respect to q, k, v and the bias
// equal central finite differences (float64, with GQA, a mask and a causal
// mask), plain and blocked.
func TestDotProductAttentionGrad(t *testing.T) {
	r := testseed.Rand(t, 4)
	const B, T, K, G, H = 2, 4, 2, 2, 3
	q, _ := randT(r, ir.Float64, 1, B, T, K*G, H)
	k, _ := randT(r, ir.Float64, 1, B, T, K, H)
	v, _ := randT(r, ir.Float64, 1, B, T, K, H)
	bias, _ := randT(r, ir.Float64, 1, 1, K*G, T, T)
	mask, _ := boolT(r, 0.8, B, 1, 1, T)
	w, _ := randT(r, ir.Float64, 1, B, T, K*G, H)
	for _, bs := range []int{0, 2} {
		loss := func(q, k, v, bias *trace.Array) *trace.Array {
			o := nn.DotProductAttention(q, k, v, nn.AttentionOptions{Bias: bias, Mask: mask, IsCausal: true, BlockSize: bs})
			return trace.Sum(trace.Mul(o, w))
		}
		grads := rt.Jit(func(q, k, v, bias *trace.Array) (*trace.Array, *trace.Array, *trace.Array, *trace.Array) {
			g := trace.Grad(func(a [4]*trace.Array) *trace.Array { return loss(a[0], a[1], a[2], a[3]) })([4]*trace.Array{q, k, v, bias})
			return g[0], g[1], g[2], g[3]
		})
		gq, gk, gv, gb := grads(q, k, v, bias)
		name := fmt.Sprintf("BlockSize=%d", bs)
		fdCheck(t, r, name+" dq", func(x *trace.Array) float64 { return loss(x, k, v, bias).Item() }, q, gq, 6)
		fdCheck(t, r, name+" dk", func(x *trace.Array) float64 { return loss(q, x, v, bias).Item() }, k, gk, 6)
		fdCheck(t, r, name+" dv", func(x *trace.Array) float64 { return loss(q, k, x, bias).Item() }, v, gv, 6)
		fdCheck(t, r, name+" dbias", func(x *trace.Array) float64 { return loss(q, k, v, x).Item() }, bias, gb, 6)
	}
}

// Misuse is an error naming the problem, never a crash.
func TestDotProductAttentionErrors(t *testing.T) {
	q := trace.Zeros(ir.Shape{1, 2, 3, 4}, ir.Float32)
	k := trace.Zeros(ir.Shape{1, 2, 2, 4}, ir.Float32)
	for _, c := range []struct {
		f    func()
		want string
	}{
		{func() { nn.DotProductAttention(q, k, k, nn.AttentionOptions{}) }, "not a multiple"},
		{func() {
			nn.DotProductAttention(q, q, trace.Zeros(ir.Shape{1, 2, 3, 4}, ir.BFloat16), nn.AttentionOptions{})
		}, "share a float dtype"},
		{func() {
			nn.DotProductAttention(q, q, q, nn.AttentionOptions{Mask: trace.Zeros(ir.Shape{2, 2}, ir.Float32)})
		}, "must be bool"},
		{func() {
			nn.DotProductAttention(q, q, q, nn.AttentionOptions{Bias: trace.Zeros(ir.Shape{3, 3}, ir.Float32)})
		}, "not broadcastable"},
		{func() { nn.DotProductAttention(q, q, q, nn.AttentionOptions{BlockSize: 3}) }, "does not divide"},
		{func() {
			nn.DotProductAttention(q, q, trace.Zeros(ir.Shape{1, 2, 4}, ir.Float32), nn.AttentionOptions{})
		}, "[B, T, N, H]"},
	} {
		var err error
		func() {
			defer trace.Recover(&err)
			c.f()
		}()
		if err == nil || !containsStr(err.Error(), c.want) || !containsStr(err.Error(), "attention_test.go") {
			t.Errorf("got %v, want an error at attention_test.go containing %q", err, c.want)
		}
	}
}

func containsStr(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// The blocked form never holds the logits of all keys: its compiled
// program's temporaries are under half the size of the [B, N, T, S] f32
// logits forward, and under that size backward (where the running output of
// every block is kept), while the plain form's are at least that size.
func TestDotProductAttentionBlockedMemory(t *testing.T) {
	const B, T, N, H, bs = 1, 512, 4, 16, 64
	logits := int64(B * N * T * T * 4)
	q := trace.Zeros(ir.Shape{B, T, N, H}, ir.Float32)
	temp := func(bs int, grad bool) int64 {
		f := func(q, k, v *trace.Array) *trace.Array {
			return nn.DotProductAttention(q, k, v, nn.AttentionOptions{IsCausal: true, BlockSize: bs})
		}
		fn := f
		if grad {
			fn = func(q, k, v *trace.Array) *trace.Array {
				return trace.Grad(func(q *trace.Array) *trace.Array { return trace.Sum(f(q, k, v)) })(q)
			}
		}
		low, err := rt.Lower(fn, q, q, q)
		if err != nil {
			t.Fatal(err)
		}
		c, err := low.Compile()
		if err != nil {
			t.Fatal(err)
		}
		return c.MemoryAnalysis().TempBytes
	}
	if p := temp(0, false); p < logits {
		t.Fatalf("the plain form's temporaries (%d bytes) are less than its logits (%d): the check below would prove nothing", p, logits)
	}
	if b := temp(bs, false); b > logits/2 {
		t.Errorf("blocked: temporaries %d bytes, more than half the logits' %d", b, logits)
	}
	if b := temp(bs, true); b > logits {
		t.Errorf("blocked gradient: temporaries %d bytes, more than the logits' %d", b, logits)
	}
}
