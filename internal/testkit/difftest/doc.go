// Package difftest holds the random-program differential test of the CPU
// backend: random programs (internal/testkit/randprog) compiled by package passes
// and run by the optimised CPU executor (cpu/cpuexec, asynchronous
// copies on), with fused multiply-add contraction off (compared bit for bit)
// and on (compared within a tolerance, fmaTol in the tests, whose comment
// gives the bound; results that depend on an op that jumps when a float
// changes in its last bit, such as a bitcast or a comparison, are held to
// the run without contraction alone), against the reference executor
// (internal/eval) on the uncompiled program. It has no API; see its tests.
//
// Its sharded mode (TestShardedRandom) gives the random programs' parameters
// random shardings over a mesh of the CPU backend's 8 virtual devices ([8],
// [2,4] or [4,2], in turn by seed; each dimension whole or split over one or
// two mesh axes that divide it; some parameters replicated or left to
// propagation), annotates some op results and constrains some function
// results to random shardings, partitions the program (passes.Partition),
// compiles the per-device program and runs it on every device as a jitted
// function is run (runtime.CompileIR; contraction off), and assembles the
// global results from the devices' blocks, whose replicas must agree bit for
// bit. They must equal, bit for bit, the per-device program interpreted by
// eval (collectives through package collective), and eval on the whole
// unsharded program: bit for bit where no partial sum is combined across
// devices (by an all_reduce of "sum" or a reduce_scatter), else within the
// tolerance (sums in another order; beyond it only
// through an op that is not continuous, such as a bitcast, or where the
// results are as close to the program computed in float64 as the whole
// program's).
//
// Environment of the tests:
//
//	FERRY_RANDOM_PROGRAMS=N   number of programs (default 400, 60 with -short)
//	FERRY_SHARDED_PROGRAMS=N  number of sharded programs (default 60, 20
//	                          with -short)
//	FERRY_RANDOM_SEED=S       first seed (default 1); program i uses seed S+i
//	FERRY_RANDOM_FEATURES=... randprog feature changes, e.g. "+scancopies"
//	                          or "all" (see randprog.ParseFeatures); the
//	                          sharded mode starts from every feature and
//	                          "evendims" (dimensions its meshes divide),
//	                          which it turns off for every fourth seed
//
// Run it under the race detector too (go test -race): copies racing with
// compute show up there as data races, not only as wrong values.
//
// A mismatch or an internal error prints the seed, the features, the
// compile options, the program's IR and a smaller reproduction (results
// pruned and ops replaced by parameters holding their values while the
// failure persists; with dead code kept when the failure needs it). In the
// sharded mode it prints the mesh, the parameters' shardings, the global
// program with its shardings and the per-device program, and the smaller
// reproduction also drops the shardings the failure does not need.
package difftest
