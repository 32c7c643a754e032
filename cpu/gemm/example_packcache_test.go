package gemm_test

import (
	"fmt"
	"unsafe"

	"github.com/ferryml/ferry/cpu/gemm"
)

// A weight in memory declared read-only is packed once, the second time a
// product reads it, and read packed from the cache afterwards; Forget drops
// it before the memory changes.
func ExampleReadOnly() {
	const m, n, k = 4, 8, 16
	x, w, y := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
	for i := range w {
		w[i] = float32(i%7) - 3
	}
	for i := range x {
		x[i] = 1
	}
	wBytes := unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), len(w)*4)
	gemm.ReadOnly(wBytes)
	before := gemm.PackCache()
	for range 3 {
		gemm.Sgemm(false, false, m, n, k, 1, x, k, w, n, 0, y, n)
	}
	after := gemm.PackCache()
	fmt.Println("packed:", after.Packed-before.Packed, "read from the cache:", after.Hits-before.Hits)
	fmt.Println("y[0][:4]:", y[:4])
	gemm.Forget(wBytes) // before w is written or freed
	fmt.Println("entries dropped:", after.Entries-gemm.PackCache().Entries)
	// Output:
	// packed: 1 read from the cache: 1
	// y[0][:4]: [-5 -3 -1 1]
	// entries dropped: 1
}
