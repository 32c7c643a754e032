package eval

import (
	"sync"
	"unsafe"

	"github.com/ferryml/ferry/ir"
)

// word is the set of unsigned types used to move elements of 1, 2, 4 or 8 bytes
// without looking at their values.
type word interface {
	~uint8 | ~uint16 | ~uint32 | ~uint64
}

// viewAs reinterprets b as a []T sharing its memory. b must be aligned for T
// (literals made by ir.NewLiteral are 8-byte aligned).
func viewAs[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return []T{}
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// aligned reports whether b starts on an 8-byte boundary (or is empty).
func aligned(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 == 0
}

// newLit allocates a zero literal of type t.
func newLit(t ir.Type) *ir.Literal { return ir.NewLiteral(t) }

// f16Table maps every binary16 bit pattern to its exact float32 value.
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = ir.F16(i).Float32()
	}
	return &t
})

// widenF16 writes the exact float32 value of every element of src to dst.
func widenF16(dst []float32, src []ir.F16) {
	t := f16Table()
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = t[h]
	}
}

// widenBF16 writes the exact float32 value of every element of src to dst.
func widenBF16(dst []float32, src []ir.BF16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = h.Float32()
	}
}

// narrowF16 rounds every element of src to binary16 (nearest, ties to even).
func narrowF16(dst []ir.F16, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = ir.F16FromFloat32(v)
	}
}

// narrowBF16 rounds every element of src to bfloat16 (nearest, ties to even).
func narrowBF16(dst []ir.BF16, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = ir.BF16FromFloat32(v)
	}
}

// isHalf reports whether d is one of the 16-bit float dtypes computed in float32.
func isHalf(d ir.DType) bool { return d == ir.Float16 || d == ir.BFloat16 }

// toF32 returns the elements of a float literal (f16, bf16 or f32) as float32.
// For f32 it returns a view of l's memory, which the caller must not modify.
func toF32(l *ir.Literal) []float32 {
	switch l.Type.DType {
	case ir.Float32:
		return viewAs[float32](l.Data)
	case ir.Float16:
		src := viewAs[ir.F16](l.Data)
		out := make([]float32, len(src))
		widenF16(out, src)
		return out
	case ir.BFloat16:
		src := viewAs[ir.BF16](l.Data)
		out := make([]float32, len(src))
		widenBF16(out, src)
		return out
	}
	panic("eval: toF32 on " + l.Type.DType.String())
}

// fromF32 stores buf into the float literal l (f16, bf16 or f32), rounding to
// nearest even.
func fromF32(l *ir.Literal, buf []float32) {
	switch l.Type.DType {
	case ir.Float32:
		copy(viewAs[float32](l.Data), buf)
	case ir.Float16:
		narrowF16(viewAs[ir.F16](l.Data), buf)
	case ir.BFloat16:
		narrowBF16(viewAs[ir.BF16](l.Data), buf)
	default:
		panic("eval: fromF32 on " + l.Type.DType.String())
	}
}

// boolBytes returns the elements of a bool literal normalised to 0 or 1.
func boolBytes(l *ir.Literal) []uint8 {
	return boolBytesInto(make([]uint8, len(l.Data)), l)
}

// boolBytesInto writes the elements of a bool literal normalised to 0 or 1
// into out (len(out) == len(l.Data)) and returns it.
func boolBytesInto(out []uint8, l *ir.Literal) []uint8 {
	for i, b := range l.Data {
		out[i] = b2u(b != 0)
	}
	return out
}

// Scratch buffers for the elementwise kernels. Executors run them over small
// blocks many times; pooling their temporaries (widened f16/bf16 values,
// normalised bools) keeps that free of heap allocation. Larger requests are
// plain allocations.
const poolMax = 1 << 14

type scratch[T any] struct{ s []T }

var (
	f32Scratch  = sync.Pool{New: func() any { return &scratch[float32]{s: make([]float32, poolMax)} }}
	boolScratch = sync.Pool{New: func() any { return &scratch[uint8]{s: make([]uint8, poolMax)} }}
)

// getScratch returns n elements of scratch from pool (or fresh memory when n
// is large; then the *scratch is nil). Give it back with putScratch.
func getScratch[T any](pool *sync.Pool, n int) (*scratch[T], []T) {
	if n > poolMax {
		return nil, make([]T, n)
	}
	sc := pool.Get().(*scratch[T])
	return sc, sc.s[:n]
}

func putScratch[T any](pool *sync.Pool, sc *scratch[T]) {
	if sc != nil {
		pool.Put(sc)
	}
}

// toF32Scratch is toF32 with the widened copy of f16/bf16 in pooled scratch
// (sc, to give back with putScratch; nil for f32, which is a view).
func toF32Scratch(l *ir.Literal) (sc *scratch[float32], v []float32) {
	switch l.Type.DType {
	case ir.Float16:
		src := viewAs[ir.F16](l.Data)
		sc, v = getScratch[float32](&f32Scratch, len(src))
		widenF16(v, src)
		return sc, v
	case ir.BFloat16:
		src := viewAs[ir.BF16](l.Data)
		sc, v = getScratch[float32](&f32Scratch, len(src))
		widenBF16(v, src)
		return sc, v
	}
	return nil, toF32(l)
}

