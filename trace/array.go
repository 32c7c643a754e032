package trace

import (
	"fmt"
	"math"
	"strings"

	"github.com/ferryml/ferry/ir"
)

// Buffer is the storage of a concrete array, owned by a backend (ir.Buffer;
// the runtime package provides it).
type Buffer = ir.Buffer

// Deleter is implemented by buffers that can be freed before they are
// garbage (ir.Deleter).
type Deleter = ir.Deleter

// Holder is implemented by buffers that a running execution holds, so that
// their memory is not freed or handed to another call under it: usage holds
// and donation holds (ir.Holder says how they work).
type Holder = ir.Holder

// Delete frees a concrete array's memory now instead of when it becomes garbage
// (like jax.Array.delete). Using the array afterwards is an error. Deleting a
// traced array is an error. An array that a running call (in another
// goroutine) reads stays in memory until that call is done: Delete does not
// wait, the array is unusable at once, and its memory is freed when the call
// ends.
func (a *Array) Delete() error {
	if a == nil || a.tr != nil || a.buf == nil {
		return fmt.Errorf("Delete: not a concrete array")
	}
	if d, ok := a.buf.(Deleter); ok {
		return d.Delete()
	}
	return nil
}

// Array is Ferry's one array type. It is either concrete (it holds a Buffer) or
// traced (it stands for an ir.Value of the function being traced). The same user
// code runs on both: ops on concrete arrays execute eagerly, ops on traced arrays
// are recorded.
type Array struct {
	typ  ir.Type
	buf  Buffer
	val  *ir.Value
	tr   *Tracer
	weak bool
	// moveIn: a pinned_host parameter that ops other than device_put and
	// control flow read through a device copy made where used (HostParam).
	moveIn bool
}

// Abstract returns an array that has only a type, like jax.ShapeDtypeStruct: it
// can be passed to rt.Lower and Jitted.Lower to trace and compile (and read the
// memory analysis of) programs too large to materialise, but not run.
func Abstract(t ir.Type) *Array { return &Array{typ: t.Clone()} }

// IsAbstract reports whether a has neither a buffer nor a tracer (see Abstract).
func (a *Array) IsAbstract() bool { return a != nil && a.buf == nil && a.tr == nil }

// FromBuffer wraps a backend buffer as a concrete array.
func FromBuffer(b Buffer) *Array { return &Array{typ: b.Type(), buf: b} }

// Type returns the abstract value: dtype, shape, memory space and sharding.
func (a *Array) Type() ir.Type { return a.typ.Clone() }

// DType returns the element type.
func (a *Array) DType() ir.DType { return a.typ.DType }

// Shape returns a copy of the dimensions.
func (a *Array) Shape() ir.Shape { return a.typ.Shape.Clone() }

// Rank returns the number of dimensions.
func (a *Array) Rank() int { return len(a.typ.Shape) }

// Size returns the number of elements.
func (a *Array) Size() int { return a.typ.Shape.Size() }

// Space returns the memory space the array lives in.
func (a *Array) Space() ir.MemorySpace { return a.typ.Space }

// HasType reports whether a's type (dtype, shape and memory space) is t,
// without copying a's shape as Type does.
func (a *Array) HasType(t ir.Type) bool { return a.typ.Equal(t) }

// IsTraced reports whether a is a tracer standing for a value being traced.
func (a *Array) IsTraced() bool { return a.tr != nil }

// IsWeak reports whether a is a weakly typed scalar (from Scalar), whose dtype
// yields to the other operand's in binary ops, as JAX's Python scalars do.
func (a *Array) IsWeak() bool { return a.weak }

// Value returns the IR value a traced array stands for (nil if concrete).
func (a *Array) Value() *ir.Value { return a.val }

// Tracer returns the tracer a traced array belongs to (nil if concrete).
func (a *Array) Tracer() *Tracer { return a.tr }

// Buffer returns the storage of a concrete array (nil if traced).
func (a *Array) Buffer() Buffer { return a.buf }

// Literal returns the contents of a concrete array as a host literal, or an error
// for a traced array or a donated buffer.
func (a *Array) Literal() (*ir.Literal, error) {
	if a == nil {
		return nil, fmt.Errorf("nil array")
	}
	if a.tr != nil {
		return nil, fmt.Errorf("array %v is traced: its value is not known while tracing (return it from the jitted function instead)", a.typ)
	}
	if a.buf == nil {
		return nil, fmt.Errorf("array %v is abstract (trace.Abstract): it has a type but no values; it can be lowered, not run", a.typ)
	}
	return a.buf.Literal()
}

func (a *Array) mustLiteral(op string) *ir.Literal {
	l, err := a.Literal()
	if err != nil {
		panic(Errorf(op, "%v", err))
	}
	return l
}

// hold takes a usage hold on a concrete array's buffer, if it has holds
// (Holder), for a read of its values; the returned function ends it.
func (a *Array) hold(op string) func() {
	if a == nil || a.tr != nil {
		return func() {}
	}
	h, ok := a.buf.(Holder)
	if !ok {
		return func() {}
	}
	if err := h.Hold(false, ""); err != nil {
		panic(Errorf(op, "%v", err))
	}
	return func() { h.Unhold(false) }
}

func values[T any](a *Array, op string, conv func(l *ir.Literal, i int) T) []T {
	defer a.hold(op)()
	l := a.mustLiteral(op)
	out := make([]T, l.Type.Size())
	for i := range out {
		out[i] = conv(l, i)
	}
	return out
}

