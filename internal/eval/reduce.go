package eval

import (
	"fmt"
	"math"
	"slices"

	"github.com/ferryml/ferry/ir"
)

// reduceLayout moves the reduced axes (in increasing order) behind the kept
// ones and returns the permuted data, the number of output elements and the
// number of elements reduced into each.
func reduceLayout(x *ir.Literal, axes []int) (data []byte, outer, r int) {
	rank := x.Type.Rank()
	red := slices.Clone(axes)
	slices.Sort(red)
	perm := make([]int, 0, rank)
	for i := 0; i < rank; i++ {
		if !slices.Contains(red, i) {
			perm = append(perm, i)
		}
	}
	kept := len(perm)
	perm = append(perm, red...)
	data, shape := permute(x, perm)
	return data, ir.Shape(shape[:kept]).Size(), ir.Shape(shape[kept:]).Size()
}

func reduce(code ir.Code, x *ir.Literal, axes []int, out *ir.Literal) error {
	data, outer, r := reduceLayout(x, axes)
	if outer == 0 {
		return nil
	}
	switch dt := x.Type.DType; dt {
	case ir.Float64:
		reduceFloat(code, viewAs[float64](out.Data), viewAs[float64](data), r)
	case ir.Float32, ir.Float16, ir.BFloat16:
		src := toF32(&ir.Literal{Type: ir.TypeOf(dt, len(data)/dt.Size()), Data: data})
		if code == ir.ReduceSum || code == ir.ReduceProd {
			acc := make([]float64, outer)
			reduceWide(code, acc, src, r)
			tmp := ir.NewLiteral(ir.TypeOf(ir.Float64, outer))
			copy(viewAs[float64](tmp.Data), acc)
			return convert(tmp, out)
		}
		buf := make([]float32, outer)
		reduceFloat(code, buf, src, r)
		fromF32(out, buf)
	case ir.Uint8:
		reduceInt(code, viewAs[uint8](out.Data), viewAs[uint8](data), r)
	case ir.Int32:
		reduceInt(code, viewAs[int32](out.Data), viewAs[int32](data), r)
	case ir.Int64:
		reduceInt(code, viewAs[int64](out.Data), viewAs[int64](data), r)
	case ir.Uint32:
		reduceInt(code, viewAs[uint32](out.Data), viewAs[uint32](data), r)
	default:
		return fmt.Errorf("no kernel for %v on %v", code, dt)
	}
	return nil
}

// reduceWide sums or multiplies float32 values in float64.
func reduceWide(code ir.Code, dst []float64, src []float32, r int) {
	for o := range dst {
		c := src[o*r : (o+1)*r]
		if code == ir.ReduceSum {
			var s float64
			for _, v := range c {
				s += float64(v)
			}
			dst[o] = s
		} else {
			p := 1.0
			for _, v := range c {
				p *= float64(v)
			}
			dst[o] = p
		}
	}
}

func reduceFloat[T floatT](code ir.Code, dst, src []T, r int) {
	for o := range dst {
		c := src[o*r : (o+1)*r]
		var acc T
		switch code {
		case ir.ReduceSum:
			for _, v := range c {
				acc += v
			}
		case ir.ReduceProd:
			acc = 1
			for _, v := range c {
				acc *= v
			}
		case ir.ReduceMax:
			acc = T(math.Inf(-1))
			for _, v := range c {
				if v != v {
					acc = v
					break
				}
				if v > acc {
					acc = v
				}
			}
		case ir.ReduceMin:
			acc = T(math.Inf(1))
			for _, v := range c {
				if v != v {
					acc = v
					break
				}
				if v < acc {
					acc = v
				}
			}
		}
		dst[o] = acc
	}
}

// intLimits returns the smallest and largest value of T.
func intLimits[T intT]() (lo, hi T) {
	var z T
	if ^z < 0 { // signed
		hi = T(int64(1)<<(bitWidth[T]()-1) - 1)
		return -hi - 1, hi
	}
	return 0, ^z
}

func reduceInt[T intT](code ir.Code, dst, src []T, r int) {
	lo, hi := intLimits[T]()
	for o := range dst {
		c := src[o*r : (o+1)*r]
		var acc T
		switch code {
		case ir.ReduceSum:
			for _, v := range c {
				acc += v
			}
		case ir.ReduceProd:
			acc = 1
			for _, v := range c {
				acc *= v
			}
		case ir.ReduceMax:
			acc = lo
			for _, v := range c {
				acc = max(acc, v)
			}
		case ir.ReduceMin:
			acc = hi
			for _, v := range c {
				acc = min(acc, v)
			}
		}
		dst[o] = acc
	}
}

func argReduce(code ir.Code, x *ir.Literal, axis int, out *ir.Literal) error {
	data, outer, n := reduceLayout(x, []int{axis})
	if outer == 0 {
		return nil
	}
	idx := make([]int64, outer)
	isMax := code == ir.ArgMax
	switch dt := x.Type.DType; dt {
	case ir.Bool:
		argT(idx, boolBytes(&ir.Literal{Type: ir.TypeOf(dt, len(data)), Data: data}), n, isMax)
	case ir.Uint8:
		argT(idx, viewAs[uint8](data), n, isMax)
	case ir.Int32:
		argT(idx, viewAs[int32](data), n, isMax)
	case ir.Int64:
		argT(idx, viewAs[int64](data), n, isMax)
	case ir.Uint32:
		argT(idx, viewAs[uint32](data), n, isMax)
	case ir.Float16, ir.BFloat16, ir.Float32:
		argT(idx, toF32(&ir.Literal{Type: ir.TypeOf(dt, len(data)/dt.Size()), Data: data}), n, isMax)
	case ir.Float64:
		argT(idx, viewAs[float64](data), n, isMax)
	default:
		return fmt.Errorf("no kernel for %v on %v", code, dt)
	}
	switch out.Type.DType {
	case ir.Int32:
		convertInts(viewAs[int32](out.Data), idx)
	case ir.Int64:
		copy(viewAs[int64](out.Data), idx)
	default:
		return fmt.Errorf("%v: index dtype %v", code, out.Type.DType)
	}
	return nil
}

// argT writes the first index of the extreme of every length-n chunk of src; a
// NaN counts as the extreme, the first NaN wins.
func argT[T orderedT](dst []int64, src []T, n int, isMax bool) {
	for o := range dst {
		c := src[o*n : (o+1)*n]
		best, bv := 0, c[0]
		if bv == bv {
			for j := 1; j < len(c); j++ {
				v := c[j]
				if v != v {
					best = j
					break
				}
				if isMax && v > bv || !isMax && v < bv {
					best, bv = j, v
				}
			}
		}
		dst[o] = int64(best)
	}
}