// boolScratchOf is boolBytes into pooled scratch.
func boolScratchOf(l *ir.Literal) (*scratch[uint8], []uint8) {
	sc, v := getScratch[uint8](&boolScratch, len(l.Data))
	return sc, boolBytesInto(v, l)
}

// intsOf returns the elements of an integer literal as int64 (unsigned values
// are zero-extended).
func intsOf(l *ir.Literal) []int64 {
	switch l.Type.DType {
	case ir.Uint8:
		return widenInts(viewAs[uint8](l.Data))
	case ir.Int32:
		return widenInts(viewAs[int32](l.Data))
	case ir.Int64:
		return append([]int64(nil), viewAs[int64](l.Data)...)
	case ir.Uint32:
		return widenInts(viewAs[uint32](l.Data))
	}
	panic("eval: integer indices expected, got " + l.Type.DType.String())
}

func widenInts[T intT](src []T) []int64 {
	out := make([]int64, len(src))
	for i, v := range src {
		out[i] = int64(v)
	}
	return out
}

// scalarInt returns the value of an integer scalar literal.
func scalarInt(l *ir.Literal) int64 { return intsOf(l)[0] }

// simplify drops size-1 dimensions and merges adjacent dimensions that are
// contiguous in both layouts. It returns new slices.
func simplify(shape, dst, src []int) ([]int, []int, []int) {
	var s, d, r []int
	for i, n := range shape {
		if n == 1 {
			continue
		}
		if k := len(s) - 1; k >= 0 && d[k] == dst[i]*n && r[k] == src[i]*n {
			s[k] *= n
			d[k] = dst[i]
			r[k] = src[i]
			continue
		}
		s = append(s, n)
		d = append(d, dst[i])
		r = append(r, src[i])
	}
	return s, d, r
}

// copyStrided copies an array of the given shape of esz-byte elements: the
// element at multi-index x goes from src[soff+Σx[i]*sst[i]] to
// dst[doff+Σx[i]*dst[i]] (offsets and strides in elements).
func copyStrided(esz int, dst []byte, doff int, dstr []int, src []byte, soff int, sstr []int, shape []int) {
	for _, n := range shape {
		if n == 0 {
			return
		}
	}
	shape, dstr, sstr = simplify(shape, dstr, sstr)
	switch esz {
	case 1:
		stridedT(viewAs[uint8](dst), doff, dstr, viewAs[uint8](src), soff, sstr, shape)
	case 2:
		stridedT(viewAs[uint16](dst), doff, dstr, viewAs[uint16](src), soff, sstr, shape)
	case 4:
		stridedT(viewAs[uint32](dst), doff, dstr, viewAs[uint32](src), soff, sstr, shape)
	case 8:
		stridedT(viewAs[uint64](dst), doff, dstr, viewAs[uint64](src), soff, sstr, shape)
	default:
		panic("eval: bad element size")
	}
}

func stridedT[T word](dst []T, doff int, dstr []int, src []T, soff int, sstr []int, shape []int) {
	n := len(shape)
	if n == 0 {
		dst[doff] = src[soff]
		return
	}
	inner, ds, ss := shape[n-1], dstr[n-1], sstr[n-1]
	idx := make([]int, n-1)
	d, s := doff, soff
	for {
		switch {
		case ds == 1 && ss == 1:
			copy(dst[d:d+inner], src[s:s+inner])
		case ds == 1 && ss == 0:
			v := src[s]
			row := dst[d : d+inner]
			for j := range row {
				row[j] = v
			}
		default:
			for j := 0; j < inner; j++ {
				dst[d+j*ds] = src[s+j*ss]
			}
		}
		k := n - 2
		for ; k >= 0; k-- {
			idx[k]++
			d += dstr[k]
			s += sstr[k]
			if idx[k] < shape[k] {
				break
			}
			d -= dstr[k] * shape[k]
			s -= sstr[k] * shape[k]
			idx[k] = 0
		}
		if k < 0 {
			return
		}
	}
}

// fillElem sets every esz-byte element of dst to the element val.
func fillElem(dst []byte, val []byte) {
	switch len(val) {
	case 1:
		fillT(viewAs[uint8](dst), val[0])
	case 2:
		fillT(viewAs[uint16](dst), viewAs[uint16](val)[0])
	case 4:
		fillT(viewAs[uint32](dst), viewAs[uint32](val)[0])
	case 8:
		fillT(viewAs[uint64](dst), viewAs[uint64](val)[0])
	default:
		panic("eval: bad element size")
	}
}

func fillT[T word](dst []T, v T) {
	for i := range dst {
		dst[i] = v
	}
}

// permute returns a copy of l's elements transposed so that result dim i is
// operand dim perm[i], and the permuted shape. When perm is the identity it
// returns l's data itself (not a copy).
func permute(l *ir.Literal, perm []int) ([]byte, []int) {
	shape := l.Type.Shape
	out := make([]int, len(perm))
	ident := true
	for i, p := range perm {
		out[i] = shape[p]
		if p != i {
			ident = false
		}
	}
	if ident {
		return l.Data, out
	}
	st := ir.Shape(shape).Strides()
	sst := make([]int, len(perm))
	for i, p := range perm {
		sst[i] = st[p]
	}
	dst := ir.NewLiteral(ir.Type{DType: l.Type.DType, Shape: out}).Data
	copyStrided(l.Type.DType.Size(), dst, 0, ir.Shape(out).Strides(), l.Data, 0, sst, out)
	return dst, out
}
