package nn

import (
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

// Gelu is the tanh-approximated GELU (jax.nn.gelu's default).
func Gelu(x *trace.Array) *trace.Array { return trace.Gelu(x, true) }

// Relu is max(x, 0).
func Relu(x *trace.Array) *trace.Array { return trace.Relu(x) }

// Linear is a dense layer y = x·W + B with W [in, out] and B [out] (B may be
// nil for no bias).
type Linear struct {
	W *trace.Array // [in, out]
	B *trace.Array // [out], or nil
}

// NewLinear returns a Linear of dtype dt with LecunNormal weights and zero
// bias, as flax.linen.Dense.
func NewLinear(key *trace.Array, dt ir.DType, in, out int) Linear {
	return NewLinearWith(key, dt, in, out, LecunNormal, Zeros)
}

// NewLinearWith is NewLinear with the given weight and bias initialisers; a nil
// bias initialiser gives a Linear without bias.
func NewLinearWith(key *trace.Array, dt ir.DType, in, out int, wInit, bInit Initializer) Linear {
	ks := random.Keys(key, 2)
	l := Linear{W: wInit(ks[0], dt, ir.Shape{in, out})}
	if bInit != nil {
		l.B = bInit(ks[1], dt, ir.Shape{out})
	}
	return l
}

// Apply returns x·W + B for x [..., in]: the result is [..., out].
func (l Linear) Apply(x *trace.Array) *trace.Array {
	y := dense(x, l.W)
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
	Scale *trace.Array // [d]
	Bias  *trace.Array // [d]
	Eps   float64      // static
}

// NewLayerNorm returns a LayerNorm over d features of dtype dt: Scale ones,
// Bias zeros, Eps 1e-6 (flax.linen.LayerNorm's defaults).
func NewLayerNorm(dt ir.DType, d int) LayerNorm {
	return LayerNorm{Scale: trace.Ones(ir.Shape{d}, dt), Bias: trace.Zeros(ir.Shape{d}, dt), Eps: 1e-6}
}

// Apply normalises x [..., d] over its last axis.
func (n LayerNorm) Apply(x *trace.Array) *trace.Array {
	w := workDType(x.DType())
	xf := trace.Convert(x, w)
	last := x.Rank() - 1
	mu := trace.ExpandDims(trace.Mean(xf, last), last)
	xc := trace.Sub(xf, mu)
	v := trace.ExpandDims(trace.Mean(trace.Mul(xc, xc), last), last)
	y := trace.Mul(xc, trace.Rsqrt(trace.Add(v, trace.ScalarOf(n.Eps, w))))
	y = trace.Add(trace.Mul(y, trace.Convert(n.Scale, w)), trace.Convert(n.Bias, w))
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

// Apply normalises x [..., d] over its last axis.
func (n RMSNorm) Apply(x *trace.Array) *trace.Array {
	w := workDType(x.DType())
	xf := trace.Convert(x, w)
	last := x.Rank() - 1
	ms := trace.ExpandDims(trace.Mean(trace.Mul(xf, xf), last), last)
	y := trace.Mul(xf, trace.Rsqrt(trace.Add(ms, trace.ScalarOf(n.Eps, w))))
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
	scaled := trace.Mul(x, trace.ScalarOf(1/(1-rate), x.DType()))
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
