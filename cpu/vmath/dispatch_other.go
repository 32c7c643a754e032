//go:build !amd64

package vmath

func archImpls() []*impl { return nil }

// Prefetch asks the CPU to bring b into its cache (a no-op here).
func Prefetch(b []byte, l1 bool) {}

// StoreNT copies src to dst (len(src) bytes).
func StoreNT(dst, src []byte) { copy(dst, src) }

// Fence is a no-op here.
func Fence() {}
