//go:build race

package hf_test

// raceEnabled: the race detector is on, and its instrumentation allocates
// on the Go heap beside the code it watches.
const raceEnabled = true
