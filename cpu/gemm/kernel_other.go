//go:build !amd64

package gemm

func archKernels() []*kernelSet { return nil }
