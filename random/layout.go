package random

import (
	"math"
	"sync/atomic"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// PartitionableEnv names the environment variable that sets the initial bit
// layout: "0" or "false" selects the original (non-partitionable) layout.
const PartitionableEnv = "FERRY_THREEFRY_PARTITIONABLE"

var partitionable atomic.Bool

func init() {
	partitionable.Store(settings.ThreefryPartitionable.Get())
}

// SetPartitionable chooses the Threefry bit layout and returns the previous
// choice, like JAX's jax_threefry_partitionable flag:
//
//   - true (the default, as in JAX since 0.5): element i of a request is the
//     block on the counter pair (i>>32, i&0xffffffff) of its row-major index,
//     bits = y0 ^ y1. Split uses the same counters and keeps (y0, y1) as the
//     new keys. Bits depend on (key, i) only, never on the request's size.
//   - false: JAX's original layout (counters iota(n) split into halves), the
//     default of JAX before 0.5.
//
// The layout is read when a function is traced: jitted functions keep the
// layout they were compiled with. Set it once, before generating.
func SetPartitionable(on bool) (previous bool) { return partitionable.Swap(on) }

// Partitionable reports the current bit layout (see SetPartitionable).
func Partitionable() bool { return partitionable.Load() }

// counters returns the two u32 counter words (hi, lo) of the row-major flat
// index (plus offset) of every element of shape. Requests below 2^32
// elements compute the index in u32 (hi is zero); larger ones in i64.
func counters(shape ir.Shape, offset int) (hi, lo *trace.Array) {
	dt := ir.Uint32
	if offset+shape.Size() > maxCount {
		dt = ir.Int64
	}
	strides := shape.Strides()
	idx := trace.Full(shape, float64(offset), dt)
	for d := range shape {
		if shape[d] != 1 {
			idx = trace.Add(idx, trace.Mul(trace.Iota(dt, shape, d), trace.ScalarAs(float64(strides[d]), dt)))
		}
	}
	if dt == ir.Uint32 {
		return trace.Zeros(shape, ir.Uint32), idx
	}
	hi = trace.Convert(trace.ShiftRightLogical(idx, trace.ScalarAs(32, dt)), ir.Uint32)
	lo = trace.Convert(trace.And(idx, trace.ScalarAs(maxCount, dt)), ir.Uint32)
	return hi, lo
}

// blocks returns the Threefry outputs (y0, y1) of every element of shape in
// the partitionable layout, the element at flat index offset+j using the
// counter pair of that index.
func blocks(op string, key *trace.Array, shape ir.Shape, offset int) (y0, y1 *trace.Array) {
	k0, k1 := keyWords(op, key)
	hi, lo := counters(shape, offset)
	return Block(k0, k1, hi, lo)
}

// roundTo rounds v to the nearest value of float dtype dt (ties to even).
func roundTo(v float64, dt ir.DType) float64 {
	l := ir.NewLiteral(ir.TypeOf(dt))
	l.SetFloat64At(0, v)
	return l.Float64At(0)
}

// nextAfter returns the value of dtype dt next to v (a value of dt) in the
// direction of to, like numpy.nextafter in that dtype.
func nextAfter(v, to float64, dt ir.DType) float64 {
	switch dt {
	case ir.Float64:
		return math.Nextafter(v, to)
	case ir.Float32:
		return float64(math.Nextafter32(float32(v), float32(to)))
	}
	if v == to || math.IsNaN(v) || math.IsNaN(to) {
		return v
	}
	// 16-bit: step the bit pattern of the sign-magnitude encoding.
	l := ir.NewLiteral(ir.TypeOf(dt))
	l.SetFloat64At(0, v)
	bits := uint16(l.Data[0]) | uint16(l.Data[1])<<8
	switch {
	case v == 0:
		bits = 1 // the smallest subnormal, signed below
		if to < 0 {
			bits |= 0x8000
		}
	case (to > v) == (v > 0):
		bits++ // away from zero
	default:
		bits--
	}
	l.Data[0], l.Data[1] = byte(bits), byte(bits>>8)
	return l.Float64At(0)
}
