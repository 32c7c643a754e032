package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// bytesOf views s as bytes.
func bytesOf[T any](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// cachedCase is one product whose B is declared read-only.
type cachedCase struct {
	transA, transB bool
	m, n, k, padB  int
	threads        int
}

// packCacheCases are products of one and several steps (k past kc), with
// edge slivers (n not a multiple of nr), both layouts of B.
func packCacheCases(r *rand.Rand) []cachedCase {
	var cs []cachedCase
	for _, tb := range []bool{false, true} {
		cs = append(cs,
			cachedCase{transB: tb, m: 1 + r.IntN(40), n: 1 + r.IntN(150), k: 1 + r.IntN(60), threads: 1},
			cachedCase{transA: r.IntN(2) == 0, transB: tb, m: 64 + r.IntN(64), n: 100 + r.IntN(100), k: 400 + r.IntN(300), padB: r.IntN(3), threads: 2},
		)
	}
	return cs
}

// checkCached runs c three times with B declared read-only (the second
// call packs B into the cache, the third reads it from there) and compares
// every result bit for bit with the product computed without the cache.
func checkCached[T float](t *testing.T, r *rand.Rand, c cachedCase, f func(transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)) {
	t.Helper()
	defer SetThreads(SetThreads(c.threads))
	lda := c.k
	if c.transA {
		lda = c.m
	}
	rowsB, ldb := c.k, c.n+c.padB
	if c.transB {
		rowsB, ldb = c.n, c.k+c.padB
	}
	rnd := func(n int) []T {
		s := make([]T, n)
		for i := range s {
			s[i] = T(r.Float64()*2 - 1)
		}
		return s
	}
	a, b := rnd(c.m*c.k), rnd(rowsB*ldb)
	want := make([]T, c.m*c.n)
	f(c.transA, c.transB, c.m, c.n, c.k, 1, a, lda, b, ldb, 0, want, c.n)
	ReadOnly(bytesOf(b))
	defer Forget(bytesOf(b))
	before := PackCache()
	for call := range 3 {
		got := make([]T, c.m*c.n)
		f(c.transA, c.transB, c.m, c.n, c.k, 1, a, lda, b, ldb, 0, got, c.n)
		for i := range got {
			if math.Float64bits(float64(got[i])) != math.Float64bits(float64(want[i])) {
				t.Fatalf("%+v, call %d: c[%d] = %v, want %v (without the cache)", c, call, i, got[i], want[i])
			}
		}
	}
	after := PackCache()
	if after.Packed != before.Packed+1 || after.Hits != before.Hits+1 {
		t.Fatalf("%+v: packed %d, hits %d in three calls; want 1 and 1", c, after.Packed-before.Packed, after.Hits-before.Hits)
	}
}

func TestPackCache(t *testing.T) {
	r := testseed.Rand(t, 43)
	forEachKernel(t, func(t *testing.T) {
		for _, c := range packCacheCases(r) {
			checkCached(t, r, c, Sgemm)
			checkCached(t, r, c, Dgemm)
		}
	})
}

func TestPackCacheHalf(t *testing.T) {
	r := testseed.Rand(t, 44)
	forEachKernel(t, func(t *testing.T) {
		for _, c := range packCacheCases(r) {
			for _, f := range []Format{BF16, F16} {
				checkCached(t, r, c, func(ta, tb bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
					half := func(s []float32) []uint16 {
						// The low halves of the float32 words: a different
						// half-precision matrix per call would defeat the
						// cache, so B's bits are reinterpreted in place.
						return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(s))), len(s))[:len(s)]
					}
					out := make([]uint16, len(c))
					SgemmHalf(f, ta, tb, m, n, k, alpha, half(a), lda, half(b), ldb, beta, out, ldc)
					for i, v := range out {
						c[i] = float32(v) // compared bit for bit as numbers
					}
				})
			}
		}
	})
}

