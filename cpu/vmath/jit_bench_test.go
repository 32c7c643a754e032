package vmath

import "testing"

// benchChain times a compiled chain over n elements per call: every value
// but the last NoStore, values 3 to 6 uniform inputs. ns/vec is per 16
// elements (one AVX-512 vector, two AVX2 vectors).
func benchChain(b *testing.B, code []Instr, nvals, n int) {
	code = append([]Instr(nil), code...)
	for i := range code[:len(code)-1] {
		code[i].Op |= NoStore
	}
	uni := make([]bool, nvals)
	for i := 3; i < 7; i++ {
		uni[i] = true
	}
	ch, err := CompileChain(code, nvals, uni)
	if err != nil {
		b.Skip(err)
	}
	ptrs := make([]*float32, nvals)
	for i := range ptrs {
		v := make([]float32, n)
		for j := range v {
			v[j] = float32(j%7)*0.1 - 0.3
		}
		ptrs[i] = &v[0]
	}
	b.SetBytes(int64(12 * n))
	for b.Loop() {
		ch.Run(ptrs, n)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n/16), "ns/vec")
}

// geluTanhChain is gelu(x*w+b) in the textbook tanh form: x, w, b inputs
// (0-2), four uniform constants (3-6).
var geluTanhChain = []Instr{{OpMul, 7, 0, 1, 0}, {OpAdd, 8, 7, 2, 0}, {OpMul, 9, 8, 8, 0}, {OpMul, 10, 9, 8, 0}, {OpMul, 11, 3, 10, 0},
	{OpAdd, 12, 8, 11, 0}, {OpMul, 13, 4, 12, 0}, {OpTanh, 14, 13, 13, 0}, {OpMul, 15, 5, 8, 0}, {OpAdd, 16, 6, 14, 0}, {OpMul, 17, 15, 16, 0}}

// geluLogisticChain is the form the executor compiles:
// t·logistic(t·(a + b·t²)) with t = x*w + b.
var geluLogisticChain = []Instr{{OpMul, 7, 0, 1, 0}, {OpAdd, 8, 7, 2, 0}, {OpMul, 9, 8, 8, 0}, {OpMul, 10, 3, 9, 0},
	{OpAdd, 11, 4, 10, 0}, {OpMul, 12, 8, 11, 0}, {OpLogistic, 13, 12, 12, 0}, {OpMul, 14, 8, 13, 0}}

// BenchmarkGeluChainL1 runs the tanh form over 1024 elements (in L1).
func BenchmarkGeluChainL1(b *testing.B) { benchChain(b, geluTanhChain, 18, 1024) }

// BenchmarkGeluChainDRAM runs it over 4M elements (from memory).
func BenchmarkGeluChainDRAM(b *testing.B) { benchChain(b, geluTanhChain, 18, 1<<22) }

// BenchmarkGeluLogisticChainL1 runs the logistic form over 1024 elements.
func BenchmarkGeluLogisticChainL1(b *testing.B) { benchChain(b, geluLogisticChain, 16, 1024) }

// BenchmarkGeluLogisticChainDRAM runs it over 4M elements.
func BenchmarkGeluLogisticChainDRAM(b *testing.B) { benchChain(b, geluLogisticChain, 16, 1<<22) }
