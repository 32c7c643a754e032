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

// TrailingReduce reports whether the reduced axes of shape come after
// every kept axis, size-1 axes aside: each output then sums a contiguous
// run of the operand. Such f32, f16 and bf16 sums add the run in LaneSum's
// order; other float sums (f64 ones always: the reference's sequential
// float64 order, which cancellation tests pin down) add each output's
// elements one after the other in row-major order of the reduced axes.
func TrailingReduce(shape []int, axes []int) bool {
	lastKept, firstRed := -1, len(shape)
	for d, n := range shape {
		if n == 1 {
			continue
		}
		if slices.Contains(axes, d) {
			firstRed = min(firstRed, d)
		} else {
			lastKept = d
		}
	}
	return lastKept < firstRed
}

// LaneSum is the running sum of one output of an f32, f16 or bf16
// reduce_sum over trailing axes (see TrailingReduce): element q of the output's run goes
// into lane q mod 8, each lane a float64 sum in order of q, and Sum adds
// the lanes pairwise, ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). Eight
// independent sums run at the adder's throughput instead of its latency;
// float64 lanes keep f32, f16 and bf16 sums within an ulp or so of the
// exact sum whatever the length. The zero value is an empty sum.
type LaneSum struct {
	l [8]float64
	n int
}

// AddF32 adds the next len(v) elements of the run.
func (s *LaneSum) AddF32(v []float32) { laneAdd(s, v) }

// Sum returns the sum of the elements added so far.
func (s *LaneSum) Sum() float64 {
	l := &s.l
	return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

func laneAdd(s *LaneSum, v []float32) {
	i := 0
	for ; i < len(v) && s.n%8 != 0; i++ {
		s.l[s.n%8] += float64(v[i])
		s.n++
	}
	l0, l1, l2, l3, l4, l5, l6, l7 := s.l[0], s.l[1], s.l[2], s.l[3], s.l[4], s.l[5], s.l[6], s.l[7]
	j := i
	for ; j+8 <= len(v); j += 8 {
		w := v[j : j+8 : j+8]
		l0 += float64(w[0])
		l1 += float64(w[1])
		l2 += float64(w[2])
		l3 += float64(w[3])
		l4 += float64(w[4])
		l5 += float64(w[5])
		l6 += float64(w[6])
		l7 += float64(w[7])
	}
	s.l = [8]float64{l0, l1, l2, l3, l4, l5, l6, l7}
	s.n += j - i
	for ; j < len(v); j++ {
		s.l[s.n%8] += float64(v[j])
		s.n++
	}
}

// sumStrided adds the elements of src into the outputs their kept indices
// name, one after the other in row-major order of src (so each output's
// elements in row-major order of the reduced axes), without moving them.
func sumStrided[T float32 | float64](dst []float64, src []T, shape []int, axes []int) {
	out := ir.RemoveAxes(shape, axes).Strides()
	ostr := make([]int, len(shape))
	k := 0
	for d := range shape {
		if !slices.Contains(axes, d) {
			ostr[d] = out[k]
			k++
		}
	}
	r := len(shape)
	idx := make([]int, r)
	o := 0
	inner, ist := shape[r-1], ostr[r-1]
	for i := 0; i < len(src); i += inner {
		row := src[i : i+inner]
		if ist == 0 {
			acc := dst[o]
			for _, v := range row {
				acc += float64(v)
			}
			dst[o] = acc
		} else {
			d := dst[o : o+(inner-1)*ist+1]
			for t, v := range row {
				d[t*ist] += float64(v)
			}
		}
		for d := r - 2; d >= 0; d-- {
			idx[d]++
			o += ostr[d]
			if idx[d] < shape[d] {
				break
			}
			o -= idx[d] * ostr[d]
			idx[d] = 0
		}
	}
}

func reduce(code ir.Code, x *ir.Literal, axes []int, out *ir.Literal) error {
	dt := x.Type.DType
	if code == ir.ReduceSum && (dt == ir.Float32 || dt == ir.Float64) && x.Type.Rank() > 0 && !TrailingReduce(x.Type.Shape, axes) {
		// Sum in place, in row-major order: no transposed copy.
		if out.Type.Size() == 0 || x.Type.Size() == 0 {
			clear(out.Data)
			return nil
		}
		acc := make([]float64, out.Type.Size())
		if dt == ir.Float32 {
			sumStrided(acc, viewAs[float32](x.Data), x.Type.Shape, axes)
			tmp := ir.NewLiteral(ir.TypeOf(ir.Float64, len(acc)))
			copy(viewAs[float64](tmp.Data), acc)
			return convert(tmp, out)
		}
		sumStrided(acc, viewAs[float64](x.Data), x.Type.Shape, axes)
		copy(viewAs[float64](out.Data), acc)
		return nil
	}
	data, outer, r := reduceLayout(x, axes)
	if outer == 0 {
		return nil
	}
	trailing := TrailingReduce(x.Type.Shape, axes)
	switch dt {
	case ir.Float64:
		reduceFloat(code, viewAs[float64](out.Data), viewAs[float64](data), r)
	case ir.Float32, ir.Float16, ir.BFloat16:
		src := toF32(&ir.Literal{Type: ir.TypeOf(dt, len(data)/dt.Size()), Data: data})
		if code == ir.ReduceSum || code == ir.ReduceProd {
			acc := make([]float64, outer)
			if code == ir.ReduceSum && trailing {
				sumLanes(acc, src, r)
			} else {
				reduceWide(code, acc, src, r)
			}
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

// sumLanes sums each run of r elements of src into dst in LaneSum's order.
func sumLanes(dst []float64, src []float32, r int) {
	for o := range dst {
		var s LaneSum
		laneAdd(&s, src[o*r:(o+1)*r])
		dst[o] = s.Sum()
	}
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
