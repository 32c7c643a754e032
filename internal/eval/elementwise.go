package eval

import (
	"fmt"
	"math"
	"math/bits"
	"unsafe"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/ir"
)

// floatT is the set of float types computed natively.
type floatT interface{ ~float32 | ~float64 }

// intT is the set of integer element types.
type intT interface {
	~uint8 | ~int32 | ~int64 | ~uint32
}

// numT is every type with native arithmetic.
type numT interface{ intT | floatT }

// ---- unary ----

func unaryOp(code ir.Code, x, out *ir.Literal) error {
	switch dt := x.Type.DType; dt {
	case ir.Float32:
		return unaryF32(code, viewAs[float32](out.Data), viewAs[float32](x.Data))
	case ir.Float64:
		return unaryFloat(code, viewAs[float64](out.Data), viewAs[float64](x.Data))
	case ir.Float16, ir.BFloat16:
		sa, a := toF32Scratch(x)
		defer putScratch(&f32Scratch, sa)
		sb, buf := getScratch[float32](&f32Scratch, len(a))
		defer putScratch(&f32Scratch, sb)
		if err := unaryF32(code, buf, a); err != nil {
			return err
		}
		fromF32(out, buf)
		return nil
	case ir.Uint8:
		return unaryInt(code, viewAs[uint8](out.Data), viewAs[uint8](x.Data))
	case ir.Int32:
		return unaryInt(code, viewAs[int32](out.Data), viewAs[int32](x.Data))
	case ir.Int64:
		return unaryInt(code, viewAs[int64](out.Data), viewAs[int64](x.Data))
	case ir.Uint32:
		return unaryInt(code, viewAs[uint32](out.Data), viewAs[uint32](x.Data))
	case ir.Bool:
		if code != ir.Not {
			break
		}
		for i, b := range x.Data {
			out.Data[i] = b2u(b == 0)
		}
		return nil
	}
	return fmt.Errorf("no kernel for %v on %v", code, x.Type.DType)
}

// mapF applies f (computed in float64) to every element, rounding once to T.
func mapF[T floatT](dst, src []T, f func(float64) float64) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = T(f(float64(x)))
	}
}

// unaryF32 runs the float32 kernels: vmath's vector kernels where there is
// one (exact for neg, abs and sqrt; exp, log, tanh, logistic and erf within 2
// ulp of the correctly rounded value), unaryFloat otherwise.
func unaryF32(code ir.Code, dst, src []float32) error {
	if f := f32Unary(code); f != nil {
		f(dst[:len(src)], src)
		return nil
	}
	return unaryFloat(code, dst, src)
}

func f32Unary(code ir.Code) func(dst, x []float32) {
	if int(code) < len(f32Kernels) {
		return f32Kernels[code].unary
	}
	return nil
}

func f32Binary(code ir.Code) func(dst, a, b []float32) {
	if int(code) < len(f32Kernels) {
		return f32Kernels[code].binary
	}
	return nil
}

// f32Kernel is the vmath opcode and kernel of one op.
type f32Kernel struct {
	op     int32
	unary  func(dst, x []float32)
	binary func(dst, a, b []float32)
}

// f32Kernels holds, by op code, the vmath opcode and kernel that the op
// table names (ir.Lowering.VMath).
var f32Kernels = func() []f32Kernel {
	codes := ir.AllCodes()
	k := make([]f32Kernel, int(codes[len(codes)-1])+1)
	for _, c := range codes {
		if name := c.Info().Lower.VMath; name != "" {
			op := vmath.OpByName(name)
			k[c].op = op
			k[c].unary, k[c].binary = vmath.Kernels(op)
		}
	}
	return k
}()

// VMathOp returns the vmath opcode whose kernel F32Kernels returns for
// code, or 0 when it returns none (the op table names no vmath op, or a
// name vmath does not know: TestOpTableLowerings fails then).
func VMathOp(code ir.Code) int32 {
	if int(code) < len(f32Kernels) {
		return f32Kernels[code].op
	}
	return 0
}

