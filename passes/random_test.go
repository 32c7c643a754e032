package passes_test

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// seedOf turns fuzz bytes into a seed.
func seedOf(data []byte) uint64 {
	if len(data) == 8 {
		return binary.LittleEndian.Uint64(data)
	}
	h := fnv.New64a()
	h.Write(data)
	return h.Sum64()
}

var optionalPasses = []string{"canonicalize", "constant-fold", "dot-layout", "cse", "dce", "fusion", "schedule"}

// checkProgram compiles the random program of seed (with some passes
// disabled and some parameters donated, chosen by the seed) and checks that
// the compiled function and the plan-following run give the original's
// results bit for bit.
func checkProgram(t testing.TB, seed uint64) {
	t.Helper()
	f := randprog.New(seed, randprog.All())
	require.NoError(t, ir.Verify(f), "generated program\n%s", f)
	text := f.String()
	rng := rand.New(rand.NewPCG(seed, 7))
	opts := passes.Options{Verify: true, FusionInPlace: rng.IntN(2) == 0}
	if rng.IntN(3) == 0 {
		for _, name := range optionalPasses {
			if rng.IntN(3) == 0 {
				opts.Disable = append(opts.Disable, name)
			}
		}
	}
	opts.Donated = make([]bool, len(f.Body.Params))
	for i := range opts.Donated {
		opts.Donated[i] = rng.IntN(2) == 0
	}
	p, err := passes.Compile(f, opts)
	require.NoError(t, err, "seed %d, options %+v, program\n%s", seed, opts, text)
	require.Equal(t, text, f.String(), "Compile changed its input")
	require.NoError(t, passes.CheckPlan(p), "seed %d\n%s\n%s", seed, p.Func, p.PlanString())
	again, err := passes.Compile(f, opts)
	require.NoError(t, err)
	require.Equal(t, p.Func.String()+p.PlanString(), again.Func.String()+again.PlanString(), "seed %d: compiling is deterministic", seed)

	args := randprog.Args(rng, f)
	want, err := eval.Run(f, args)
	require.NoError(t, err, "seed %d: original\n%s", seed, text)
	got, err := eval.Run(p.Func, args)
	require.NoError(t, err, "seed %d: compiled\n%s", seed, p.Func)
	require.NoError(t, sameResults(want, got), "seed %d, options %+v\noriginal\n%s\ncompiled\n%s", seed, opts, text, p.Func)
	planned, err := runPlan(p, args)
	require.NoError(t, err, "seed %d: plan run\n%s", seed, p.Func)
	require.NoError(t, sameResults(want, planned), "seed %d, options %+v: running by the plan\noriginal\n%s\ncompiled\n%s\nplan\n%s", seed, opts, text, p.Func, p.PlanString())
}

// TestPipelineRandom compiles random programs (internal/testkit/randprog, every
// feature on) for a fixed time and checks that every pass keeps the results
// and that the plan is valid and correct. FERRY_RANDOM_PROGRAMS=n runs n
// programs instead, from seed FERRY_RANDOM_SEED (default 1). The CPU
// executor's differential test over the same programs is in
// internal/testkit/difftest.
func TestPipelineRandom(t *testing.T) {
	budget := 3 * time.Second
	if testing.Short() {
		budget = time.Second
	}
	count, err := envUint(settings.RandomPrograms, 0)
	require.NoError(t, err)
	first, err := envUint(settings.RandomSeed, 1)
	require.NoError(t, err)
	start := time.Now()
	n := uint64(0)
	for seed := first; count > 0 && n < count || count == 0 && time.Since(start) < budget; seed++ {
		checkProgram(t, seed)
		n++
	}
	t.Logf("%d random programs from seed %d", n, first)
}

// envUint reads a non-negative integer setting, def when it is unset.
func envUint(s *settings.Setting[uint64], def uint64) (uint64, error) {
	v, set, err := s.Lookup()
	if !set {
		return def, err
	}
	return v, err
}

// FuzzPipeline is TestPipelineRandom driven by the fuzzer: the input bytes
// seed the program generator.
func FuzzPipeline(f *testing.F) {
	for _, s := range []uint64{0, 1, 42, 1234567} {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], s)
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkProgram(t, seedOf(data))
	})
}
