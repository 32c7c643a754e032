package eval

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// unalignedLit returns a garbage-filled literal of type t whose memory starts
// off bytes past an 8-byte boundary, as a scan's ys slice of a small value
// does.
func unalignedLit(t ir.Type, off int) *ir.Literal {
	n := int(t.Bytes())
	buf := make([]byte, n+off+8)
	for i := range buf {
		buf[i] = 0xa5 ^ byte(i)
	}
	return &ir.Literal{Type: t, Data: buf[off : off+n : off+n]}
}

// Ops without operands (constant, iota) written by EvalOpInto and
// Kernel.Into into destinations that are not 8-byte aligned: the kernels
// compute into aligned scratch and copy, as for any other op.
func TestIntoUnalignedNoOperands(t *testing.T) {
	for _, dt := range ir.AllDTypes {
		for _, off := range []int{1, 2, 4} {
			if off%dt.Size() != 0 {
				continue // a scan's ys slice is aligned to its element
			}
			ops := []struct {
				code  ir.Code
				attrs ir.Attrs
				typ   ir.Type
			}{
				{ir.Constant, ir.Attrs{"value": scalarOf(dt, 1)}, ir.TypeOf(dt)},
			}
			if dt != ir.Bool {
				ops = append(ops, struct {
					code  ir.Code
					attrs ir.Attrs
					typ   ir.Type
				}{ir.Iota, ir.Attrs{"dtype": dt, "shape": []int{2, 3}, "dim": 1}, ir.TypeOf(dt, 2, 3)})
			}
			for _, o := range ops {
				what := fmt.Sprintf("%v %v at offset %d", o.code, dt, off)
				f := ir.NewFunc("nooperand")
				op := addOp(t, f.Body, o.code, nil, o.attrs)
				want, err := EvalOp(op, nil)
				require.NoError(t, err, what)
				out := unalignedLit(o.typ, off)
				require.NoError(t, EvalOpInto(op, nil, []*ir.Literal{out}), what)
				require.True(t, bytes.Equal(want[0].Data, out.Data), "%s: EvalOpInto", what)
				k, err := Prepare(op)
				require.NoError(t, err, what)
				out = unalignedLit(o.typ, off)
				require.NoError(t, k.Into(nil, []*ir.Literal{out}), what)
				require.True(t, bytes.Equal(want[0].Data, out.Data), "%s: Kernel.Into", what)
				for i := range o.typ.Size() {
					v := 1.0
					if o.code == ir.Iota {
						v = float64(i % 3)
					}
					require.Equal(t, v, out.Float64At(i), "%s: element %d", what, i)
				}
			}
		}
	}
}

// scalarOf returns a scalar literal of dtype dt holding v.
func scalarOf(dt ir.DType, v float64) *ir.Literal {
	l := ir.NewLiteral(ir.TypeOf(dt))
	l.SetFloat64At(0, v)
	return l
}

// A scan whose body returns constants and an iota (as carry and ys), run by
// Run and, op by op, into ys destinations whose slices are not 8-byte
// aligned: every iteration writes the same values.
func TestScanConstantResults(t *testing.T) {
	for _, length := range []int{1, 2, 5} {
		f := ir.NewFunc("scan_consts")
		cT := ir.TypeOf(ir.Int32)
		pc := f.Body.AddParam(cT)
		body := f.NewRegion()
		body.AddParam(cT)
		k := constOp(t, body, int32(-1))
		y := constOp(t, body, int32(7))
		u := addOp(t, body, ir.Constant, nil, ir.Attrs{"value": scalarOf(ir.Uint8, 3)}).Result()
		io := addOp(t, body, ir.Iota, nil, ir.Attrs{"dtype": ir.Float32, "shape": []int{3}, "dim": 0}).Result()
		body.Results = []*ir.Value{k, y, u, io}
		op := addOp(t, f.Body, ir.Scan, []*ir.Value{pc}, ir.Attrs{"num_consts": 0, "num_carry": 1, "length": length}, body)
		f.Body.Results = op.Results
		c0 := scalarOf(ir.Int32, 42)
		res := runFunc(t, f, []*ir.Literal{c0})
		require.Equal(t, int64(-1), getI(res[0], 0))
		require.Equal(t, ir.Shape{length}, res[1].Type.Shape)
		require.Equal(t, ir.Shape{length}, res[2].Type.Shape)
		require.Equal(t, ir.Uint8, res[2].Type.DType)
		require.Equal(t, ir.Shape{length, 3}, res[3].Type.Shape)
		for i := range length {
			require.Equal(t, int64(7), getI(res[1], i))
			require.Equal(t, int64(3), getI(res[2], i))
			for j := range 3 {
				require.Equal(t, float32(j), ir.View[float32](res[3])[i*3+j])
			}
		}
	}
}
