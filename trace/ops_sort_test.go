package trace_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// otSortLines is the reference: each line along axis sorted with Go's stable
// sort (NaN last, -0 == +0), returning the values and the source positions.
func otSortLines(x otTensor, axis int) (otTensor, []int) {
	vals := otNew(x.shape...)
	from := make([]int, len(x.data))
	for i := range x.data {
		idx := otUnravel(i, x.shape)
		if idx[axis] != 0 {
			continue
		}
		line := make([]int, x.shape[axis])
		for k := range line {
			idx[axis] = k
			line[k] = otRavel(idx, x.shape)
		}
		order := make([]int, len(line))
		for k := range order {
			order[k] = k
		}
		slices.SortStableFunc(order, func(a, b int) int {
			va, vb := x.data[line[a]], x.data[line[b]]
			switch {
			case math.IsNaN(va) && math.IsNaN(vb):
				return 0
			case math.IsNaN(va):
				return 1
			case math.IsNaN(vb):
				return -1
			case va < vb:
				return -1
			case va > vb:
				return 1
			}
			return 0
		})
		for k, o := range order {
			vals.data[line[k]] = x.data[line[o]]
			from[line[k]] = o
		}
	}
	return vals, from
}

func TestSortAndArgsort(t *testing.T) {
	r := otRand(t)
	few := func(r2 *rand.Rand) float64 {
		switch r2.IntN(12) {
		case 0:
			return math.NaN()
		case 1:
			return math.Inf(-1)
		case 2:
			return math.Copysign(0, -1)
		}
		return float64(r2.IntN(7) - 3)
	}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.BFloat16, ir.Float16, ir.Int32, ir.Uint8} {
		for _, c := range []struct {
			shape []int
			axis  int
		}{{[]int{9}, 0}, {[]int{3, 7}, 1}, {[]int{4, 2, 5}, 0}, {[]int{2, 6, 3}, -2}, {[]int{2, 0}, 1}} {
			gen := otInts(0, 5)
			if dt.IsFloat() {
				gen = few
			}
			x, ref := otMake(r, dt, gen, c.shape...)
			a := c.axis
			if a < 0 {
				a += len(c.shape)
			}
			want, from := otSortLines(ref, a)
			name := otName(dt, c.shape, c.axis)
			otCheck(t, "Sort "+name, trace.Sort(x, c.axis), dt, want, 0)
			idx := otNew(c.shape...)
			for i, f := range from {
				idx.data[i] = float64(f)
			}
			otCheck(t, "Argsort "+name, trace.Argsort(x, c.axis), ir.Int32, idx, 0)
			// Jitted: the same values.
			jit := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Sort(x, c.axis) })
			otCheck(t, "jit Sort "+name, jit(x), dt, want, 0)
		}
	}
}

func TestSortMultiKeys(t *testing.T) {
	r := otRand(t)
	k0, k0ref := otMake(r, ir.Int32, otInts(0, 2), 4, 10)
	k1, k1ref := otMake(r, ir.Float32, otInts(0, 3), 4, 10)
	v, vref := otMake(r, ir.Float64, otNormal, 4, 10)
	res := trace.SortMulti([]*trace.Array{k0, k1, v}, 1, 2)
	// Reference: sort by (k0, k1) with an index tiebreak.
	want := [3]otTensor{otNew(4, 10), otNew(4, 10), otNew(4, 10)}
	for row := range 4 {
		order := make([]int, 10)
		for k := range order {
			order[k] = row*10 + k
		}
		slices.SortStableFunc(order, func(a, b int) int {
			if c := k0ref.data[a] - k0ref.data[b]; c != 0 {
				return int(math.Copysign(1, c))
			}
			if c := k1ref.data[a] - k1ref.data[b]; c != 0 {
				return int(math.Copysign(1, c))
			}
			return 0
		})
		for k, o := range order {
			want[0].data[row*10+k] = k0ref.data[o]
			want[1].data[row*10+k] = k1ref.data[o]
			want[2].data[row*10+k] = vref.data[o]
		}
	}
	for i, dt := range []ir.DType{ir.Int32, ir.Float32, ir.Float64} {
		otCheck(t, fmt.Sprint("SortMulti result ", i), res[i], dt, want[i], 0)
	}
}

func TestSortErrors(t *testing.T) {
	x := otFrom(ir.Float32, []float64{1, 2, 3, 4, 5, 6}, 2, 3)
	otExpectError(t, "Sort", func() { trace.Sort(otFrom(ir.Float32, []float64{1}), 0) }, "scalar")
	otExpectError(t, "Sort", func() { trace.Sort(x, 2) }, "axis 2 out of range")
	otExpectError(t, "SortMulti", func() { trace.SortMulti([]*trace.Array{x, otFrom(ir.Float32, []float64{1, 2}, 2)}, 1, 1) }, "operand 1", "one shape")
	otExpectError(t, "SortMulti", func() { trace.SortMulti([]*trace.Array{x}, 1, 2) }, "numKeys 2")
	otExpectError(t, "SortMulti", func() { trace.SortMulti(nil, 0, 1) }, "no operands")
	err, line := otCatchLine(func() { trace.Argsort(x, -3) })
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("ops_sort_test.go:%d", line)) {
		t.Errorf("Argsort error %v does not name the caller's line %d", err, line)
	}
}
