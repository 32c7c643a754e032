package gemm

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// Format is a 16-bit floating-point storage format of SgemmHalf's
// matrices, whose elements are given as their bits.
type Format uint8

const (
	// BF16 is bfloat16: the top 16 bits of a float32.
	BF16 Format = iota + 1
	// F16 is IEEE 754 binary16.
	F16
)

// String returns "bf16" or "f16".
func (f Format) String() string {
	switch f {
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

func (f Format) check() {
	if f != BF16 && f != F16 {
		panic(fmt.Sprintf("gemm: unknown 16-bit format %v", f))
	}
}

// The conversions give the same bits as package ir's (ir.BF16.Float32,
// ir.F16.Float32, ir.BF16FromFloat32, ir.F16FromFloat32), which the tests
// check over every 16-bit pattern and many float32 values. The bfloat16
// ones are package ir's (they inline); the binary16 ones are bit
// manipulation here, several times faster than ir's float64 path.

// bf16ToF32 widens a bfloat16 exactly.
func bf16ToF32(h uint16) float32 { return ir.BF16(h).Float32() }

// f16ToF32 widens a binary16 exactly; every NaN becomes the float32 quiet
// NaN 0x7fc00000.
func f16ToF32(h uint16) float32 { return ir.F16(h).Float32() }

// f32ToBF16 rounds x to bfloat16, to nearest with ties to even; a NaN keeps
// its sign and top payload bits and is made quiet.
func f32ToBF16(x float32) uint16 { return uint16(ir.BF16FromFloat32(x)) }

// f32ToF16 rounds x to binary16, to nearest with ties to even (overflow
// gives ±Inf); a NaN becomes the quiet NaN 0x7e00 with x's sign.
func f32ToF16(x float32) uint16 { return uint16(ir.F16FromFloat32(x)) }

// widenRow sets dst[i] to the float32 value of src[i].
func widenRow(f Format, dst []float32, src []uint16) {
	dst = dst[:len(src)]
	if f == BF16 {
		for i, h := range src {
			dst[i] = bf16ToF32(h)
		}
		return
	}
	for i, h := range src {
		dst[i] = f16ToF32(h)
	}
}

// widenStrided sets dst[i*stride] to the float32 value of src[i].
func widenStrided(f Format, dst []float32, stride int, src []uint16) {
	if len(src) == 0 {
		return
	}
	dst = dst[:(len(src)-1)*stride+1]
	o := 0
	if f == BF16 {
		for _, h := range src {
			dst[o] = bf16ToF32(h)
			o += stride
		}
		return
	}
	for _, h := range src {
		dst[o] = f16ToF32(h)
		o += stride
	}
}

// narrowRow sets dst[i] to src[i] rounded to f.
func narrowRow(f Format, dst []uint16, src []float32) {
	src = src[:len(dst)]
	if f == BF16 {
		for i, v := range src {
			dst[i] = f32ToBF16(v)
		}
		return
	}
	for i, v := range src {
		dst[i] = f32ToF16(v)
	}
}

// scaleHalf sets C = round(beta*C), or C = +0 when beta is 0 (C unchanged
// when beta is 1).
func scaleHalf(f Format, m, n int, beta float32, c []uint16, ldc int) {
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		switch {
		case beta == 0:
			clear(row)
		case beta != 1:
			var buf [64]float32
			for j0 := 0; j0 < n; j0 += len(buf) {
				r := row[j0:min(n, j0+len(buf))]
				t := buf[:len(r)]
				widenRow(f, t, r)
				for j := range t {
					t[j] *= beta
				}
				narrowRow(f, r, t)
			}
		}
	}
}

// packAHalf is packA for 16-bit A, widened to float32 as it is packed.
func packAHalf(dst []float32, a []uint16, f Format, lda int, trans bool, i0, p0, mc, kc, mr int) {
	for ir := 0; ir < mc; ir += mr {
		d := dst[ir*kc : ir*kc+mr*kc]
		rows := min(mr, mc-ir)
		if trans {
			for p := 0; p < kc; p++ {
				o := (p0+p)*lda + i0 + ir
				dd := d[p*mr : p*mr+mr]
				widenRow(f, dd[:rows], a[o:o+rows])
				clear(dd[rows:])
			}
			continue
		}
		for i := 0; i < rows; i++ {
			o := (i0+ir+i)*lda + p0
			widenStrided(f, d[i:], mr, a[o:o+kc])
		}
		for i := rows; i < mr; i++ {
			for p := 0; p < kc; p++ {
				d[p*mr+i] = 0
			}
		}
	}
}

// packBHalf is packB for 16-bit B, widened to float32 as it is packed.
func packBHalf(dst []float32, b []uint16, f Format, ldb int, trans bool, p0, j0, kc, nc, nr int) {
	for jr := 0; jr < nc; jr += nr {
		d := dst[jr*kc : jr*kc+nr*kc]
		cols := min(nr, nc-jr)
		if !trans {
			for p := 0; p < kc; p++ {
				o := (p0+p)*ldb + j0 + jr
				dd := d[p*nr : p*nr+nr]
				widenRow(f, dd[:cols], b[o:o+cols])
				clear(dd[cols:])
			}
			continue
		}
		const pb = 32 // see packB
		for q := 0; q < kc; q += pb {
			qn := min(pb, kc-q)
			for j := 0; j < cols; j++ {
				o := (j0+jr+j)*ldb + p0 + q
				widenStrided(f, d[q*nr+j:], nr, b[o:o+qn])
			}
		}
		if cols < nr {
			for p := 0; p < kc; p++ {
				clear(d[p*nr+cols : p*nr+nr])
			}
		}
	}
}
