package checkpoint

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/ferryml/ferry/ir"
)

func isFloat(d ir.DType) bool {
	return d == ir.Float32 || d == ir.Float64 || d == ir.Float16 || d == ir.BFloat16
}

func isInt(d ir.DType) bool {
	return d == ir.Int32 || d == ir.Int64 || d == ir.Uint32 || d == ir.Uint8
}

// checkConvert reports whether a tensor of dtype src can be read as dt.
func checkConvert(src, dt ir.DType) error {
	switch {
	case src == dt, isFloat(src) && isFloat(dt), isInt(src) && isInt(dt):
		return nil
	}
	return fmt.Errorf("cannot convert %v to %v (floats convert among floats, integers among integers)", src, dt)
}

// convertElems converts the little-endian elements b of dtype src into dst
// as dtype dt; floats round to nearest even, integers out of dt's range are
// an error.
func convertElems(dt ir.DType, dst []byte, src ir.DType, b []byte) error {
	if src == dt {
		copy(dst, b)
		return nil
	}
	le := binary.LittleEndian
	n := len(b) / src.Size()
	switch {
	case isFloat(src):
		if src == ir.Float64 || dt == ir.Float64 {
			for i := range n {
				putFloat64(dt, dst, i, getFloat64(src, b, i))
			}
			return nil
		}
		for i := range n {
			var f float32
			switch src {
			case ir.Float32:
				f = math.Float32frombits(le.Uint32(b[4*i:]))
			case ir.Float16:
				f = ir.F16(le.Uint16(b[2*i:])).Float32()
			case ir.BFloat16:
				f = ir.BF16(le.Uint16(b[2*i:])).Float32()
			}
			switch dt {
			case ir.Float32:
				le.PutUint32(dst[4*i:], math.Float32bits(f))
			case ir.Float16:
				le.PutUint16(dst[2*i:], uint16(ir.F16FromFloat32(f)))
			case ir.BFloat16:
				le.PutUint16(dst[2*i:], uint16(ir.BF16FromFloat32(f)))
			}
		}
		return nil
	default:
		lo, hi := intRange(dt)
		for i := range n {
			var v int64
			switch src {
			case ir.Int64:
				v = int64(le.Uint64(b[8*i:]))
			case ir.Int32:
				v = int64(int32(le.Uint32(b[4*i:])))
			case ir.Uint32:
				v = int64(le.Uint32(b[4*i:]))
			case ir.Uint8:
				v = int64(b[i])
			}
			if v < lo || v > hi {
				return fmt.Errorf("element %d, %d, is out of the range of %v", i, v, dt)
			}
			switch dt {
			case ir.Int64:
				le.PutUint64(dst[8*i:], uint64(v))
			case ir.Int32, ir.Uint32:
				le.PutUint32(dst[4*i:], uint32(v))
			case ir.Uint8:
				dst[i] = byte(v)
			}
		}
		return nil
	}
}

func intRange(d ir.DType) (lo, hi int64) {
	switch d {
	case ir.Int32:
		return math.MinInt32, math.MaxInt32
	case ir.Uint32:
		return 0, math.MaxUint32
	case ir.Uint8:
		return 0, math.MaxUint8
	}
	return math.MinInt64, math.MaxInt64
}

func getFloat64(d ir.DType, b []byte, i int) float64 {
	le := binary.LittleEndian
	switch d {
	case ir.Float64:
		return math.Float64frombits(le.Uint64(b[8*i:]))
	case ir.Float32:
		return float64(math.Float32frombits(le.Uint32(b[4*i:])))
	case ir.Float16:
		return ir.F16(le.Uint16(b[2*i:])).Float64()
	default:
		return ir.BF16(le.Uint16(b[2*i:])).Float64()
	}
}

func putFloat64(d ir.DType, b []byte, i int, v float64) {
	le := binary.LittleEndian
	switch d {
	case ir.Float64:
		le.PutUint64(b[8*i:], math.Float64bits(v))
	case ir.Float32:
		le.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case ir.Float16:
		le.PutUint16(b[2*i:], uint16(ir.F16FromFloat64(v)))
	default:
		le.PutUint16(b[2*i:], uint16(ir.BF16FromFloat64(v)))
	}
}
