package interop_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/interop"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
	"gorgonia.org/tensor"
)

// hostBuf and hostExec are a minimal eager executor: buffers are host
// literals. Conversions only need FromLiteral and Literal, so the interop tests
// do not depend on the runtime package.
type hostBuf struct{ lit *ir.Literal }

func (b hostBuf) Type() ir.Type                 { return b.lit.Type }
func (b hostBuf) Literal() (*ir.Literal, error) { return b.lit, nil }

// panicBuf is a buffer whose contents cannot be read.
type panicBuf struct{}

func (panicBuf) Type() ir.Type                 { return ir.TypeOf(ir.Float32, 2) }
func (panicBuf) Literal() (*ir.Literal, error) { panic("boom") }

type hostExec struct{}

func (hostExec) FromLiteral(l *ir.Literal) (trace.Buffer, error) { return hostBuf{l.Clone()}, nil }
func (hostExec) Execute(string, func() *ir.Func, []trace.Buffer) ([]trace.Buffer, error) {
	return nil, errors.New("the interop tests' executor runs no ops")
}

func init() { trace.SetExecutor(hostExec{}) }

var testShapes = [][]int{{}, {1}, {7}, {2, 3}, {3, 1, 4}, {2, 3, 4, 2}, {1, 1}}

// randomBacking returns n random elements of dtype dt as a Go slice.
func randomBacking(r *rand.Rand, dt tensor.Dtype, n int) any {
	s := reflect.MakeSlice(reflect.SliceOf(dt.Type), n, n)
	for i := range n {
		var v any
		switch dt {
		case tensor.Bool:
			v = r.IntN(2) == 1
		case tensor.Uint8:
			v = uint8(r.Uint32())
		case tensor.Int32:
			v = int32(r.Uint32())
		case tensor.Int64:
			v = int64(r.Uint64())
		case tensor.Int:
			v = int(r.Uint64())
		case tensor.Uint32:
			v = r.Uint32()
		case tensor.Float32:
			v = float32(r.NormFloat64())
		case tensor.Float64:
			v = r.NormFloat64() * 1e3
		}
		s.Index(i).Set(reflect.ValueOf(v))
	}
	return s.Interface()
}

func newDense(dt tensor.Dtype, shape []int, backing any) *tensor.Dense {
	if len(shape) == 0 {
		return tensor.New(tensor.FromScalar(reflect.ValueOf(backing).Index(0).Interface()))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(backing))
}

// elems returns the elements of a literal as a Go slice of its native type
// (int64 for tensor.Int).
func elems(l *ir.Literal) any {
	switch l.Type.DType {
	case ir.Bool:
		return ir.View[bool](l)
	case ir.Uint8:
		return ir.View[uint8](l)
	case ir.Int32:
		return ir.View[int32](l)
	case ir.Int64:
		return ir.View[int64](l)
	case ir.Uint32:
		return ir.View[uint32](l)
	case ir.Float32:
		return ir.View[float32](l)
	case ir.Float64:
		return ir.View[float64](l)
	}
	panic(l.Type.DType)
}

// denseElems returns the elements of a Dense in logical row-major order, read
// one by one with At.
func denseElems(d *tensor.Dense) []any {
	if d.IsScalar() {
		return []any{d.ScalarValue()}
	}
	shape := []int(d.Shape())
	n := 1
	for _, s := range shape {
		n *= s
	}
	out := make([]any, 0, n)
	coord := make([]int, len(shape))
	for range n {
		v, err := d.At(coord...)
		if err != nil {
			panic(err)
		}
		out = append(out, v)
		for k := len(coord) - 1; k >= 0; k-- {
			coord[k]++
			if coord[k] < shape[k] {
				break
			}
			coord[k] = 0
		}
	}
	return out
}

