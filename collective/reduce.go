package collective

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/ferryml/ferry/collective/internal/bufs"
	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/ir"
)

// kernel reduces tiles of elements. The accumulator has accSize bytes per
// element: the element type itself, or float32 for f16 and bf16.
type kernel struct {
	accSize int
	load    func(acc, x []byte)    // acc = widen(x)
	fold    func(acc, x []byte)    // acc = acc op widen(x)
	fold2   func(acc, x, y []byte) // acc = widen(x) op widen(y)
	store   func(dst, acc []byte)
}

// number is every dtype reduced in its own type.
type number interface {
	~uint8 | ~int32 | ~int64 | ~uint32 | ~float32 | ~float64
}

func view[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

func sumInto[T number](acc, x []T) {
	x = x[:len(acc)]
	for i, v := range x {
		acc[i] += v
	}
}

func prodInto[T number](acc, x []T) {
	x = x[:len(acc)]
	for i, v := range x {
		acc[i] *= v
	}
}

// maxInto keeps NaN: once acc is NaN no comparison is true, and a NaN x wins.
func maxInto[T number](acc, x []T) {
	x = x[:len(acc)]
	for i, v := range x {
		if v > acc[i] || v != v {
			acc[i] = v
		}
	}
}

func minInto[T number](acc, x []T) {
	x = x[:len(acc)]
	for i, v := range x {
		if v < acc[i] || v != v {
			acc[i] = v
		}
	}
}

func sum2[T number](acc, x, y []T) {
	x, y = x[:len(acc)], y[:len(acc)]
	for i := range acc {
		acc[i] = x[i] + y[i]
	}
}

func prod2[T number](acc, x, y []T) {
	x, y = x[:len(acc)], y[:len(acc)]
	for i := range acc {
		acc[i] = x[i] * y[i]
	}
}

func max2[T number](acc, x, y []T) {
	x, y = x[:len(acc)], y[:len(acc)]
	for i := range acc {
		a, v := x[i], y[i]
		if v > a || v != v {
			a = v
		}
		acc[i] = a
	}
}

func min2[T number](acc, x, y []T) {
	x, y = x[:len(acc)], y[:len(acc)]
	for i := range acc {
		a, v := x[i], y[i]
		if v < a || v != v {
			a = v
		}
		acc[i] = a
	}
}

func orInto(acc, x []byte) {
	x = x[:len(acc)]
	for i, v := range x {
		if v != 0 || acc[i] != 0 {
			acc[i] = 1
		} else {
			acc[i] = 0
		}
	}
}

func andInto(acc, x []byte) {
	x = x[:len(acc)]
	for i, v := range x {
		if v != 0 && acc[i] != 0 {
			acc[i] = 1
		} else {
			acc[i] = 0
		}
	}
}

func loadBool(acc, x []byte) {
	x = x[:len(acc)]
	for i, v := range x {
		if v != 0 {
			acc[i] = 1
		} else {
			acc[i] = 0
		}
	}
}

func copyBytes(dst, src []byte) { copy(dst, src) }

// typedKernel reduces dtype T in T.
func typedKernel[T number](op Op) kernel {
	var z T
	k := kernel{accSize: int(unsafe.Sizeof(z)), load: copyBytes, store: copyBytes}
	var f func(acc, x []T)
	var f2 func(acc, x, y []T)
	switch op {
	case Sum:
		f, f2 = sumInto[T], sum2[T]
	case Prod:
		f, f2 = prodInto[T], prod2[T]
	case Max:
		f, f2 = maxInto[T], max2[T]
	case Min:
		f, f2 = minInto[T], min2[T]
	}
	if _, ok := any(z).(float32); ok {
		// The vector kernels: the same IEEE operations, and Max/Min(dst, a, b)
		// pick a when a > b (resp. <) or a is NaN, so the new value goes first.
		v := map[Op]func(dst, a, b []float32){Sum: vmath.Add, Prod: vmath.Mul, Max: vmath.Max, Min: vmath.Min}[op]
		k.fold = func(acc, x []byte) { a := view[float32](acc); v(a, view[float32](x)[:len(a)], a) }
		k.fold2 = func(acc, x, y []byte) {
			a := view[float32](acc)
			v(a, view[float32](y)[:len(a)], view[float32](x)[:len(a)])
		}
		return k
	}
	k.fold = func(acc, x []byte) { f(view[T](acc), view[T](x)) }
	k.fold2 = func(acc, x, y []byte) { f2(view[T](acc), view[T](x), view[T](y)) }
	return k
}

func bf16Widen(acc []float32, x []uint16) {
	x = x[:len(acc)]
	for i, v := range x {
		acc[i] = math.Float32frombits(uint32(v) << 16)
	}
}

func f16Widen(acc []float32, x []uint16) {
	x = x[:len(acc)]
	for i, v := range x {
		acc[i] = ir.F16(v).Float32()
	}
}

// halfKernel reduces f16 or bf16 in float32 and rounds once, to nearest even,
// when storing: a sum of n halves is the float32 sum (in rank order) rounded.
func halfKernel(dt ir.DType, op Op) kernel {
	widen, round := bf16Widen, func(x float32) uint16 { return uint16(ir.BF16FromFloat32(x)) }
	if dt == ir.Float16 {
		widen, round = f16Widen, func(x float32) uint16 { return uint16(ir.F16FromFloat32(x)) }
	}
	f32 := typedKernel[float32](op).fold
	k := kernel{
		accSize: 4,
		load:    func(acc, x []byte) { widen(view[float32](acc), view[uint16](x)) },
		fold: func(acc, x []byte) {
			// Widen in chunks on the stack, then fold in float32.
			a, xs := view[float32](acc), view[uint16](x)
			var buf [256]float32
			for len(a) > 0 {
				n := min(len(a), len(buf))
				widen(buf[:n], xs[:n])
				f32(f32bytes(a[:n]), f32bytes(buf[:n]))
				a, xs = a[n:], xs[n:]
			}
		},
		store: func(dst, acc []byte) {
			d, a := view[uint16](dst), view[float32](acc)
			d = d[:len(a)]
			for i, v := range a {
				d[i] = round(v)
			}
		},
	}
	k.fold2 = func(acc, x, y []byte) { k.load(acc, x); k.fold(acc, y) }
	return k
}

func f32bytes(a []float32) []byte {
	if len(a) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 4*len(a))
}

