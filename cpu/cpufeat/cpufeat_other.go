//go:build !amd64

package cpufeat

func detect() (avx2fma, avx512f, bmi2 bool) { return false, false, false }
