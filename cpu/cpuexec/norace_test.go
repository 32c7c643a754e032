//go:build !race

package cpuexec

const raceEnabled = false
