package vmath

import "testing"

// benchGeluChain times a compiled gelu(x*w+b) chain (tanh form, as the
// trace ops write it) over n elements per call: x, w, b inputs, four uniform
// constants, only the last value stored.
func benchGeluChain(b *testing.B, n int) {
	code := []Instr{{OpMul, 7, 0, 1}, {OpAdd, 8, 7, 2}, {OpMul, 9, 8, 8}, {OpMul, 10, 9, 8}, {OpMul, 11, 3, 10},
		{OpAdd, 12, 8, 11}, {OpMul, 13, 4, 12}, {OpTanh, 14, 13, 13}, {OpMul, 15, 5, 8}, {OpAdd, 16, 6, 14}, {OpMul, 17, 15, 16}}
	for i := range code[:len(code)-1] {
		code[i].Op |= NoStore
	}
	uni := make([]bool, 18)
	for i := 3; i < 7; i++ {
		uni[i] = true
	}
	ch, err := CompileChain(code, 18, uni)
	if err != nil {
		b.Skip(err)
	}
	ptrs := make([]*float32, 18)
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

// BenchmarkGeluChainL1 runs the chain over 1024 elements (in L1).
func BenchmarkGeluChainL1(b *testing.B) { benchGeluChain(b, 1024) }

// BenchmarkGeluChainDRAM runs it over 4M elements (from memory).
func BenchmarkGeluChainDRAM(b *testing.B) { benchGeluChain(b, 1<<22) }

// benchGeluLogisticChain is benchGeluChain for the form the executor
// compiles: x*logistic(2u) with u = c*(t + a*t^3), t = x*w + b.
func benchGeluLogisticChain(b *testing.B, n int) {
	code := []Instr{{OpMul, 7, 0, 1}, {OpAdd, 8, 7, 2}, {OpMul, 9, 8, 8}, {OpMul, 10, 8, 9}, {OpMul, 11, 3, 10},
		{OpAdd, 12, 8, 11}, {OpMul, 13, 4, 12}, {OpLogistic, 14, 13, 13}, {OpMul, 15, 8, 14}}
	for i := range code[:len(code)-1] {
		code[i].Op |= NoStore
	}
	uni := make([]bool, 16)
	for i := 3; i < 7; i++ {
		uni[i] = true
	}
	ch, err := CompileChain(code, 16, uni)
	if err != nil {
		b.Skip(err)
	}
	ptrs := make([]*float32, 16)
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

// BenchmarkGeluLogisticChainL1 runs the logistic form over 1024 elements.
func BenchmarkGeluLogisticChainL1(b *testing.B) { benchGeluLogisticChain(b, 1024) }

// BenchmarkGeluLogisticChainDRAM runs it over 4M elements.
func BenchmarkGeluLogisticChainDRAM(b *testing.B) { benchGeluLogisticChain(b, 1<<22) }