func anySlice(s any) []any {
	v := reflect.ValueOf(s)
	out := make([]any, v.Len())
	for i := range out {
		out[i] = v.Index(i).Interface()
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dtypes := []struct {
		tdt, back tensor.Dtype
		idt       ir.DType
	}{
		{tensor.Bool, tensor.Bool, ir.Bool},
		{tensor.Uint8, tensor.Uint8, ir.Uint8},
		{tensor.Int32, tensor.Int32, ir.Int32},
		{tensor.Int64, tensor.Int64, ir.Int64},
		{tensor.Int, tensor.Int64, ir.Int64},
		{tensor.Uint32, tensor.Uint32, ir.Uint32},
		{tensor.Float32, tensor.Float32, ir.Float32},
		{tensor.Float64, tensor.Float64, ir.Float64},
	}
	for _, dt := range dtypes {
		for _, shape := range testShapes {
			t.Run(fmt.Sprintf("%v%v", dt.tdt, shape), func(t *testing.T) {
				n := ir.Shape(shape).Size()
				backing := randomBacking(r, dt.tdt, n)
				d := newDense(dt.tdt, shape, backing)
				want := anySlice(backing)
				if dt.tdt == tensor.Int {
					for i, v := range want {
						want[i] = int64(v.(int))
					}
				}

				a, err := interop.FromDense(d)
				if err != nil {
					t.Fatal(err)
				}
				if typ := ir.TypeOf(dt.idt, shape...); !a.Type().Equal(typ) {
					t.Fatalf("array type %v, want %v", a.Type(), typ)
				}
				l, err := a.Literal()
				if err != nil {
					t.Fatal(err)
				}
				if got := anySlice(elems(l)); !reflect.DeepEqual(got, want) {
					t.Fatalf("FromDense values\n got %v\nwant %v", got, want)
				}

				back, err := interop.ToDense(a)
				if err != nil {
					t.Fatal(err)
				}
				if back.Dtype() != dt.back {
					t.Fatalf("ToDense dtype %v, want %v", back.Dtype(), dt.back)
				}
				if len(shape) == 0 {
					if !back.IsScalar() {
						t.Fatalf("ToDense of a scalar has shape %v", back.Shape())
					}
				} else if !slices.Equal([]int(back.Shape()), shape) {
					t.Fatalf("ToDense shape %v, want %v", back.Shape(), shape)
				}
				if got := denseElems(back); !reflect.DeepEqual(got, want) {
					t.Fatalf("ToDense values\n got %v\nwant %v", got, want)
				}
				// Copies, not views: changing the Dense does not change the array.
				if len(shape) > 0 && dt.tdt == dt.back {
					reflect.ValueOf(back.Data()).Index(0).SetZero()
					if l2, _ := a.Literal(); !reflect.DeepEqual(anySlice(elems(l2)), want) {
						t.Fatal("ToDense result shares memory with the array")
					}
				}
			})
		}
	}
}

// checkLogical checks FromDense(d) against d read element by element.
func checkLogical(t *testing.T, d *tensor.Dense) {
	t.Helper()
	want := denseElems(d)
	a, err := interop.FromDense(d)
	if err != nil {
		t.Fatal(err)
	}
	wantShape := []int(d.Shape())
	if d.IsScalar() {
		wantShape = []int{}
	}
	if !a.Shape().Equal(ir.Shape(wantShape)) {
		t.Fatalf("shape %v, want %v", a.Shape(), d.Shape())
	}
	l, _ := a.Literal()
	if got := anySlice(elems(l)); !reflect.DeepEqual(got, want) {
		t.Fatalf("values of %v view (strides %v, %v)\n got %v\nwant %v", d.Shape(), d.Strides(), d.DataOrder(), got, want)
	}
}

func TestViews(t *testing.T) {
	t.Run("transpose", func(t *testing.T) {
		d := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{0, 1, 2, 3, 4, 5}))
		if err := d.T(); err != nil {
			t.Fatal(err)
		}
		a, err := interop.FromDense(d)
		if err != nil {
			t.Fatal(err)
		}
		if !a.Shape().Equal(ir.Shape{3, 2}) || !slices.Equal(a.Float32s(), []float32{0, 3, 1, 4, 2, 5}) {
			t.Fatalf("transposed: %v", a)
		}
		checkLogical(t, d)
		if !slices.Equal(d.Data().([]float32), []float32{0, 1, 2, 3, 4, 5}) {
			t.Fatal("input changed")
		}
	})
	r := rand.New(rand.NewPCG(3, 4))
	for _, shape := range [][]int{{2, 3, 4}, {3, 1, 5}, {2, 2, 3, 2}} {
		n := ir.Shape(shape).Size()
		for trial := range 6 {
			perm := r.Perm(len(shape))
			t.Run(fmt.Sprintf("transpose%v%v", shape, perm), func(t *testing.T) {
				d := tensor.New(tensor.WithShape(shape...), tensor.WithBacking(tensor.Range(tensor.Int32, 0, n)))
				if err := d.T(perm...); err != nil {
					t.Skipf("gorgonia T(%v): %v", perm, err)
				}
				checkLogical(t, d)
			})
			_ = trial
		}
	}
	t.Run("colmajor", func(t *testing.T) {
		// AsFortran takes the elements in logical (row-major) order and stores
		// them column by column.
		d := tensor.New(tensor.WithShape(2, 3), tensor.AsFortran([]float64{0, 1, 2, 3, 4, 5}))
		if !slices.Equal(d.Data().([]float64), []float64{0, 3, 1, 4, 2, 5}) {
			t.Fatalf("column-major storage is %v", d.Data())
		}
		a, err := interop.FromDense(d)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.Float64s(), []float64{0, 1, 2, 3, 4, 5}) {
			t.Fatalf("column-major: %v", a)
		}
		checkLogical(t, d)
	})
	base := func() *tensor.Dense {
		return tensor.New(tensor.WithShape(4, 5), tensor.WithBacking(tensor.Range(tensor.Float64, 0, 20)))
	}
	for name, sl := range map[string][]tensor.Slice{
		"rows":       {tensor.S(1, 3)},
		"one row":    {tensor.S(2)},
		"columns":    {nil, tensor.S(1, 4)},
		"one column": {nil, tensor.S(3)},
		"block":      {tensor.S(1, 4), tensor.S(2, 5)},
		"step":       {tensor.S(0, 4, 2), tensor.S(0, 5, 2)},
		"element":    {tensor.S(2), tensor.S(3)},
	} {
		t.Run("slice "+name, func(t *testing.T) {
			v, err := base().Slice(sl...)
			if err != nil {
				t.Skipf("gorgonia Slice: %v", err)
			}
			checkLogical(t, v.(*tensor.Dense))
		})
	}
	t.Run("slice of transpose", func(t *testing.T) {
		d := base()
		if err := d.T(); err != nil {
			t.Fatal(err)
		}
		v, err := d.Slice(tensor.S(1, 4), tensor.S(0, 3))
		if err != nil {
			t.Skipf("gorgonia Slice: %v", err)
		}
		checkLogical(t, v.(*tensor.Dense))
	})
}

