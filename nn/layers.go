package nn

import (
	"fmt"
	"math"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// workDType is the dtype normalisations, softmaxes and losses compute in: f32
// for the 16-bit floats, the dtype itself otherwise.
func workDType(dt ir.DType) ir.DType {
	if dt == ir.Float16 || dt == ir.BFloat16 {
		return ir.Float32
	}
	return dt
}

// dense contracts the last axis of x with the first axis of w (x [..., in],
// w [in, ...]), without broadcasting w over x's batch axes.
func dense(x, w *trace.Array) *trace.Array {
	return trace.DotGeneral(x, w, nil, nil, []int{x.Rank() - 1}, []int{0})
}

// Activation is an elementwise nonlinearity, such as Gelu or Relu.
type Activation func(x *trace.Array) *trace.Array

// Gelu is the tanh-approximated GELU (jax.nn.gelu's default); it is GeluTanh.
func Gelu(x *trace.Array) *trace.Array { return trace.Gelu(x, true) }

// GeluTanh is the tanh-approximated GELU,
// 0.5x(1+tanh(√(2/π)(x+0.044715x³))): jax.nn.gelu(approximate=True),
// PyTorch's gelu(approximate="tanh"), Hugging Face's "gelu_new" and
// "gelu_pytorch_tanh" (GPT-2).
func GeluTanh(x *trace.Array) *trace.Array { return trace.Gelu(x, true) }

// GeluErf is the exact GELU, 0.5x(1+erf(x/√2)): PyTorch's default gelu,
// jax.nn.gelu(approximate=False), Hugging Face's "gelu" (BERT).
func GeluErf(x *trace.Array) *trace.Array { return trace.Gelu(x, false) }

// Silu is x·sigmoid(x) (also called swish): the gate of Llama's SwiGLU MLP.
func Silu(x *trace.Array) *trace.Array { return trace.Mul(x, trace.Sigmoid(x)) }

// Relu is max(x, 0).
func Relu(x *trace.Array) *trace.Array { return trace.Relu(x) }

// LinearLayout is the layout a Linear keeps its weight in. Both compute the
// same y = x·W + B; the layout only says which axis of W is contracted, so a
// checkpoint's weight is used as it is stored, without a transposed copy.
type LinearLayout int

const (
	// LayoutInOut keeps W as [in, out] (flax, JAX, Hugging Face GPT-2's
	// Conv1D). It is the zero value.
	LayoutInOut LinearLayout = iota
	// LayoutOutIn keeps W as [out, in], as PyTorch's nn.Linear and the
	// Hugging Face checkpoints of BERT and Llama store it: y = x·Wᵀ + B.
	LayoutOutIn
)

// String returns "in,out" or "out,in".
func (l LinearLayout) String() string {
	switch l {
	case LayoutInOut:
		return "in,out"
	case LayoutOutIn:
		return "out,in"
	}
	return fmt.Sprintf("LinearLayout(%d)", int(l))
}

// Linear is a dense layer y = x·W + B with W [in, out] (Layout LayoutInOut,
// the zero value) or [out, in] (LayoutOutIn, PyTorch's layout) and B [out]
// (B may be nil for no bias).
type Linear struct {
	W      *trace.Array // [in, out], or [out, in] with LayoutOutIn
	B      *trace.Array // [out], or nil
	Layout LinearLayout // static
}

// NewLinear returns a Linear of dtype dt with LecunNormal weights and zero
// bias, as flax.linen.Dense.
func NewLinear(key *trace.Array, dt ir.DType, in, out int) Linear {
	return NewLinearWith(key, dt, in, out, LecunNormal, Zeros)
}

// NewLinearWith is NewLinear with the given weight and bias initialisers; a nil
// bias initialiser gives a Linear without bias.
func NewLinearWith(key *trace.Array, dt ir.DType, in, out int, wInit, bInit Initializer) Linear {
	return NewLinearLayout(key, dt, in, out, LayoutInOut, wInit, bInit)
}

// NewLinearLayout is NewLinearWith with the weight kept in the given layout.
// The initialiser draws an [in, out] weight (so that its fans are the layer's)
// and LayoutOutIn keeps its transpose: the same key gives the same layer in
// both layouts.
func NewLinearLayout(key *trace.Array, dt ir.DType, in, out int, layout LinearLayout, wInit, bInit Initializer) Linear {
	if layout != LayoutInOut && layout != LayoutOutIn {
		panic(trace.Errorf("nn.NewLinearLayout", "unknown layout %v", layout))
	}
	ks := random.Keys(key, 2)
	l := Linear{W: wInit(ks[0], dt, ir.Shape{in, out}), Layout: layout}
	if layout == LayoutOutIn {
		l.W = trace.Transpose(l.W, 1, 0)
	}
	if bInit != nil {
		l.B = bInit(ks[1], dt, ir.Shape{out})
	}
	return l
}

// In returns the number of input features.
func (l Linear) In() int {
	if l.Layout == LayoutOutIn {
		return l.W.Shape()[1]
	}
	return l.W.Shape()[0]
}

// Out returns the number of output features.
func (l Linear) Out() int {
	if l.Layout == LayoutOutIn {
		return l.W.Shape()[0]
	}
	return l.W.Shape()[1]
}

// Apply returns x·W + B for x [..., in]: the result is [..., out]. With
// LayoutOutIn the product contracts W's second axis (one dot_general, no
// transpose).
func (l Linear) Apply(x *trace.Array) *trace.Array {
	var y *trace.Array
	switch l.Layout {
	case LayoutInOut:
		y = dense(x, l.W)
	case LayoutOutIn:
		if l.W == nil || l.W.Rank() != 2 {
			panic(trace.Errorf("nn.Linear", "W must be [out, in], got %v", l.W))
		}
		y = trace.DotGeneral(x, l.W, nil, nil, []int{x.Rank() - 1}, []int{1})
	default:
		panic(trace.Errorf("nn.Linear", "unknown layout %v", l.Layout))
	}
	if l.B != nil {
		y = trace.Add(y, l.B)
	}
	return y
}

// MLP is a sequence of Linear layers with Activation between them (not after
// the last).
type MLP struct {
	Layers     []Linear
	Activation Activation // static; nil means Gelu
}

// NewMLP returns an MLP of dtype dt with layer sizes sizes[0] → sizes[1] → … →
// sizes[len-1] (at least two sizes) and activation act (nil means Gelu).
func NewMLP(key *trace.Array, dt ir.DType, sizes []int, act Activation) MLP {
	if len(sizes) < 2 {
		panic(trace.Errorf("nn.NewMLP", "need at least 2 sizes, got %v", sizes))
	}
	ks := random.Keys(key, len(sizes)-1)
	m := MLP{Activation: act}
	for i := range ks {
		m.Layers = append(m.Layers, NewLinear(ks[i], dt, sizes[i], sizes[i+1]))
	}
	return m
}

// Apply runs the layers in order with the activation between them.
func (m MLP) Apply(x *trace.Array) *trace.Array {
	act := m.Activation
	if act == nil {
		act = Gelu
	}
	for i, l := range m.Layers {
		x = l.Apply(x)
		if i < len(m.Layers)-1 {
			x = act(x)
		}
	}
	return x
}

// LayerNorm normalises the last axis to zero mean and unit variance, then
// scales and shifts it: (x − mean)/√(var + Eps)·Scale + Bias. 16-bit inputs
// are normalised in f32 and the result has x's dtype.
type LayerNorm struct {
	Scale *trace.Array // [d], or nil for no scale
	Bias  *trace.Array // [d], or nil for no bias
	Eps   float64      // static
}

// NewLayerNorm returns a LayerNorm over d features of dtype dt: Scale ones,
// Bias zeros, Eps 1e-6 (flax.linen.LayerNorm's defaults; PyTorch's is 1e-5,
// BERT's 1e-12: set Eps, or use NewLayerNormEps).
func NewLayerNorm(dt ir.DType, d int) LayerNorm {
	return LayerNorm{Scale: trace.Ones(ir.Shape{d}, dt), Bias: trace.Zeros(ir.Shape{d}, dt), Eps: 1e-6}
}

// NewLayerNormEps is NewLayerNorm with the given epsilon.
func NewLayerNormEps(dt ir.DType, d int, eps float64) LayerNorm {
	n := NewLayerNorm(dt, d)
	n.Eps = eps
	return n
}

// Apply normalises x [..., d] over its last axis.
func (n LayerNorm) Apply(x *trace.Array) *trace.Array {
	w := workDType(x.DType())
	xf := trace.Convert(x, w)
	last := x.Rank() - 1
	mu := trace.ExpandDims(trace.Mean(xf, last), last)
	xc := trace.Sub(xf, mu)
	v := trace.ExpandDims(trace.Mean(trace.Mul(xc, xc), last), last)
	y := trace.Mul(xc, trace.Rsqrt(trace.Add(v, trace.ScalarAs(n.Eps, w))))
	if n.Scale != nil {
		y = trace.Mul(y, trace.Convert(n.Scale, w))
	}
	if n.Bias != nil {
		y = trace.Add(y, trace.Convert(n.Bias, w))
	}
	return trace.Convert(y, x.DType())
}

// RMSNorm scales the last axis by its reciprocal root mean square:
// x/√(mean(x²) + Eps)·Scale. 16-bit inputs are normalised in f32.
type RMSNorm struct {
	Scale *trace.Array // [d]
	Eps   float64      // static
}

// NewRMSNorm returns an RMSNorm over d features of dtype dt: Scale ones, Eps 1e-6.
func NewRMSNorm(dt ir.DType, d int) RMSNorm {
	return RMSNorm{Scale: trace.Ones(ir.Shape{d}, dt), Eps: 1e-6}
}

// NewRMSNormEps is NewRMSNorm with the given epsilon (Llama's is 1e-5 or
// 1e-6, as its config's rms_norm_eps says).
func NewRMSNormEps(dt ir.DType, d int, eps float64) RMSNorm {
	return RMSNorm{Scale: trace.Ones(ir.Shape{d}, dt), Eps: eps}
}

// Apply normalises x [..., d] over its last axis.
func (n RMSNorm) Apply(x *trace.Array) *trace.Array {
	w := workDType(x.DType())
	xf := trace.Convert(x, w)
	last := x.Rank() - 1
	ms := trace.ExpandDims(trace.Mean(trace.Mul(xf, xf), last), last)
	y := trace.Mul(xf, trace.Rsqrt(trace.Add(ms, trace.ScalarAs(n.Eps, w))))
	y = trace.Mul(y, trace.Convert(n.Scale, w))
	return trace.Convert(y, x.DType())
}

// Embedding maps integer ids to rows of Table.
type Embedding struct {
	Table *trace.Array // [vocab, d]
}

// NewEmbedding returns an Embedding of vocab rows of d features of dtype dt,
// normal with standard deviation 1/√d (flax.linen.Embed's default).
func NewEmbedding(key *trace.Array, dt ir.DType, vocab, d int) Embedding {
	return Embedding{Table: NormalInit(1/math.Sqrt(float64(d)))(key, dt, ir.Shape{vocab, d})}
}

// Apply gathers the rows of ids (an integer array of any shape): the result is
// ids.shape + [d]. Out-of-range ids are clamped (trace.Take).
func (e Embedding) Apply(ids *trace.Array) *trace.Array { return trace.Take(e.Table, ids, 0) }

// Attend returns x·Tableᵀ for x [..., d]: logits [..., vocab] for tied
// input/output embeddings.
func (e Embedding) Attend(x *trace.Array) *trace.Array {
	return trace.DotGeneral(x, e.Table, nil, nil, []int{x.Rank() - 1}, []int{1})
}

// Dropout zeroes each element of x with probability rate and scales the rest
// by 1/(1−rate) when train is true; otherwise (or with rate 0) it returns x.
// rate must be in [0, 1); key is a PRNG key used only when training.
func Dropout(key, x *trace.Array, rate float64, train bool) *trace.Array {
	if !(rate >= 0 && rate < 1) {
		panic(trace.Errorf("nn.Dropout", "rate %v is not in [0, 1)", rate))
	}
	if !train || rate == 0 {
		return x
	}
	keep := random.Bernoulli(key, 1-rate, x.Shape())
	scaled := trace.Mul(x, trace.ScalarAs(1/(1-rate), x.DType()))
	return trace.Where(keep, scaled, trace.ZerosLike(x))
}

// SoftmaxCrossEntropy returns the mean over all positions of
// −log softmax(logits)[label]: logits [..., V] (float), labels [...] (int32).
// 16-bit logits are computed in f32; the result is a scalar of that dtype.
func SoftmaxCrossEntropy(logits, labels *trace.Array) *trace.Array {
	w := workDType(logits.DType())
	last := logits.Rank() - 1
	lp := trace.LogSoftmax(trace.Convert(logits, w), last)
	oh := trace.OneHot(labels, logits.Shape()[last], w)
	return trace.Neg(trace.Mean(trace.Sum(trace.Mul(lp, oh), last)))
}
