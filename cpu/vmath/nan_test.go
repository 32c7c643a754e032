package vmath

import (
	"fmt"
	"math"
	"testing"
)

// TestNaNRule checks the package's NaN rule on every implementation this
// machine runs: signalling and quiet NaNs of both signs, with payloads,
// through every op in every operand position. Max, Min, Neg and Abs move
// bits; the other ops return the NaN operand quieted.
func TestNaNRule(t *testing.T) {
	nans := []uint32{0x7f800001, 0xff812345, 0x7fc00000, 0xffe54321, 0x7fbfffff}
	for _, im := range available() {
		prev := use(im)
		for _, nb := range nans {
			n := math.Float32frombits(nb)
			quiet := nb | 0x00400000
			for op := OpAdd; op < opEnd; op++ {
				if ops[op].arity == 1 {
					want := quiet
					switch op {
					case OpNeg:
						want = nb ^ signBit
					case OpAbs:
						want = nb &^ signBit
					case OpLogistic:
						want = quiet | signBit
					}
					x := []float32{1, n, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
					dst := make([]float32, len(x))
					im.f1[op](dst, x)
					if got := math.Float32bits(dst[1]); got != want {
						t.Errorf("%s: %s(%#x) = %#x, want %#x", im.name, ops[op].name, nb, got, want)
					}
					continue
				}
				for pos := range 2 {
					a, b := make([]float32, 17), make([]float32, 17)
					for i := range a {
						a[i], b[i] = 1.5, 0.25
					}
					if pos == 0 {
						a[3] = n
					} else {
						b[3] = n
					}
					want := quiet
					if op == OpMax || op == OpMin {
						want = nb
					}
					dst := make([]float32, 17)
					im.f2[op](dst, a, b)
					if got := math.Float32bits(dst[3]); got != want {
						t.Errorf("%s: %s(%s) = %#x, want %#x", im.name, ops[op].name,
							fmt.Sprintf("%#x, %#x", math.Float32bits(a[3]), math.Float32bits(b[3])), got, want)
					}
				}
			}
		}
		use(prev)
	}
}
