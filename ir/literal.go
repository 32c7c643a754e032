package ir

import (
	"fmt"
	"math"
	"unsafe"
)

// Native is the set of Go element types that map one-to-one onto a DType.
type Native interface {
	bool | uint8 | int32 | int64 | uint32 | F16 | BF16 | float32 | float64
}

// DTypeOf returns the DType of the Go element type T.
func DTypeOf[T Native]() DType {
	var z T
	switch any(z).(type) {
	case bool:
		return Bool
	case uint8:
		return Uint8
	case int32:
		return Int32
	case int64:
		return Int64
	case uint32:
		return Uint32
	case F16:
		return Float16
	case BF16:
		return BFloat16
	case float32:
		return Float32
	case float64:
		return Float64
	}
	return InvalidDType
}

// Literal is a host array: a type and its elements, row-major, little-endian, in
// the machine's native layout (bool is one byte, 0 or 1). Constants in the IR and
// buffers of the reference executor are Literals.
type Literal struct {
	Type Type
	Data []byte
}

// NewLiteral returns a zero-filled literal of type t without its sharding: a
// literal is one array in host memory.
func NewLiteral(t Type) *Literal {
	return &Literal{Type: t.WithShape(t.Shape), Data: alignedBytes(int(t.Bytes()))}
}

// alignedBytes allocates n bytes whose start is 8-byte aligned, so typed views are safe.
func alignedBytes(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	words := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), n)
}

// LiteralOf copies data into a new literal of the given shape.
func LiteralOf[T Native](shape Shape, data []T) (*Literal, error) {
	dt := DTypeOf[T]()
	if err := CheckShape(shape, dt); err != nil {
		return nil, err
	}
	if shape.Size() != len(data) {
		return nil, fmt.Errorf("shape %v holds %d elements, got %d values", shape, shape.Size(), len(data))
	}
	l := NewLiteral(Type{DType: dt, Shape: shape})
	copy(View[T](l), data)
	return l, nil
}

// Scalar returns a rank-0 literal holding v.
func Scalar[T Native](v T) *Literal {
	l, _ := LiteralOf(Shape{}, []T{v})
	return l
}

// View returns the elements of l as a []T sharing l's memory. It panics if T does
// not match l's dtype.
func View[T Native](l *Literal) []T {
	if dt := DTypeOf[T](); dt != l.Type.DType {
		panic(fmt.Sprintf("ir.View: literal is %v, not %v", l.Type.DType, dt))
	}
	return ViewBytes[T](l.Data)
}

// ViewBytes reinterprets b as a []T (b must be aligned for T).
func ViewBytes[T Native](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return []T{}
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// Clone returns a deep copy.
func (l *Literal) Clone() *Literal {
	c := NewLiteral(l.Type)
	copy(c.Data, l.Data)
	return c
}

// Float64At returns element i converted to float64 (bool as 0/1).
func (l *Literal) Float64At(i int) float64 {
	switch l.Type.DType {
	case Bool:
		if l.Data[i] != 0 {
			return 1
		}
		return 0
	case Uint8:
		return float64(l.Data[i])
	case Int32:
		return float64(View[int32](l)[i])
	case Int64:
		return float64(View[int64](l)[i])
	case Uint32:
		return float64(View[uint32](l)[i])
	case Float16:
		return View[F16](l)[i].Float64()
	case BFloat16:
		return View[BF16](l)[i].Float64()
	case Float32:
		return float64(View[float32](l)[i])
	case Float64:
		return View[float64](l)[i]
	}
	panic("ir: bad dtype " + l.Type.DType.String())
}

// SetFloat64At stores v at element i, converted to the literal's dtype with the
// same rules as the convert op (round to nearest even for floats, truncation
// toward zero and saturation for integers, NaN to 0, nonzero to true).
func (l *Literal) SetFloat64At(i int, v float64) {
	switch l.Type.DType {
	case Bool:
		if v != 0 {
			l.Data[i] = 1
		} else {
			l.Data[i] = 0
		}
	case Uint8:
		l.Data[i] = uint8(FloatToInt(v, 0, math.MaxUint8))
	case Int32:
		View[int32](l)[i] = int32(FloatToInt(v, math.MinInt32, math.MaxInt32))
	case Int64:
		View[int64](l)[i] = FloatToInt(v, math.MinInt64, math.MaxInt64)
	case Uint32:
		View[uint32](l)[i] = uint32(FloatToInt(v, 0, math.MaxUint32))
	case Float16:
		View[F16](l)[i] = F16FromFloat64(v)
	case BFloat16:
		View[BF16](l)[i] = BF16FromFloat64(v)
	case Float32:
		View[float32](l)[i] = float32(v)
	case Float64:
		View[float64](l)[i] = v
	default:
		panic("ir: bad dtype " + l.Type.DType.String())
	}
}

// FloatToInt converts v to an integer in [lo, hi]: truncation toward zero,
// saturation at the bounds, NaN to 0.
func FloatToInt(v float64, lo, hi int64) int64 {
	if v != v {
		return 0
	}
	v = math.Trunc(v)
	if v <= float64(lo) {
		return lo
	}
	if v >= float64(hi) {
		return hi
	}
	return int64(v)
}

// Float64s returns all elements converted to float64.
func (l *Literal) Float64s() []float64 {
	out := make([]float64, l.Type.Size())
	for i := range out {
		out[i] = l.Float64At(i)
	}
	return out
}
