package fmapeak

// goIterations of the plain-Go loop per call.
const goIterations = 1 << 12

var sink float32

// goLoop is the plain-Go loop used where there is no assembly one: a
// lower bound, not a peak.
func goLoop() {
	var a [8]float32
	b, c := float32(1e-3), float32(1)
	for range goIterations {
		for j := range a {
			a[j] = a[j]*b + c
		}
	}
	sink += a[0]
}

// goFlopsPerCall is goLoop's FLOPs per call.
const goFlopsPerCall = goIterations * 8 * 2
