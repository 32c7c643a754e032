package parallel

import "testing"

// BenchmarkPause measures one pause(pauseN), the polling interval of an
// idle worker.
func BenchmarkPause(b *testing.B) {
	for i := 0; i < b.N; i++ {
		pause(pauseN)
	}
}