// TestPackCacheForget writes new values into forgotten memory, as a freed
// and reused buffer would get: the product must read them, not the panels
// packed from the old ones.
func TestPackCacheForget(t *testing.T) {
	r := testseed.Rand(t, 45)
	m, n, k := 7, 70, 50
	a, b := make([]float32, m*k), make([]float32, k*n)
	fill := func(s []float32) {
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
	}
	fill(a)
	fill(b)
	ReadOnly(bytesOf(b))
	got := make([]float32, m*n)
	for range 3 {
		Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, got, n)
	}
	if PackCache().Entries == 0 {
		t.Fatal("B was not cached")
	}
	Forget(bytesOf(b))
	fill(b) // the memory is reused
	ReadOnly(bytesOf(b))
	defer Forget(bytesOf(b))
	for call := range 3 {
		Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, got, n)
		want := refGemm(false, false, m, n, k, 1, a, k, b, n, 0, nil, n)
		for i := range got {
			if d := math.Abs(float64(got[i]) - want[i]); d > 1e-4 {
				t.Fatalf("call %d after reuse: c[%d] = %v, want %v", call, i, got[i], want[i])
			}
		}
	}
}

func TestPackCacheLimit(t *testing.T) {
	r := testseed.Rand(t, 46)
	m, n, k := 3, 64, 64
	old := SetPackCacheLimit(int64(n * k * 4 * 3 / 2)) // room for one B
	defer SetPackCacheLimit(old)
	a := make([]float32, m*k)
	bs := [2][]float32{make([]float32, k*n), make([]float32, k*n)}
	for _, s := range append(bs[:], a) {
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
	}
	for _, b := range bs {
		ReadOnly(bytesOf(b))
		defer Forget(bytesOf(b))
	}
	c := make([]float32, m*n)
	for _, b := range bs {
		for range 2 {
			Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
		}
	}
	if s := PackCache(); s.Entries != 1 || s.Bytes > s.Limit {
		t.Fatalf("%+v: want one entry within the limit", s)
	}
	SetPackCacheLimit(0)
	if s := PackCache(); s.Entries != 0 || s.Bytes != 0 {
		t.Fatalf("%+v after turning the cache off: want it empty", s)
	}
}

// TestPackCacheConcurrent runs products on one read-only B from several
// goroutines while another declares and forgets other memory: every
// result is the product's without the cache.
func TestPackCacheConcurrent(t *testing.T) {
	r := testseed.Rand(t, 50)
	m, n, k := 20, 130, 70
	rnd := func(size int) []float32 {
		s := make([]float32, size)
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
		return s
	}
	a, b, other := rnd(m*k), rnd(k*n), rnd(k*n)
	want := make([]float32, m*n)
	Sgemm(false, true, m, n, k, 1, a, k, b, k, 0, want, n)
	ReadOnly(bytesOf(b))
	defer Forget(bytesOf(b))
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := make([]float32, m*n)
			for call := range 20 {
				Sgemm(false, true, m, n, k, 1, a, k, b, k, 0, c, n)
				for i := range c {
					if math.Float32bits(c[i]) != math.Float32bits(want[i]) {
						errs <- fmt.Sprintf("call %d: c[%d] = %v, want %v", call, i, c[i], want[i])
						return
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := make([]float32, m*n)
		for range 20 {
			ReadOnly(bytesOf(other))
			Sgemm(false, true, m, n, k, 1, a, k, other, k, 0, c, n)
			Forget(bytesOf(other))
		}
	}()
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// TestPackCacheNoThrash uses two weights in turn with room for one: the
// first packed keeps its place (no packing and dropping at every call)
// until it goes unused, when the other takes it.
func TestPackCacheNoThrash(t *testing.T) {
	r := testseed.Rand(t, 51)
	m, n, k := 3, 64, 64
	old := SetPackCacheLimit(int64(n * k * 4 * 3 / 2)) // room for one B
	defer SetPackCacheLimit(old)
	a := make([]float32, m*k)
	bs := [2][]float32{make([]float32, k*n), make([]float32, k*n)}
	for _, s := range append(bs[:], a) {
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
	}
	for _, b := range bs {
		ReadOnly(bytesOf(b))
		defer Forget(bytesOf(b))
	}
	c := make([]float32, m*n)
	mul := func(b []float32) { Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n) }
	before := PackCache()
	for range 10 {
		mul(bs[0])
		mul(bs[1])
	}
	s := PackCache()
	if s.Packed-before.Packed != 1 || s.Hits-before.Hits != 8 {
		t.Fatalf("two weights in turn, room for one: packed %d, hits %d; want 1 and 8", s.Packed-before.Packed, s.Hits-before.Hits)
	}
	for range 3 {
		mul(bs[1]) // the first goes unused: the second takes its place
	}
	s = PackCache()
	if s.Packed-before.Packed != 2 || s.Entries != 1 || s.Bytes > s.Limit {
		t.Fatalf("%+v: packed %d; want the second weight packed in place of the first", s, s.Packed-before.Packed)
	}
}