func TestUnsupported(t *testing.T) {
	for _, c := range []struct {
		backing any
		name    string
	}{
		{[]int8{1}, "int8"}, {[]int16{1}, "int16"}, {[]uint16{1}, "uint16"}, {[]uint64{1}, "uint64"},
		{[]uint{1}, "uint"}, {[]complex64{1}, "complex64"}, {[]complex128{1}, "complex128"}, {[]string{"a"}, "string"},
	} {
		d := tensor.New(tensor.WithShape(1), tensor.WithBacking(c.backing))
		_, err := interop.FromDense(d)
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("FromDense(%s): %v", c.name, err)
		}
		if _, err := interop.DTypeOf(d.Dtype()); err == nil {
			t.Errorf("DTypeOf(%s) succeeded", c.name)
		}
	}
	for _, dt := range []ir.DType{ir.Float16, ir.BFloat16} {
		a := trace.FromLiteral(ir.NewLiteral(ir.TypeOf(dt, 2)))
		_, err := interop.ToDense(a)
		if err == nil || !strings.Contains(err.Error(), dt.LongName()) || !strings.Contains(err.Error(), "float32") {
			t.Errorf("ToDense(%v): %v", dt, err)
		}
	}
	for _, dt := range ir.AllDTypes {
		gdt, err := interop.DtypeOf(dt)
		if err != nil {
			continue
		}
		if back, err := interop.DTypeOf(gdt); err != nil || back != dt {
			t.Errorf("dtype %v -> %v -> %v, %v", dt, gdt, back, err)
		}
	}
}

