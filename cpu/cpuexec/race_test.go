//go:build race

package cpuexec

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// heap measurements mean nothing.
const raceEnabled = true
