// Package interop converts between Ferry arrays and other Go array libraries.
//
// For gorgonia.org/tensor, FromDense copies a *tensor.Dense into a concrete
// *trace.Array and ToDense copies a concrete *trace.Array into a new
// *tensor.Dense. Both copy the elements in row-major (C) order of the logical
// shape, whatever the Dense's own layout: transposed and sliced views and
// column-major (Fortran) tensors are read element by element in their logical
// order, so they need not be materialised first.
//
// The dtypes both sides have map one to one:
//
//	tensor.Bool    ir.Bool
//	tensor.Uint8   ir.Uint8
//	tensor.Int32   ir.Int32
//	tensor.Int64   ir.Int64
//	tensor.Uint32  ir.Uint32
//	tensor.Float32 ir.Float32
//	tensor.Float64 ir.Float64
//
// FromDense also takes tensor.Int (Go's int) and makes an ir.Int64 array. Other
// gorgonia dtypes (Int8, Int16, Uint, Uint16, Uint64, complex, string, ...) and
// Ferry's Float16 and BFloat16 (gorgonia has no half-precision floats) are
// errors; convert a half-precision array to float32 with trace.Convert first.
//
// A rank-0 array and a scalar Dense (shape ()) convert to each other. Arrays
// with a zero-size dimension convert both ways, though gorgonia's support for
// them is partial (its Dense.Data panics on one). Masked Dense tensors are not
// supported. Panics inside gorgonia are recovered and returned as errors.
//
// FromDense makes its array with trace.FromLiteral, so it needs an executor:
// import github.com/ferryml/ferry/runtime.
package interop

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
	"gorgonia.org/tensor"
)

// DTypeOf returns the Ferry dtype of a gorgonia dtype, as FromDense maps it
// (tensor.Int to ir.Int64), or an error for a dtype Ferry does not have.
func DTypeOf(dt tensor.Dtype) (ir.DType, error) {
	switch dt {
	case tensor.Bool:
		return ir.Bool, nil
	case tensor.Uint8:
		return ir.Uint8, nil
	case tensor.Int32:
		return ir.Int32, nil
	case tensor.Int64, tensor.Int:
		return ir.Int64, nil
	case tensor.Uint32:
		return ir.Uint32, nil
	case tensor.Float32:
		return ir.Float32, nil
	case tensor.Float64:
		return ir.Float64, nil
	}
	name := "<nil>"
	if dt.Type != nil {
		name = dt.String()
	}
	return ir.InvalidDType, fmt.Errorf("gorgonia dtype %s has no Ferry dtype (supported: bool, uint8, int32, int64, int, uint32, float32, float64)", name)
}

// DtypeOf returns the gorgonia dtype of a Ferry dtype, as ToDense maps it, or
// an error for float16, bfloat16 and invalid dtypes.
func DtypeOf(dt ir.DType) (tensor.Dtype, error) {
	switch dt {
	case ir.Bool:
		return tensor.Bool, nil
	case ir.Uint8:
		return tensor.Uint8, nil
	case ir.Int32:
		return tensor.Int32, nil
	case ir.Int64:
		return tensor.Int64, nil
	case ir.Uint32:
		return tensor.Uint32, nil
	case ir.Float32:
		return tensor.Float32, nil
	case ir.Float64:
		return tensor.Float64, nil
	case ir.Float16, ir.BFloat16:
		return tensor.Dtype{}, fmt.Errorf("gorgonia.org/tensor has no %s dtype: convert the array to float32 first (trace.Convert(a, ir.Float32))", dt.LongName())
	}
	return tensor.Dtype{}, fmt.Errorf("dtype %v has no gorgonia dtype", dt)
}

// FromDense copies t into a new concrete array of the same shape (rank 0 for a
// scalar Dense) in device memory. The elements are taken in t's logical
// row-major order, whatever its layout or view.
func FromDense(t *tensor.Dense) (a *trace.Array, err error) {
	defer recoverInto("FromDense", &err)
	if t == nil {
		return nil, errors.New("interop.FromDense: nil *tensor.Dense")
	}
	l, err := denseLiteral(t)
	if err != nil {
		return nil, fmt.Errorf("interop.FromDense: %w", err)
	}
	return trace.FromLiteral(l), nil
}

// DenseLiteral copies t into a host literal as FromDense does, without an
// executor.
func DenseLiteral(t *tensor.Dense) (l *ir.Literal, err error) {
	defer recoverInto("DenseLiteral", &err)
	if t == nil {
		return nil, errors.New("interop.DenseLiteral: nil *tensor.Dense")
	}
	l, err = denseLiteral(t)
	if err != nil {
		return nil, fmt.Errorf("interop.DenseLiteral: %w", err)
	}
	return l, nil
}

func denseLiteral(t *tensor.Dense) (*ir.Literal, error) {
	dt, err := DTypeOf(t.Dtype())
	if err != nil {
		return nil, err
	}
	shape := ir.Shape{}
	if !t.IsScalar() {
		shape = ir.Shape(slices.Clone([]int(t.Shape())))
	}
	for _, d := range shape {
		if d < 0 {
			return nil, fmt.Errorf("negative dimension in shape %v", shape)
		}
	}
	// (A zero-size Dense reports itself masked: its empty mask is as long as its data.)
	if t.IsMasked() && shape.Size() > 0 {
		return nil, errors.New("masked tensors are not supported (fill the masked elements first)")
	}
	l := ir.NewLiteral(ir.TypeOf(dt, shape...))
	switch t.Dtype() {
	case tensor.Bool:
		return l, gather(t, ir.View[bool](l), identity[bool])
	case tensor.Uint8:
		return l, gather(t, ir.View[uint8](l), identity[uint8])
	case tensor.Int32:
		return l, gather(t, ir.View[int32](l), identity[int32])
	case tensor.Int64:
		return l, gather(t, ir.View[int64](l), identity[int64])
	case tensor.Int:
		return l, gather(t, ir.View[int64](l), func(x int) int64 { return int64(x) })
	case tensor.Uint32:
		return l, gather(t, ir.View[uint32](l), identity[uint32])
	case tensor.Float32:
		return l, gather(t, ir.View[float32](l), identity[float32])
	case tensor.Float64:
		return l, gather(t, ir.View[float64](l), identity[float64])
	}
	panic("unreachable")
}

