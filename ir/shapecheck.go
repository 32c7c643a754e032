package ir

import (
	"fmt"
	"math"
	"math/bits"
)

// CheckShape reports whether an array of shape s and dtype dt can exist: no
// dimension is negative, and its element count and its size in bytes fit
// in an int (Shape.Size and Type.Bytes would otherwise wrap around). The
// error names the shape.
func CheckShape(s Shape, dt DType) error {
	for _, d := range s {
		if d < 0 {
			return fmt.Errorf("shape %v has a negative dimension", s)
		}
		if d == 0 {
			return nil // no elements, whatever the other dimensions
		}
	}
	elem := uint64(dt.Size())
	if elem == 0 {
		elem = 1
	}
	n := uint64(1)
	for _, d := range s {
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt {
			return fmt.Errorf("shape %v has more elements than an int holds (%d)", s, int64(math.MaxInt))
		}
		n = lo
	}
	if hi, lo := bits.Mul64(n, elem); hi != 0 || lo > math.MaxInt {
		return fmt.Errorf("shape %v of %v is larger than %d bytes", s, dt, int64(math.MaxInt))
	}
	return nil
}
