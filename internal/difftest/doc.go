// Package difftest holds the random-program differential test of the CPU
// backend: random programs (internal/randprog) compiled by package passes
// and run by the optimised CPU executor (internal/cpuexec, asynchronous
// copies on), with fused multiply-add contraction off (compared bit for bit)
// and on (compared within a tolerance), against the reference executor
// (internal/eval) on the uncompiled program. It has no API; see its test.
//
// Environment of the test:
//
//	FERRY_RANDOM_PROGRAMS=N   number of programs (default 400, 60 with -short)
//	FERRY_RANDOM_SEED=S       first seed (default 1); program i uses seed S+i
//	FERRY_RANDOM_FEATURES=... randprog feature changes, e.g. "+scancopies"
//	                          or "all" (see randprog.ParseFeatures)
//
// Run it under the race detector too (go test -race): copies racing with
// compute show up there as data races, not only as wrong values.
//
// A mismatch or an internal error prints the seed, the features, the
// compile options, the program's IR and a smaller reproduction (results
// pruned and ops replaced by parameters holding their values while the
// failure persists; with dead code kept when the failure needs it).
package difftest