// F32Kernels returns the vector kernel Elementwise runs for code over
// float32 operands (f16 and bf16 as well, over their float32 widening), or
// nils where it runs a kernel of its own: a fused-loop executor may call it
// directly, with the same results. unary is set for unary ops, binary for
// binary ops.
func F32Kernels(code ir.Code) (unary func(dst, x []float32), binary func(dst, a, b []float32)) {
	return f32Unary(code), f32Binary(code)
}

func unaryFloat[T floatT](code ir.Code, dst, src []T) error {
	dst = dst[:len(src)]
	switch code {
	case ir.Neg:
		for i, x := range src {
			dst[i] = -x
		}
	case ir.Sign:
		for i, x := range src {
			switch {
			case x > 0:
				dst[i] = 1
			case x < 0:
				dst[i] = -1
			default:
				dst[i] = x // ±0 and NaN
			}
		}
	default:
		f := code.Info().Ref1
		if f == nil {
			return fmt.Errorf("no float kernel for %v", code)
		}
		mapF(dst, src, f) // the op table's reference function
	}
	return nil
}

func unaryInt[T intT](code ir.Code, dst, src []T) error {
	dst = dst[:len(src)]
	var one T = 1
	switch code {
	case ir.Neg:
		for i, x := range src {
			dst[i] = -x
		}
	case ir.Abs:
		for i, x := range src {
			if x < 0 {
				x = -x
			}
			dst[i] = x
		}
	case ir.Sign:
		for i, x := range src {
			switch {
			case x > 0:
				dst[i] = one
			case x < 0:
				dst[i] = -one
			default:
				dst[i] = 0
			}
		}
	case ir.Not:
		for i, x := range src {
			dst[i] = ^x
		}
	default:
		return fmt.Errorf("no integer kernel for %v", code)
	}
	return nil
}

// ---- binary ----

func binaryOp(code ir.Code, x, y, out *ir.Literal) error {
	switch dt := x.Type.DType; dt {
	case ir.Float32:
		return binaryF32(code, viewAs[float32](out.Data), viewAs[float32](x.Data), viewAs[float32](y.Data))
	case ir.Float64:
		return binaryFloat(code, viewAs[float64](out.Data), viewAs[float64](x.Data), viewAs[float64](y.Data))
	case ir.Float16, ir.BFloat16:
		sa, a := toF32Scratch(x)
		defer putScratch(&f32Scratch, sa)
		sb, b := toF32Scratch(y)
		defer putScratch(&f32Scratch, sb)
		sc, buf := getScratch[float32](&f32Scratch, len(a))
		defer putScratch(&f32Scratch, sc)
		if err := binaryF32(code, buf, a, b); err != nil {
			return err
		}
		fromF32(out, buf)
		return nil
	case ir.Uint8:
		return binaryInt(code, viewAs[uint8](out.Data), viewAs[uint8](x.Data), viewAs[uint8](y.Data))
	case ir.Int32:
		return binaryInt(code, viewAs[int32](out.Data), viewAs[int32](x.Data), viewAs[int32](y.Data))
	case ir.Int64:
		return binaryInt(code, viewAs[int64](out.Data), viewAs[int64](x.Data), viewAs[int64](y.Data))
	case ir.Uint32:
		return binaryInt(code, viewAs[uint32](out.Data), viewAs[uint32](x.Data), viewAs[uint32](y.Data))
	case ir.Bool:
		sa, a := boolScratchOf(x)
		defer putScratch(&boolScratch, sa)
		sb, b := boolScratchOf(y)
		defer putScratch(&boolScratch, sb)
		o := out.Data[:len(a)]
		b = b[:len(a)]
		switch code {
		case ir.And:
			for i := range o {
				o[i] = a[i] & b[i]
			}
		case ir.Or:
			for i := range o {
				o[i] = a[i] | b[i]
			}
		case ir.Xor:
			for i := range o {
				o[i] = a[i] ^ b[i]
			}
		default:
			return fmt.Errorf("no bool kernel for %v", code)
		}
		return nil
	}
	return fmt.Errorf("no kernel for %v on %v", code, x.Type.DType)
}

func map2F[T floatT](dst, a, b []T, f func(float64, float64) float64) {
	dst = dst[:len(a)]
	b = b[:len(a)]
	for i, x := range a {
		dst[i] = T(f(float64(x), float64(b[i])))
	}
}

