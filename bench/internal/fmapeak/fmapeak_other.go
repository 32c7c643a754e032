//go:build !amd64

package fmapeak

func flopsPerCall() (float64, string) { return goFlopsPerCall, "go" }

func fmaLoop() { goLoop() }
