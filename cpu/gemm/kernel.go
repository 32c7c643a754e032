package gemm

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/ferryml/ferry/internal/settings"
)

// float is the element type constraint of the generic driver.
type float interface {
	~float32 | ~float64
}

// microKernel computes one mr×nr tile of C from packed panels of A (k
// slivers of mr elements) and B (k slivers of nr elements):
//
//	C[i*ldc+j] = alpha * sum_p a[p*mr+i]*b[p*nr+j] + beta*C[i*ldc+j]
//
// When beta is ±0, C is not read.
type microKernel[T float] func(k int, a, b, c *T, ldc int, alpha, beta T)

// inPlaceKernel is microKernel with A read in place: element (i, p) of
// the mr×k block at a[i*rsa + p*csa] (B still packed).
type inPlaceKernel[T float] func(k int, a, b, c *T, ldc int, alpha, beta T, rsa, csa int)

// kernel is a micro-kernel with its tile shape and cache blocking.
type kernel[T float] struct {
	fn microKernel[T]
	// fnA, when there is one, reads A in place; products with few
	// columns use it instead of packing A (see useInPlaceA).
	fnA    inPlaceKernel[T]
	mr, nr int
	// mc×kc is the packed block of A (kept in L2), kc×nc the packed panel
	// of B (kept in L3); kc×nr (one sliver of B) should fit in L1.
	mc, kc, nc int
}

// kernelSet is one implementation for both element types.
type kernelSet struct {
	name string
	s    kernel[float32]
	d    kernel[float64]
}

// kernels lists the implementations this machine supports, fastest first;
// the portable Go one is always last.
var kernels = append(archKernels(), goKernels)

var active atomic.Pointer[kernelSet]

func init() {
	active.Store(kernels[0])
	name, set, err := settings.GemmKernel.Lookup()
	if err == nil && set {
		if err = SetKernel(name); err != nil {
			err = fmt.Errorf("%s=%q: %w", settings.GemmKernel.Name, name, err)
		}
	}
	if err != nil {
		settings.Warn(err, kernels[0].name)
	}
}

// Kernels returns the names of the micro-kernels this machine supports,
// fastest first: a subset of "avx512", "avx2" and "go" (always there).
func Kernels() []string {
	names := make([]string, len(kernels))
	for i, k := range kernels {
		names[i] = k.name
	}
	return names
}

// Kernel returns the name of the micro-kernel in use. It is the fastest
// one the machine supports unless FERRY_GEMM_KERNEL (avx512, avx2 or go)
// or SetKernel chose another.
func Kernel() string { return active.Load().name }

// SetKernel selects the micro-kernel by name (see Kernels). It returns an
// error, and changes nothing, if the machine does not support it.
func SetKernel(name string) error {
	for _, k := range kernels {
		if k.name == strings.ToLower(strings.TrimSpace(name)) {
			active.Store(k)
			return nil
		}
	}
	return fmt.Errorf("gemm kernel %q not supported on this machine (have %s)", name, strings.Join(Kernels(), ", "))
}