// binaryF32 runs the float32 kernels: vmath's (exact, the same results as
// binaryFloat) for add, sub, mul, div, max and min.
func binaryF32(code ir.Code, dst, a, b []float32) error {
	if f := f32Binary(code); f != nil {
		f(dst[:len(a)], a, b[:len(a)])
		return nil
	}
	return binaryFloat(code, dst, a, b)
}

func binaryFloat[T floatT](code ir.Code, dst, a, b []T) error {
	dst = dst[:len(a)]
	b = b[:len(a)]
	switch code {
	case ir.Add:
		for i, x := range a {
			dst[i] = x + b[i]
		}
	case ir.Sub:
		for i, x := range a {
			dst[i] = x - b[i]
		}
	case ir.Mul:
		for i, x := range a {
			dst[i] = x * b[i]
		}
	case ir.Div:
		for i, x := range a {
			dst[i] = x / b[i]
		}
	case ir.Max:
		for i, x := range a {
			y := b[i]
			if x != x || x > y {
				dst[i] = x
			} else {
				dst[i] = y // y > x, equal, or y is NaN
			}
		}
	case ir.Min:
		for i, x := range a {
			y := b[i]
			if x != x || x < y {
				dst[i] = x
			} else {
				dst[i] = y
			}
		}
	default:
		f := code.Info().Ref2
		if f == nil {
			return fmt.Errorf("no float kernel for %v", code)
		}
		map2F(dst, a, b, f) // the op table's reference function (rem, pow)
	}
	return nil
}

// bitWidth returns the number of bits of T.
func bitWidth[T intT]() uint64 {
	var z T
	return uint64(unsafe.Sizeof(z)) * 8
}

func binaryInt[T intT](code ir.Code, dst, a, b []T) error {
	dst = dst[:len(a)]
	b = b[:len(a)]
	w := bitWidth[T]()
	mask := ^uint64(0) >> (64 - w)
	switch code {
	case ir.Add:
		for i, x := range a {
			dst[i] = x + b[i]
		}
	case ir.Sub:
		for i, x := range a {
			dst[i] = x - b[i]
		}
	case ir.Mul:
		for i, x := range a {
			dst[i] = x * b[i]
		}
	case ir.Div:
		for i, x := range a {
			if y := b[i]; y == 0 {
				dst[i] = ^T(0) // -1 for signed, the maximum for unsigned
			} else {
				dst[i] = x / y // MinInt / -1 == MinInt in Go
			}
		}
	case ir.Rem:
		for i, x := range a {
			if y := b[i]; y == 0 {
				dst[i] = x
			} else {
				dst[i] = x % y
			}
		}
	case ir.Max:
		for i, x := range a {
			dst[i] = max(x, b[i])
		}
	case ir.Min:
		for i, x := range a {
			dst[i] = min(x, b[i])
		}
	case ir.And:
		for i, x := range a {
			dst[i] = x & b[i]
		}
	case ir.Or:
		for i, x := range a {
			dst[i] = x | b[i]
		}
	case ir.Xor:
		for i, x := range a {
			dst[i] = x ^ b[i]
		}
	case ir.ShiftLeft:
		for i, x := range a {
			s := uint64(b[i]) & mask
			if s >= w {
				dst[i] = 0
			} else {
				dst[i] = x << s
			}
		}
	case ir.ShiftRightLogical:
		for i, x := range a {
			s := uint64(b[i]) & mask
			if s >= w {
				dst[i] = 0
			} else {
				dst[i] = T((uint64(x) & mask) >> s)
			}
		}
	case ir.ShiftRightArithmetic:
		for i, x := range a {
			s := uint64(b[i]) & mask
			if s >= w {
				s = w - 1
			}
			sx := int64(uint64(x)<<(64-w)) >> (64 - w) // the bits of x as a signed w-bit value
			dst[i] = T(sx >> s)
		}
	default:
		return fmt.Errorf("no integer kernel for %v", code)
	}
	return nil
}

// ---- comparisons ----

type orderedT interface{ intT | floatT }