// Float32s returns the elements converted to float32. It panics with *Error on a
// traced array.
func (a *Array) Float32s() []float32 {
	if a.typ.DType == ir.Float32 {
		defer a.hold("Float32s")()
		return append([]float32{}, ir.View[float32](a.mustLiteral("Float32s"))...)
	}
	return values(a, "Float32s", func(l *ir.Literal, i int) float32 { return float32(l.Float64At(i)) })
}

// Float64s returns the elements converted to float64.
func (a *Array) Float64s() []float64 {
	return values(a, "Float64s", func(l *ir.Literal, i int) float64 { return l.Float64At(i) })
}

// Int32s returns the elements converted to int32 (floats truncate and saturate).
func (a *Array) Int32s() []int32 {
	return values(a, "Int32s", func(l *ir.Literal, i int) int32 {
		if l.Type.DType == ir.Int32 {
			return ir.View[int32](l)[i]
		}
		return int32(toInt(l, i, math.MinInt32, math.MaxInt32))
	})
}

// Int64s returns the elements converted to int64.
func (a *Array) Int64s() []int64 {
	return values(a, "Int64s", func(l *ir.Literal, i int) int64 {
		if l.Type.DType == ir.Int64 {
			return ir.View[int64](l)[i]
		}
		return toInt(l, i, math.MinInt64, math.MaxInt64)
	})
}

// Uint32s returns the elements converted to uint32.
func (a *Array) Uint32s() []uint32 {
	return values(a, "Uint32s", func(l *ir.Literal, i int) uint32 {
		if l.Type.DType == ir.Uint32 {
			return ir.View[uint32](l)[i]
		}
		return uint32(toInt(l, i, 0, math.MaxUint32))
	})
}

// Uint8s returns the elements converted to uint8.
func (a *Array) Uint8s() []uint8 {
	return values(a, "Uint8s", func(l *ir.Literal, i int) uint8 { return uint8(toInt(l, i, 0, math.MaxUint8)) })
}

// Bools returns the elements as booleans (nonzero is true).
func (a *Array) Bools() []bool {
	return values(a, "Bools", func(l *ir.Literal, i int) bool { return l.Float64At(i) != 0 })
}

// Item returns the only element of a one-element array as float64.
func (a *Array) Item() float64 {
	if a == nil {
		panic(Errorf("Item", "nil array"))
	}
	if a.Size() != 1 {
		panic(Errorf("Item", "array %v has %d elements, not 1", a.typ, a.Size()))
	}
	defer a.hold("Item")()
	return a.mustLiteral("Item").Float64At(0)
}

func toInt(l *ir.Literal, i int, lo, hi int64) int64 {
	switch l.Type.DType {
	case ir.Int64:
		v := ir.View[int64](l)[i]
		return min(max(v, lo), hi)
	case ir.Int32:
		return min(max(int64(ir.View[int32](l)[i]), lo), hi)
	case ir.Uint32:
		return min(max(int64(ir.View[uint32](l)[i]), lo), hi)
	}
	return ir.FloatToInt(l.Float64At(i), lo, hi)
}

// String formats a concrete array as its type and nested rows, like
// f32[2,2] [[1 2] [3 4]]; a traced array as Traced<f32[2,2]>.
func (a *Array) String() string {
	if a == nil {
		return "<nil>"
	}
	if a.tr != nil {
		return "Traced<" + a.typ.String() + ">"
	}
	if h, ok := a.buf.(Holder); ok {
		if err := h.Hold(false, ""); err != nil {
			return a.typ.String() + " <" + err.Error() + ">"
		}
		defer h.Unhold(false)
	}
	l, err := a.Literal()
	if err != nil {
		return a.typ.String() + " <" + err.Error() + ">"
	}
	return a.typ.String() + " " + FormatLiteral(l, 1000)
}

// FormatLiteral formats a literal's elements as nested brackets, eliding the
// middle of axes when the array has more than maxElems elements.
func FormatLiteral(l *ir.Literal, maxElems int) string {
	var b strings.Builder
	shape := l.Type.Shape
	if len(shape) == 0 {
		formatElem(&b, l, 0)
		return b.String()
	}
	edge := -1
	if l.Type.Size() > maxElems {
		edge = 3
	}
	strides := shape.Strides()
	var rec func(dim, off int)
	rec = func(dim, off int) {
		b.WriteByte('[')
		n := shape[dim]
		for i := 0; i < n; i++ {
			if edge > 0 && n > 2*edge && i == edge {
				b.WriteString("... ")
				i = n - edge - 1
				continue
			}
			if i > 0 {
				b.WriteByte(' ')
			}
			if dim == len(shape)-1 {
				formatElem(&b, l, off+i)
			} else {
				rec(dim+1, off+i*strides[dim])
			}
		}
		b.WriteByte(']')
	}
	rec(0, 0)
	return b.String()
}

func formatElem(b *strings.Builder, l *ir.Literal, i int) {
	switch dt := l.Type.DType; {
	case dt == ir.Bool:
		if l.Data[i] != 0 {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case dt == ir.Int64:
		fmt.Fprint(b, ir.View[int64](l)[i])
	case dt.IsInteger():
		fmt.Fprint(b, int64(l.Float64At(i)))
	case dt == ir.Float32:
		fmt.Fprint(b, ir.View[float32](l)[i])
	default:
		v := l.Float64At(i)
		if dt == ir.Float16 || dt == ir.BFloat16 {
			fmt.Fprint(b, float32(v))
		} else {
			fmt.Fprint(b, v)
		}
	}
}
