package gemm

import "unsafe"

// goKernels is the portable implementation: a 4×4 register tile in Go.
var goKernels = &kernelSet{
	name: "go",
	s:    kernel[float32]{fn: goKernel4x4[float32], mr: 4, nr: 4, mc: 128, kc: 256, nc: 2048},
	d:    kernel[float64]{fn: goKernel4x4[float64], mr: 4, nr: 4, mc: 128, kc: 256, nc: 1024},
}

// goKernel4x4 is the portable micro-kernel (see microKernel) for mr = nr = 4.
func goKernel4x4[T float](k int, ap, bp, cp *T, ldc int, alpha, beta T) {
	a := unsafe.Slice(ap, 4*k)
	b := unsafe.Slice(bp, 4*k)
	var c00, c01, c02, c03 T
	var c10, c11, c12, c13 T
	var c20, c21, c22, c23 T
	var c30, c31, c32, c33 T
	for len(a) >= 4 && len(b) >= 4 {
		a0, a1, a2, a3 := a[0], a[1], a[2], a[3]
		b0, b1, b2, b3 := b[0], b[1], b[2], b[3]
		a, b = a[4:], b[4:]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	c := unsafe.Slice(cp, 3*ldc+4)
	store4(c[0:4:4], alpha, beta, c00, c01, c02, c03)
	store4(c[ldc:ldc+4:ldc+4], alpha, beta, c10, c11, c12, c13)
	store4(c[2*ldc:2*ldc+4:2*ldc+4], alpha, beta, c20, c21, c22, c23)
	store4(c[3*ldc:3*ldc+4:3*ldc+4], alpha, beta, c30, c31, c32, c33)
}

func store4[T float](c []T, alpha, beta, x0, x1, x2, x3 T) {
	if beta == 0 {
		c[0], c[1], c[2], c[3] = alpha*x0, alpha*x1, alpha*x2, alpha*x3
		return
	}
	c[0] = alpha*x0 + beta*c[0]
	c[1] = alpha*x1 + beta*c[1]
	c[2] = alpha*x2 + beta*c[2]
	c[3] = alpha*x3 + beta*c[3]
}
