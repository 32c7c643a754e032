//go:build !amd64

package fmapeak

const iterations = 1 << 12

var sink float32

func flopsPerCall() (float64, string) { return iterations * 8 * 2, "go" }

// fmaLoop is plain Go elsewhere: a lower bound, not a peak.
func fmaLoop() {
	var a [8]float32
	b, c := float32(1e-3), float32(1)
	for range iterations {
		for j := range a {
			a[j] = a[j]*b + c
		}
	}
	sink += a[0]
}
