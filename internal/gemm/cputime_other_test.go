//go:build !unix

package gemm

// cpuTime is not measured here (the benchmarks then report wall time only).
func cpuTime() float64 { return 0 }