// kernels holds every (dtype, op) kernel, built once.
var kernels = func() (t [16][Min + 1]kernel) {
	for _, dt := range ir.AllDTypes {
		for op := Sum; op <= Min; op++ {
			t[dt][op], _ = makeKernel(dt, op)
		}
	}
	return t
}()

// kernelFor returns the kernel of (dt, op); ok is false when dt cannot be
// reduced with op.
func kernelFor(dt ir.DType, op Op) (k kernel, ok bool) {
	if int(dt) >= len(kernels) || !op.Valid() {
		return kernel{}, false
	}
	k = kernels[dt][op]
	return k, k.fold != nil
}

func makeKernel(dt ir.DType, op Op) (k kernel, ok bool) {
	if !op.Valid() {
		return kernel{}, false
	}
	switch dt {
	case ir.Bool:
		k := kernel{accSize: 1, load: loadBool, store: copyBytes, fold: orInto}
		if op == Prod || op == Min {
			k.fold = andInto
		}
		k.fold2 = func(acc, x, y []byte) { k.load(acc, x); k.fold(acc, y) }
		return k, true
	case ir.Uint8:
		return typedKernel[uint8](op), true
	case ir.Int32:
		return typedKernel[int32](op), true
	case ir.Int64:
		return typedKernel[int64](op), true
	case ir.Uint32:
		return typedKernel[uint32](op), true
	case ir.Float32:
		return typedKernel[float32](op), true
	case ir.Float64:
		return typedKernel[float64](op), true
	case ir.Float16, ir.BFloat16:
		return halfKernel(dt, op), true
	}
	return kernel{}, false
}

// Reducible reports whether dt can be reduced with op.
func Reducible(op Op, dt ir.DType) bool {
	_, ok := kernelFor(dt, op)
	return ok
}

// Reduce writes the elementwise reduction of srcs with op to dst in the order
// srcs[0], srcs[1], ..., exactly as [Local] reduces the buffers of its ranks
// (f16 and bf16 accumulated in float32 and rounded once; NaN propagated by Max
// and Min; bool normalized to 0 and 1), so an engine that gathers the ranks'
// buffers and reduces them with Reduce gets Local's bits. Every src and dst
// hold the same whole number of aligned dt elements; dst may be one of srcs.
func Reduce(op Op, dt ir.DType, dst []byte, srcs ...[]byte) error {
	k, ok := kernelFor(dt, op)
	if !ok {
		return fmt.Errorf("%w: Reduce: cannot reduce dtype %v with %v", ErrInvalid, dt, op)
	}
	if len(srcs) == 0 {
		return fmt.Errorf("%w: Reduce: no buffers to reduce", ErrInvalid)
	}
	if err := bufs.CheckBuf("dst", dt, dst); err != nil {
		return fmt.Errorf("%w: Reduce: %w", ErrInvalid, err)
	}
	for i, s := range srcs {
		if len(s) != len(dst) {
			return fmt.Errorf("%w: Reduce: buffer %d has %d bytes, want dst's %d", ErrInvalid, i, len(s), len(dst))
		}
		if err := bufs.CheckBuf(fmt.Sprintf("buffer %d", i), dt, s); err != nil {
			return fmt.Errorf("%w: Reduce: %w", ErrInvalid, err)
		}
	}
	esz := dt.Size()
	w := make([]uint64, tile) // 8-byte aligned for every accumulator type
	acc := unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 8*tile)
	n := len(dst) / esz
	for a := 0; a < n; a += tile {
		b := min(a+tile, n)
		x := acc[:(b-a)*k.accSize]
		if len(srcs) == 1 {
			k.load(x, srcs[0][a*esz:b*esz])
		} else {
			k.fold2(x, srcs[0][a*esz:b*esz], srcs[1][a*esz:b*esz])
		}
		for j := 2; j < len(srcs); j++ {
			k.fold(x, srcs[j][a*esz:b*esz])
		}
		k.store(dst[a*esz:b*esz], x)
	}
	return nil
}
