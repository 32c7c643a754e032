//go:build !race

package hf_test

// raceEnabled: the race detector is off.
const raceEnabled = false