func compare(code ir.Code, x, y, out *ir.Literal) error {
	o := out.Data
	switch x.Type.DType {
	case ir.Bool:
		sa, a := boolScratchOf(x)
		defer putScratch(&boolScratch, sa)
		sb, b := boolScratchOf(y)
		defer putScratch(&boolScratch, sb)
		return compareT(code, o, a, b)
	case ir.Uint8:
		return compareT(code, o, viewAs[uint8](x.Data), viewAs[uint8](y.Data))
	case ir.Int32:
		return compareT(code, o, viewAs[int32](x.Data), viewAs[int32](y.Data))
	case ir.Int64:
		return compareT(code, o, viewAs[int64](x.Data), viewAs[int64](y.Data))
	case ir.Uint32:
		return compareT(code, o, viewAs[uint32](x.Data), viewAs[uint32](y.Data))
	case ir.Float16, ir.BFloat16, ir.Float32:
		sa, a := toF32Scratch(x)
		defer putScratch(&f32Scratch, sa)
		sb, b := toF32Scratch(y)
		defer putScratch(&f32Scratch, sb)
		return compareT(code, o, a, b)
	case ir.Float64:
		return compareT(code, o, viewAs[float64](x.Data), viewAs[float64](y.Data))
	}
	return fmt.Errorf("no kernel for %v on %v", code, x.Type.DType)
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func compareT[T orderedT](code ir.Code, dst []uint8, a, b []T) error {
	dst = dst[:len(a)]
	b = b[:len(a)]
	switch code {
	case ir.Eq:
		for i, x := range a {
			dst[i] = b2u(x == b[i])
		}
	case ir.Ne:
		for i, x := range a {
			dst[i] = b2u(x != b[i])
		}
	case ir.Lt:
		for i, x := range a {
			dst[i] = b2u(x < b[i])
		}
	case ir.Le:
		for i, x := range a {
			dst[i] = b2u(x <= b[i])
		}
	case ir.Gt:
		for i, x := range a {
			dst[i] = b2u(x > b[i])
		}
	case ir.Ge:
		for i, x := range a {
			dst[i] = b2u(x >= b[i])
		}
	default:
		return fmt.Errorf("no comparison kernel for %v", code)
	}
	return nil
}

// ---- select ----

func selectOp(p, a, b, out *ir.Literal) {
	switch a.Type.DType.Size() {
	case 1:
		selectT(p.Data, viewAs[uint8](out.Data), viewAs[uint8](a.Data), viewAs[uint8](b.Data))
	case 2:
		selectT(p.Data, viewAs[uint16](out.Data), viewAs[uint16](a.Data), viewAs[uint16](b.Data))
	case 4:
		selectT(p.Data, viewAs[uint32](out.Data), viewAs[uint32](a.Data), viewAs[uint32](b.Data))
	case 8:
		selectT(p.Data, viewAs[uint64](out.Data), viewAs[uint64](a.Data), viewAs[uint64](b.Data))
	}
	if a.Type.DType == ir.Bool {
		for i, v := range out.Data {
			out.Data[i] = b2u(v != 0)
		}
	}
}

func selectT[T word](p []uint8, dst, a, b []T) {
	dst = dst[:len(p)]
	a = a[:len(p)]
	b = b[:len(p)]
	for i, c := range p {
		if c != 0 {
			dst[i] = a[i]
		} else {
			dst[i] = b[i]
		}
	}
}

// ---- convert ----

// convert writes src converted element by element to out's dtype.
func convert(src, out *ir.Literal) error {
	sd, dd := src.Type.DType, out.Type.DType
	switch {
	case sd == dd && sd != ir.Bool:
		copy(out.Data, src.Data)
		return nil
	case sd == ir.Bool:
		sc, b := boolScratchOf(src)
		defer putScratch(&boolScratch, sc)
		return convertFromInts(b, out)
	case sd == ir.Uint8:
		return convertFromInts(viewAs[uint8](src.Data), out)
	case sd == ir.Int32:
		return convertFromInts(viewAs[int32](src.Data), out)
	case sd == ir.Int64:
		return convertFromInts(viewAs[int64](src.Data), out)
	case sd == ir.Uint32:
		return convertFromInts(viewAs[uint32](src.Data), out)
	case sd == ir.Float64:
		return convertFromFloats(viewAs[float64](src.Data), out)
	case sd.IsFloat():
		// f32 as a view, f16/bf16 widened exactly to float32.
		sc, f := toF32Scratch(src)
		defer putScratch(&f32Scratch, sc)
		return convertFromFloats(f, out)
	}
	return fmt.Errorf("cannot convert %v to %v", sd, dd)
}

func convertInts[S, D intT](dst []D, src []S) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = D(v)
	}
}

