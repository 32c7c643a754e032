package nn

import (
	"fmt"
	"math"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// RoPEStyle is how rotary position embeddings pair the features they rotate.
// The two conventions give different results for the same weights: use the
// one the checkpoint was trained with.
type RoPEStyle int

const (
	// NoRoPE applies no rotary embedding (the zero value).
	NoRoPE RoPEStyle = iota
	// RoPEHalf rotates feature i with feature i + d/2, the "rotate_half"
	// convention of GPT-NeoX, Llama, Mistral, Qwen and Hugging Face's
	// apply_rotary_pos_emb.
	RoPEHalf
	// RoPEInterleaved rotates feature 2i with feature 2i+1, the convention
	// of GPT-J ("rotate_every_two") and of the original RoFormer paper.
	RoPEInterleaved
)

// String returns the style's name.
func (s RoPEStyle) String() string {
	switch s {
	case NoRoPE:
		return "none"
	case RoPEHalf:
		return "half"
	case RoPEInterleaved:
		return "interleaved"
	}
	return fmt.Sprintf("RoPEStyle(%d)", int(s))
}

// RoPE is a rotary position embedding: feature pair i of a head at position
// p is rotated by the angle p·θ^(−2i/Dims). Its fields are static.
type RoPE struct {
	Style RoPEStyle
	// Theta is the base θ; 0 means 10000 (Llama 3 uses 500000: its
	// config's rope_theta).
	Theta float64
	// Dims is the number of leading features of each head that are rotated
	// (GPT-J's rotary_dim, GPT-NeoX's rotary_pct times the head size); the
	// rest pass through. 0 means all of them. It must be even.
	Dims int
}

// Apply rotates x [B, T, heads, H] (or [T, heads, H]) by positions, an
// integer array [T] or [B, T] (nil means 0, 1, …, T−1). The angles, their
// sines and cosines and the rotation are computed in f32 for 16-bit x (f64
// for f64 x); the result has x's dtype. A RoPE of Style NoRoPE returns x.
func (r RoPE) Apply(x, positions *trace.Array) *trace.Array {
	const op = "nn.RoPE"
	if r.Style == NoRoPE {
		return x
	}
	if r.Style != RoPEHalf && r.Style != RoPEInterleaved {
		panic(trace.Errorf(op, "unknown style %v", r.Style))
	}
	if x == nil || (x.Rank() != 4 && x.Rank() != 3) || !x.DType().IsFloat() {
		panic(trace.Errorf(op, "x must be a float array [B, T, heads, H] or [T, heads, H], got %v", x))
	}
	if x.Rank() == 3 {
		if positions != nil && positions.Rank() != 1 {
			panic(trace.Errorf(op, "positions of an unbatched x must be [T], got %v", positions.Type()))
		}
		return trace.Squeeze(r.Apply(trace.ExpandDims(x, 0), positions), 0)
	}
	s := x.Shape()
	T, H := s[1], s[3]
	d := r.Dims
	if d == 0 {
		d = H
	}
	if d <= 0 || d%2 != 0 || d > H {
		panic(trace.Errorf(op, "Dims %d must be even and at most the head size %d", d, H))
	}
	theta := r.Theta
	if theta == 0 {
		theta = 10000
	}
	if !(theta > 0) || math.IsInf(theta, 0) {
		panic(trace.Errorf(op, "Theta %v must be positive and finite", theta))
	}
	w := workDType(x.DType())
	if positions == nil {
		positions = trace.Iota(ir.Int32, ir.Shape{T}, 0)
	}
	ps := positions.Shape()
	if !positions.DType().IsInteger() || !(positions.Rank() == 1 && ps[0] == T || positions.Rank() == 2 && ps[0] == s[0] && ps[1] == T) {
		panic(trace.Errorf(op, "positions must be integers [%d] or [%d, %d], got %v", T, s[0], T, positions.Type()))
	}
	half := d / 2
	inv := make([]float64, half)
	for i := range inv {
		inv[i] = math.Pow(theta, -float64(2*i)/float64(d))
	}
	invFreq := trace.Convert(trace.Const(inv, half), w)
	pos := trace.Convert(positions, w)
	if pos.Rank() == 1 {
		pos = trace.ExpandDims(pos, 0)
	}
	ang := trace.Mul(trace.ExpandDims(pos, 2), invFreq) // [B|1, T, half]
	ang = trace.ExpandDims(ang, 2)                      // [B|1, T, 1, half]
	cos, sin := trace.Cos(ang), trace.Sin(ang)
	xf := trace.Convert(x, w)
	rot := xf
	var rest *trace.Array
	if d < H {
		rot = trace.SliceAxis(xf, 3, 0, d)
		rest = trace.SliceAxis(xf, 3, d, H)
	}
	var out *trace.Array
	switch r.Style {
	case RoPEHalf:
		a, b := trace.SliceAxis(rot, 3, 0, half), trace.SliceAxis(rot, 3, half, d)
		out = trace.Concatenate(3,
			trace.Sub(trace.Mul(a, cos), trace.Mul(b, sin)),
			trace.Add(trace.Mul(b, cos), trace.Mul(a, sin)))
	case RoPEInterleaved:
		pr := trace.Reshape(rot, s[0], T, s[2], half, 2)
		a, b := trace.Squeeze(trace.SliceAxis(pr, 4, 0, 1), 4), trace.Squeeze(trace.SliceAxis(pr, 4, 1, 2), 4)
		out = trace.Stack(4,
			trace.Sub(trace.Mul(a, cos), trace.Mul(b, sin)),
			trace.Add(trace.Mul(b, cos), trace.Mul(a, sin)))
		out = trace.Reshape(out, s[0], T, s[2], d)
	}
	if rest != nil {
		out = trace.Concatenate(3, out, rest)
	}
	return trace.Convert(out, x.DType())
}
