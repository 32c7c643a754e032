package trace_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

func TestOpsIndex(t *testing.T) {
	r := otRand(t)
	for _, dt := range otShapeDTypes {
		x, xr := otMake(r, dt, otGenFor(dt), 4, 2, 3)
		for _, i := range []int{0, 2, -1, -4} {
			k := (i + 4) % 4
			want := otIndexMap(xr, []int{2, 3}, 0, func(idx []int) []int { return []int{k, idx[0], idx[1]} })
			otCheck(t, otName("Index", dt, i), trace.Index(x, i), dt, want, 0)
		}
		v, vr := otMake(r, dt, otGenFor(dt), 3)
		otCheck(t, otName("Index/1d", dt), trace.Index(v, 1), dt, otTensor{[]int{}, []float64{vr.data[1]}}, 0)
	}
	x, _ := otMake(r, ir.Float32, otNormal, 4, 2)
	otExpectError(t, "Index", func() { trace.Index(x, 4) }, "index 4 out of range for axis 0 of f32[4,2]")
	otExpectError(t, "Index", func() { trace.Index(trace.Scalar(1), 0) }, "cannot index a scalar")
}

func otI32(v int) *trace.Array { return trace.ScalarAs(float64(v), ir.Int32) }

func TestOpsDynamicSlice(t *testing.T) {
	r := otRand(t)
	for _, dt := range []ir.DType{ir.Float32, ir.Int32, ir.Bool} {
		x, xr := otMake(r, dt, otGenFor(dt), 5, 6)
		for _, c := range [][4]int{{0, 0, 2, 3}, {1, 2, 4, 4}, {4, 5, 3, 2}, {-3, 1, 2, 6}, {2, 2, 0, 3}} {
			s0, s1, n0, n1 := c[0], c[1], c[2], c[3]
			c0 := min(max(s0, 0), 5-n0)
			c1 := min(max(s1, 0), 6-n1)
			want := otIndexMap(xr, []int{n0, n1}, 0, func(idx []int) []int { return []int{c0 + idx[0], c1 + idx[1]} })
			got := trace.DynamicSlice(x, []*trace.Array{otI32(s0), trace.ScalarAs(float64(s1), ir.Int64)}, []int{n0, n1})
			otCheck(t, otName("DynamicSlice", dt, c), got, dt, want, 0)

			u, ur := otMake(r, dt, otGenFor(dt), n0, n1)
			want = otNew(5, 6)
			copy(want.data, xr.data)
			for i := range ur.data {
				idx := otUnravel(i, ur.shape)
				want.data[(c0+idx[0])*6+c1+idx[1]] = ur.data[i]
			}
			got = trace.DynamicUpdateSlice(x, u, []*trace.Array{otI32(s0), otI32(s1)})
			otCheck(t, otName("DynamicUpdateSlice", dt, c), got, dt, want, 0)
		}
	}
	x, _ := otMake(r, ir.Float32, otNormal, 5, 6)
	otExpectError(t, "DynamicSlice", func() { trace.DynamicSlice(x, []*trace.Array{otI32(0)}, []int{1, 1}) }, "1 start indices for f32[5,6]")
	otExpectError(t, "DynamicSlice", func() { trace.DynamicSlice(x, []*trace.Array{otI32(0), trace.Scalar(1)}, []int{1, 1}) }, "start index 1 must be an integer scalar")
	otExpectError(t, "DynamicSlice", func() { trace.DynamicSlice(x, []*trace.Array{otI32(0), otI32(0)}, []int{6, 1}) }, "size 6 on axis 0")
	u := otFrom(ir.Int32, []float64{1}, 1, 1)
	otExpectError(t, "DynamicUpdateSlice", func() { trace.DynamicUpdateSlice(x, u, []*trace.Array{otI32(0), otI32(0)}) }, "must have the dtype of f32[5,6]")
}