func TestErrors(t *testing.T) {
	if _, err := interop.FromDense(nil); err == nil {
		t.Error("FromDense(nil) succeeded")
	}
	if _, err := interop.ToDense(nil); err == nil {
		t.Error("ToDense(nil) succeeded")
	}
	// A zero Dense (gorgonia panics on most of its methods) is an error.
	if _, err := interop.FromDense(&tensor.Dense{}); err == nil {
		t.Error("FromDense(&tensor.Dense{}) succeeded")
	}
	// Panics while converting come back as errors.
	if _, err := interop.ToDense(trace.FromBuffer(panicBuf{})); err == nil || !strings.Contains(err.Error(), "recovered panic: boom") {
		t.Errorf("ToDense of a panicking buffer: %v", err)
	}
	if _, err := interop.LiteralDense(&ir.Literal{Type: ir.TypeOf(ir.Float32, 4), Data: make([]byte, 3)}); err == nil {
		t.Error("LiteralDense of a short literal succeeded")
	}
	// Traced arrays have no values.
	tr := trace.NewFuncTracer("t")
	tr.Push()
	x := tr.Param(ir.TypeOf(ir.Float32, 2))
	_, err := interop.ToDense(x)
	tr.Pop()
	if err == nil || !strings.Contains(err.Error(), "traced") {
		t.Errorf("ToDense of a traced array: %v", err)
	}
	// Masked tensors.
	m := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float32{1, 2}, []bool{false, true}))
	if _, err := interop.FromDense(m); err == nil || !strings.Contains(err.Error(), "masked") {
		t.Errorf("FromDense of a masked tensor: %v", err)
	}
}

func TestZeroSize(t *testing.T) {
	for _, shape := range [][]int{{0}, {0, 3}, {2, 0, 4}} {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Int, tensor.Bool} {
			d := tensor.New(tensor.WithShape(shape...), tensor.WithBacking(reflect.MakeSlice(reflect.SliceOf(dt.Type), 0, 0).Interface()))
			a, err := interop.FromDense(d)
			if err != nil {
				t.Fatalf("FromDense(%v%v): %v", dt, shape, err)
			}
			idt, _ := interop.DTypeOf(dt)
			if !a.Type().Equal(ir.TypeOf(idt, shape...)) {
				t.Fatalf("FromDense(%v%v) is %v", dt, shape, a.Type())
			}
			back, err := interop.ToDense(a)
			if err != nil {
				t.Fatalf("ToDense(%v): %v", a.Type(), err)
			}
			if !slices.Equal([]int(back.Shape()), shape) || back.Size() != 0 {
				t.Fatalf("ToDense(%v) has shape %v", a.Type(), back.Shape())
			}
		}
	}
	// gorgonia's own Data panics on a zero-size Dense; FromDense does not call it.
	d := tensor.New(tensor.WithShape(0, 3), tensor.Of(tensor.Float64))
	if _, err := interop.FromDense(d); err != nil {
		t.Fatal(err)
	}
}

func TestNoExecutorError(t *testing.T) {
	// DenseLiteral and LiteralDense need no executor.
	d := tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))
	if err := d.T(); err != nil {
		t.Fatal(err)
	}
	l, err := interop.DenseLiteral(d)
	if err != nil || !slices.Equal(ir.View[float64](l), []float64{1, 3, 2, 4}) {
		t.Fatalf("DenseLiteral: %v %v", l, err)
	}
	back, err := interop.LiteralDense(l)
	if err != nil || !slices.Equal(back.Data().([]float64), []float64{1, 3, 2, 4}) {
		t.Fatalf("LiteralDense: %v %v", back, err)
	}
}
