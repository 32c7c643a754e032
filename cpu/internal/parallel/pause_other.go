//go:build !amd64

package parallel

// pause is a short busy wait of about n iterations (the amd64 version
// executes n PAUSE instructions).
func pause(n int) {
	for i := 0; i < n; i++ {
		pauseSink++
	}
}

var pauseSink int