func TestOpsTakeScatterAdd(t *testing.T) {
	r := otRand(t)
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Int32, ir.BFloat16} {
		x, xr := otMake(r, dt, otGenFor(dt), 4, 5, 3)
		for _, axis := range []int{0, 1, -1} {
			a := (axis + 3) % 3
			n := xr.shape[a]
			for _, idxShape := range [][]int{{}, {6}, {2, 3}, {0}} {
				for _, idt := range []ir.DType{ir.Int32, ir.Int64, ir.Uint32} {
					gen := otInts(-n-2, n+2) // negative wrap and out-of-range clamp
					if idt.IsUnsigned() {
						gen = otInts(0, n+2)
					}
					ind, indr := otMake(r, idt, gen, idxShape...)
					// Take: clamped, negatives wrap once.
					fix := func(i float64) int {
						k := int(i)
						if k < 0 {
							k += n
						}
						return min(max(k, 0), n-1)
					}
					shape := append(append(append([]int{}, xr.shape[:a]...), idxShape...), xr.shape[a+1:]...)
					want := otIndexMap(xr, shape, 0, func(idx []int) []int {
						src := append([]int{}, idx[:a]...)
						src = append(src, fix(indr.at(idx[a:a+len(idxShape)]...)))
						return append(src, idx[a+len(idxShape):]...)
					})
					name := otName(dt, axis, ir.Shape(idxShape), idt)
					otCheck(t, "Take/"+name, trace.Take(x, ind, axis), dt, want, 0)

					// ScatterAdd: updates of the gathered shape, out-of-range dropped.
					upd, updr := otMake(r, dt, otGenFor(dt), shape...)
					sw := otNew(xr.shape...)
					copy(sw.data, xr.data)
					for i := range updr.data {
						idx := otUnravel(i, shape)
						k := int(indr.at(idx[a : a+len(idxShape)]...))
						if k < 0 {
							k += n
						}
						if k < 0 || k >= n {
							continue
						}
						dst := append(append(append([]int{}, idx[:a]...), k), idx[a+len(idxShape):]...)
						sw.data[otRavel(dst, sw.shape)] += updr.data[i]
					}
					tol := otTol(dt)
					if dt == ir.BFloat16 {
						tol = 0.05 // several bf16 roundings per element
					}
					otCheck(t, "ScatterAdd/"+name, trace.ScatterAdd(x, ind, upd, axis), dt, sw, tol)
				}
			}
		}
	}
	// Updates broadcast, weak scalars convert.
	x := otFrom(ir.Float32, []float64{0, 0, 0, 0}, 2, 2)
	ind := trace.Const([]int32{1, 1, 0})
	got := trace.ScatterAdd(x, ind, trace.Scalar(1), 1)
	otCheck(t, "ScatterAdd/broadcast", got, ir.Float32, otTensor{[]int{2, 2}, []float64{1, 2, 1, 2}}, 0)
	otExpectError(t, "Take", func() { trace.Take(x, otFrom(ir.Float32, []float64{0}, 1), 0) }, "indices must be integers")
	otExpectError(t, "Take", func() { trace.Take(x, ind, 2) }, "axis 2 out of range")
	otExpectError(t, "ScatterAdd", func() { trace.ScatterAdd(x, ind, otFrom(ir.Float32, make([]float64, 4), 4), 1) }, "do not broadcast to [2,3]")
}

func TestOpsOneHot(t *testing.T) {
	r := otRand(t)
	for _, dt := range []ir.DType{ir.Float32, ir.Int32, ir.Bool, ir.BFloat16} {
		for _, s := range [][]int{{}, {5}, {2, 3}, {0}} {
			ind, indr := otMake(r, ir.Int32, otInts(-1, 4), s...)
			shape := append(append([]int{}, s...), 4)
			want := otNew(shape...)
			for i := range want.data {
				idx := otUnravel(i, shape)
				if int(indr.at(idx[:len(s)]...)) == idx[len(s)] {
					want.data[i] = 1
				}
			}
			otCheck(t, otName("OneHot", dt, ir.Shape(s)), trace.OneHot(ind, 4, dt), dt, want, 0)
		}
	}
	otExpectError(t, "OneHot", func() { trace.OneHot(trace.Scalar(1), 3, ir.Float32) }, "indices must be integers")
}

func TestOpsIndexTraced(t *testing.T) {
	ops, out := otTrace(func(a ...*trace.Array) *trace.Array {
		emb := trace.Take(a[0], a[1], 0)
		i := trace.Reshape(trace.Slice(a[1], []int{0}, []int{1}, nil))
		blk := trace.DynamicSlice(emb, []*trace.Array{i, otI32(0)}, []int{2, 8})
		return trace.ScatterAdd(a[0], a[1], trace.Add(emb, trace.Sum(blk)), 0)
	}, ir.TypeOf(ir.Float32, 10, 8), ir.TypeOf(ir.Int32, 5))
	codes := otCodes(ops)
	if codes[ir.Gather] != 1 || codes[ir.ScatterAdd] != 1 || codes[ir.DynamicSlice] != 1 {
		t.Errorf("recorded %v", codes)
	}
	if !out.Type().Equal(ir.TypeOf(ir.Float32, 10, 8)) {
		t.Errorf("result %v", out.Type())
	}
}

// TestOpsJitSample runs a function using many ops eagerly and jitted: the
// recorded version must compute the same values.
func TestOpsJitSample(t *testing.T) {
	r := otRand(t)
	x, _ := otMake(r, ir.Float32, otNormal, 6, 4)
	idx, _ := otMake(r, ir.Int32, otInts(-6, 5), 3)
	w, _ := otMake(r, ir.BFloat16, otNormal, 4, 5)
	g := func(x, idx, w *trace.Array) *trace.Array {
		e := trace.Take(x, idx, 0)                         // [3,4]
		h := trace.MatMul(e, trace.Convert(w, ir.Float32)) // [3,5]
		h = trace.Concatenate(1, h, trace.Einsum("ij,kj->ik", e, e))
		h = trace.Pad(h, trace.Scalar(1), []int{1, 0}, []int{0, 1}, nil) // [4,9]
		z := trace.Zeros(ir.Shape{2, 2}, ir.Float32)
		h = trace.DynamicUpdateSlice(h, z, []*trace.Array{otI32(1), trace.Reshape(trace.Slice(idx, []int{0}, []int{1}, nil))})
		oh := trace.OneHot(idx, 9, ir.Float32) // [3,9]
		s := trace.Add(trace.LogSumExp(h, 0), trace.Sum(oh, 0))
		return trace.Mul(trace.Softplus(s), trace.Mean(trace.ScatterAdd(x, idx, trace.Scalar(1), 0)))
	}
	eager := g(x, idx, w)
	jitted := rt.Jit(g)(x, idx, w)
	otCheck(t, "jit sample", jitted, ir.Float32, otTensor{[]int{9}, eager.Float64s()}, 1e-6)
}