func identity[T any](x T) T { return x }

// gather copies the elements of t, in logical row-major order, into dst,
// converting each with conv.
func gather[S, D any](t *tensor.Dense, dst []D, conv func(S) D) error {
	if t.IsScalar() {
		v, ok := t.ScalarValue().(S)
		if !ok {
			return fmt.Errorf("scalar Dense holds a %T, not its dtype %v", t.ScalarValue(), t.Dtype())
		}
		dst[0] = conv(v)
		return nil
	}
	n := len(dst)
	if n == 0 {
		return nil // and gorgonia's Data panics on a zero-size Dense
	}
	src, ok := t.Data().([]S)
	if !ok {
		return fmt.Errorf("Dense of dtype %v holds %T", t.Dtype(), t.Data())
	}
	shape, strides := []int(t.Shape()), t.Strides()
	if len(strides) != len(shape) {
		return fmt.Errorf("Dense has shape %v but strides %v", shape, strides)
	}
	// Check every element is inside the data before reading.
	lo, hi := 0, 0
	for i, d := range shape {
		if s := strides[i] * (d - 1); s < 0 {
			lo += s
		} else {
			hi += s
		}
	}
	if lo < 0 || hi >= len(src) {
		return fmt.Errorf("Dense of shape %v with strides %v reaches outside its %d elements of data", shape, strides, len(src))
	}
	rank := len(shape)
	rowMajor := true
	for i, s := range ir.Shape(shape).Strides() {
		if shape[i] != 1 && strides[i] != s {
			rowMajor = false
		}
	}
	if rowMajor {
		for i, v := range src[:n] {
			dst[i] = conv(v)
		}
		return nil
	}
	// Odometer over the outer axes; the innermost axis is a strided run.
	inner, is := shape[rank-1], strides[rank-1]
	idx := make([]int, rank-1)
	off := 0
	for o := 0; o < n; o += inner {
		p := off
		for j := range inner {
			dst[o+j] = conv(src[p])
			p += is
		}
		for k := rank - 2; k >= 0; k-- {
			idx[k]++
			off += strides[k]
			if idx[k] < shape[k] {
				break
			}
			off -= strides[k] * shape[k]
			idx[k] = 0
		}
	}
	return nil
}

// ToDense copies a concrete array into a new *tensor.Dense of the same shape
// and dtype (a scalar Dense for a rank-0 array). It is an error for a traced
// array and for a float16 or bfloat16 array (convert it to float32 first with
// trace.Convert).
func ToDense(a *trace.Array) (d *tensor.Dense, err error) {
	defer recoverInto("ToDense", &err)
	if a == nil {
		return nil, errors.New("interop.ToDense: nil array")
	}
	l, err := a.Literal()
	if err != nil {
		return nil, fmt.Errorf("interop.ToDense: %w", err)
	}
	d, err = LiteralDense(l)
	if err != nil {
		return nil, fmt.Errorf("interop.ToDense: %w", err)
	}
	return d, nil
}

// LiteralDense copies a host literal into a new *tensor.Dense as ToDense does.
func LiteralDense(l *ir.Literal) (d *tensor.Dense, err error) {
	defer recoverInto("LiteralDense", &err)
	if l == nil {
		return nil, errors.New("nil literal")
	}
	if _, err := DtypeOf(l.Type.DType); err != nil {
		return nil, err
	}
	if want := l.Type.Bytes(); int64(len(l.Data)) != want {
		return nil, fmt.Errorf("literal of type %v has %d bytes, want %d", l.Type, len(l.Data), want)
	}
	switch l.Type.DType {
	case ir.Bool:
		return newDense(l, ir.View[bool](l)), nil
	case ir.Uint8:
		return newDense(l, ir.View[uint8](l)), nil
	case ir.Int32:
		return newDense(l, ir.View[int32](l)), nil
	case ir.Int64:
		return newDense(l, ir.View[int64](l)), nil
	case ir.Uint32:
		return newDense(l, ir.View[uint32](l)), nil
	case ir.Float32:
		return newDense(l, ir.View[float32](l)), nil
	case ir.Float64:
		return newDense(l, ir.View[float64](l)), nil
	}
	panic("unreachable")
}

func newDense[T ir.Native](l *ir.Literal, src []T) *tensor.Dense {
	if l.Type.Rank() == 0 {
		return tensor.New(tensor.FromScalar(src[0]))
	}
	return tensor.New(tensor.WithShape(l.Type.Shape...), tensor.WithBacking(slices.Clone(src)))
}

// recoverInto turns a panic (from gorgonia, or a *trace.Error from Ferry) into
// *err.
func recoverInto(fn string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	if e, ok := r.(error); ok {
		var te *trace.Error
		if errors.As(e, &te) {
			*err = e
			return
		}
		*err = fmt.Errorf("interop.%s: recovered panic: %w", fn, e)
		return
	}
	*err = fmt.Errorf("interop.%s: recovered panic: %v", fn, r)
}