func intToFloat[S intT, D floatT](dst []D, src []S) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = D(v) // Go rounds to nearest even
	}
}

// roundOdd53 returns v rounded to 53 significant bits with round-to-odd, so
// that a second rounding to a narrower float is the correct single rounding.
func roundOdd53(v int64) float64 {
	if v > -(1<<53) && v < 1<<53 {
		return float64(v)
	}
	u := uint64(v)
	if v < 0 {
		u = -u
	}
	sh := bits.Len64(u) - 53
	hi := u >> sh
	if u&(1<<sh-1) != 0 {
		hi |= 1
	}
	f := math.Ldexp(float64(hi), sh)
	if v < 0 {
		f = -f
	}
	return f
}

func convertFromInts[S intT](src []S, out *ir.Literal) error {
	switch out.Type.DType {
	case ir.Bool:
		for i, v := range src {
			out.Data[i] = b2u(v != 0)
		}
	case ir.Uint8:
		convertInts(viewAs[uint8](out.Data), src)
	case ir.Int32:
		convertInts(viewAs[int32](out.Data), src)
	case ir.Int64:
		convertInts(viewAs[int64](out.Data), src)
	case ir.Uint32:
		convertInts(viewAs[uint32](out.Data), src)
	case ir.Float32:
		intToFloat(viewAs[float32](out.Data), src)
	case ir.Float64:
		intToFloat(viewAs[float64](out.Data), src)
	case ir.Float16:
		dst := viewAs[ir.F16](out.Data)
		for i, v := range src {
			dst[i] = ir.F16FromFloat64(roundOdd53(int64(v)))
		}
	case ir.BFloat16:
		dst := viewAs[ir.BF16](out.Data)
		for i, v := range src {
			dst[i] = ir.BF16FromFloat64(roundOdd53(int64(v)))
		}
	default:
		return fmt.Errorf("cannot convert to %v", out.Type.DType)
	}
	return nil
}

func floatToInt[D intT, S floatT](dst []D, src []S, lo, hi int64) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = D(ir.FloatToInt(float64(v), lo, hi))
	}
}

// convertFromFloats converts float32 or float64 values (exactly the source
// values: widening is exact) to out's dtype with one rounding.
func convertFromFloats[S floatT](src []S, out *ir.Literal) error {
	switch out.Type.DType {
	case ir.Bool:
		for i, v := range src {
			out.Data[i] = b2u(v != 0) // NaN != 0
		}
	case ir.Uint8:
		floatToInt(viewAs[uint8](out.Data), src, 0, math.MaxUint8)
	case ir.Int32:
		floatToInt(viewAs[int32](out.Data), src, math.MinInt32, math.MaxInt32)
	case ir.Int64:
		floatToInt(viewAs[int64](out.Data), src, math.MinInt64, math.MaxInt64)
	case ir.Uint32:
		floatToInt(viewAs[uint32](out.Data), src, 0, math.MaxUint32)
	case ir.Float32:
		dst := viewAs[float32](out.Data)
		for i, v := range src {
			dst[i] = float32(v)
		}
	case ir.Float64:
		dst := viewAs[float64](out.Data)
		for i, v := range src {
			dst[i] = float64(v)
		}
	case ir.Float16:
		dst := viewAs[ir.F16](out.Data)
		for i, v := range src {
			dst[i] = ir.F16FromFloat64(float64(v))
		}
	case ir.BFloat16:
		dst := viewAs[ir.BF16](out.Data)
		for i, v := range src {
			dst[i] = ir.BF16FromFloat64(float64(v))
		}
	default:
		return fmt.Errorf("cannot convert to %v", out.Type.DType)
	}
	return nil
}
