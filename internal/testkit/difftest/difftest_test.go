package difftest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/cpu/cpuexec"
	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// defaultFeatures is the generator mix the test runs by default: every
// feature, including the two families that found executor bugs (a scan body's
// round trip of its xs slice through the other memory space raced with the
// asynchronous copies; a scan body returning a constant or an iota failed from
// iteration 1). FERRY_RANDOM_FEATURES narrows it (-name, none, +name).
func defaultFeatures() randprog.Features { return randprog.All() }

func envInt(t *testing.T, s *settings.Setting[uint64], def uint64) uint64 {
	n, set, err := s.Lookup()
	if err != nil {
		t.Fatal(err)
	}
	if !set {
		return def
	}
	return n
}

// failure is a mismatch or an internal error.
type failure struct {
	internal bool
	// stage says where a sharded run failed (TestShardedRandom), so that
	// its reproduction is shrunk while it fails there.
	stage string
	msg   string
}

func (f *failure) Error() string {
	if f.internal {
		return "internal error: " + f.msg
	}
	return "mismatch: " + f.msg
}

// testCase is one program, its arguments and compile options.
type testCase struct {
	// aliased is set by run when the plan reuses a donated parameter.
	aliased bool
	// fmaDiffers is set by run when contraction changed some result bits.
	fmaDiffers bool
	// fmaJumps is set by run when contraction changed a result beyond
	// fmaTol through an op that jumps (see throughJumps).
	fmaJumps bool
	// orderSensitive is set by runSharded when the sharded results differ
	// from the whole program's beyond the tolerance through sums in another
	// order: it says why that is no error (an op that is not continuous,
	// or results as close to the float64 program's as the whole's).
	orderSensitive string
	// concurrent is how many Executes run at once without contraction.
	concurrent int
	f          *ir.Func
	args       []*ir.Literal
	donated    []bool
	opts       passes.Options
}

var optionalPasses = []string{"canonicalize", "constant-fold", "cse", "dce", "fusion", "schedule", "prefetch"}

// newCase makes the program of seed: every eighth one a traced remat
// training step, the others IR from randprog.New.
func newCase(seed uint64, feat randprog.Features) (*testCase, string, error) {
	rng := rand.New(rand.NewPCG(seed, 11))
	var f *ir.Func
	desc := fmt.Sprintf("randprog.New(%d, %v)", seed, feat)
	if seed%8 == 0 {
		var err error
		if f, desc, err = randprog.Remat(seed, feat); err != nil {
			return nil, desc, err
		}
	} else {
		f = randprog.New(seed, feat)
	}
	if err := ir.Verify(f); err != nil {
		return nil, desc, fmt.Errorf("generated program does not verify: %w\n%s", err, f)
	}
	c := &testCase{f: f, args: randprog.Args(rng, f), concurrent: 1}
	if rng.IntN(4) == 0 {
		c.concurrent = 2
	}
	c.donated = make([]bool, len(f.Body.Params))
	for i := range c.donated {
		c.donated[i] = rng.IntN(2) == 0
	}
	c.opts = passes.Options{Verify: true, FusionInPlace: rng.IntN(4) > 0}
	if rng.IntN(3) == 0 {
		for _, name := range optionalPasses {
			if rng.IntN(3) == 0 {
				c.opts.Disable = append(c.opts.Disable, name)
			}
		}
	}
	return c, desc, nil
}

// heap is a cpuexec.Allocator over the Go heap that fills new memory with
// garbage, so that reading memory before writing it shows.
type heap struct{}

func (heap) Alloc(space ir.MemorySpace, size int64, what string) ([]byte, func(), error) {
	words := make([]uint64, (size+7)/8+1)
	for i := range words {
		words[i] = 0x7fc00001_fff80001 ^ uint64(i)*0x9e3779b97f4a7c15
	}
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)[:size:size]
	return mem, func() {}, nil
}

func cloneAll(ls []*ir.Literal) []*ir.Literal {
	out := make([]*ir.Literal, len(ls))
	for i, l := range ls {
		out[i] = l.Clone()
	}
	return out
}

// compare checks got against want: bit for bit (any NaN equals any NaN)
// when tol is 0, else floats within tol·(1 + |want|). Types are compared
// apart from shardings: the executor's results have the program's result
// types, a sharding_constraint's included (one device ignores it), eval's
// have none.
func compare(want, got []*ir.Literal, tol float64) error {
	return compareExcept(want, got, tol, nil)
}

// compareExcept is compare, skipping the values of the results where skip
// is true (their types are still compared).
func compareExcept(want, got []*ir.Literal, tol float64, skip []bool) error {
	if len(want) != len(got) {
		return fmt.Errorf("%d results, want %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		if skip != nil && skip[i] {
			if !w.Type.EqualUnsharded(g.Type) {
				return fmt.Errorf("result %d is %v, want %v", i, g.Type, w.Type)
			}
			continue
		}
		if !w.Type.EqualUnsharded(g.Type) {
			return fmt.Errorf("result %d is %v, want %v", i, g.Type, w.Type)
		}
		sz := w.Type.DType.Size()
		for j := range w.Type.Size() {
			if string(w.Data[j*sz:(j+1)*sz]) == string(g.Data[j*sz:(j+1)*sz]) {
				continue
			}
			wf, gf := w.Float64At(j), g.Float64At(j)
			if w.Type.DType.IsFloat() {
				if math.IsNaN(wf) && math.IsNaN(gf) {
					continue
				}
				if tol > 0 && !math.IsInf(wf, 0) && math.Abs(gf-wf) <= tol*(1+math.Abs(wf)) {
					continue
				}
			}
			return fmt.Errorf("result %d (%v) element %d: got %v, want %v", i, w.Type, j, gf, wf)
		}
	}
	return nil
}

// fmaTol is the tolerance, relative to 1 + |want|, of float results
// computed in another order than eval's: with multiply-adds contracted
// (a·b + c rounded once instead of twice: each contraction moves its value
// by at most one unit in the last place, 2⁻²³ relative in f32, before the
// rest of the program amplifies it), and, in the sharded mode, with
// partial sums combined across devices (all_reduce, reduce_scatter): a sum
// of n f32 terms in another order differs by at most about 2(n−1)·2⁻²⁴·Σ|x|,
// under 1e-5·Σ|x| for the sums of randprog's programs (a few dozen terms of
// values of order one), so 1e-3·(1 + |want|) leaves two orders of magnitude
// for amplification and cancellation. Where cancellation makes Σ|x| larger
// still, the sharded mode checks that its results are as close to the
// program in float64 as eval's (asAccurate). Through an op that jumps
// (see jumps: a bitcast, a comparison, a rounding), no tolerance holds: a
// last-bit change can become any change, and such results are checked bit
// for bit with contraction off only (run), or against the per-device
// program's eval (runSharded).
const fmaTol = 1e-3

// run compiles c and runs it with cpuexec with contraction off and on; it
// returns the first failure.
func run(c *testCase) (fail *failure) {
	defer func() {
		if r := recover(); r != nil {
			fail = &failure{internal: true, msg: fmt.Sprintf("panic: %v\n%s", r, debug.Stack())}
		}
	}()
	want, err := eval.Run(c.f, cloneAll(c.args))
	if err != nil {
		return &failure{internal: true, msg: fmt.Sprintf("eval: %v", err)}
	}
	opts := c.opts
	opts.Donated = c.donated
	p, err := passes.Compile(c.f, opts)
	if err != nil {
		return &failure{internal: true, msg: fmt.Sprintf("compile: %v", err)}
	}
	for _, b := range p.Plan.Values {
		if b.Kind == passes.BufAlias {
			c.aliased = true
		}
	}
	for _, fma := range []bool{false, true} {
		prev := vmath.SetContract(fma)
		e, err := cpuexec.New(p)
		vmath.SetContract(prev)
		if err != nil {
			return &failure{internal: true, msg: fmt.Sprintf("cpuexec.New (fma %v): %v", fma, err)}
		}
		// Without contraction, now and then several Executes at once (an
		// Executable is safe for concurrent use).
		runs := 1
		if !fma {
			runs = c.concurrent
		}
		gots := make([][]*ir.Literal, runs)
		errs := make([]error, runs)
		var wg sync.WaitGroup
		for k := range runs {
			wg.Go(func() { gots[k], errs[k] = execute(e, c.args) })
		}
		wg.Wait()
		for k, got := range gots {
			what := fmt.Sprintf("fma %v", fma)
			if runs > 1 {
				what += fmt.Sprintf(", run %d of %d concurrent", k+1, runs)
			}
			if errs[k] != nil {
				return &failure{internal: true, msg: fmt.Sprintf("cpuexec Execute (%s): %v", what, errs[k])}
			}
			if !fma {
				if err := compare(want, got, 0); err != nil {
					return &failure{msg: fmt.Sprintf("%s: %v", what, err)}
				}
				continue
			}
			// Contracted: within fmaTol, except for the results that
			// depend on an op that jumps, which the run without
			// contraction compared bit for bit (see fmaTol).
			c.fmaDiffers = compare(want, got, 0) != nil
			if err := compare(want, got, fmaTol); err != nil {
				if err := compareExcept(want, got, fmaTol, throughJumps(c.f)); err != nil {
					return &failure{msg: fmt.Sprintf("%s: %v", what, err)}
				}
				c.fmaJumps = true
			}
		}
	}
	return nil
}

// execute runs e on copies of args (donated ones may be overwritten),
// turning a panic into an error.
func execute(e *cpuexec.Executable, args []*ir.Literal) (got []*ir.Literal, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	got, _, err = e.Execute(cloneAll(args), heap{})
	return got, err
}

// ---- reproduction ----

// dce removes the ops whose results are unused (at every depth; with
// keepOps false only the parameters) and the parameters nothing uses, with
// their arguments and donation flags. Failures that need the dead code
// (with the compiler's dce pass disabled) are shrunk with keepOps.
func (c *testCase) dce(keepOps bool) {
	b := c.f.Body
	var used map[*ir.Value]bool
	if keepOps {
		used = map[*ir.Value]bool{}
		for _, v := range b.Results {
			used[v] = true
		}
		for _, op := range b.Ops {
			for _, a := range op.Args {
				used[a] = true
			}
		}
	} else {
		used = prune(b)
	}
	var params []*ir.Value
	var args []*ir.Literal
	var donated []bool
	for i, p := range b.Params {
		if used[p] {
			p.Index = len(params)
			params = append(params, p)
			args = append(args, c.args[i])
			donated = append(donated, c.donated[i])
		}
	}
	b.Params, c.args, c.donated = params, args, donated
}

// prune removes the ops of r, and of the regions of the ops it keeps, whose
// results nothing uses, and returns the values r's kept ops and results use.
func prune(r *ir.Region) map[*ir.Value]bool {
	used := map[*ir.Value]bool{}
	for _, v := range r.Results {
		used[v] = true
	}
	var keep []*ir.Op
	for i := len(r.Ops) - 1; i >= 0; i-- {
		op := r.Ops[i]
		if !slices.ContainsFunc(op.Results, func(v *ir.Value) bool { return used[v] }) {
			continue
		}
		keep = append(keep, op)
		for _, a := range op.Args {
			used[a] = true
		}
		dropResults(op, used)
		for _, sr := range op.Regions {
			prune(sr)
		}
	}
	slices.Reverse(keep)
	r.Ops = keep
	return used
}

// dropResults removes the unused ys of a scan and the unused results of a
// cond, with the region results that make them.
func dropResults(op *ir.Op, used map[*ir.Value]bool) {
	first := 0
	switch op.Code {
	case ir.Scan:
		first = op.Attrs.Int("num_carry")
	case ir.Cond:
	default:
		return
	}
	var res []*ir.Value
	rres := make([][]*ir.Value, len(op.Regions))
	for i, v := range op.Results {
		if i < first || used[v] {
			v.Index = len(res)
			res = append(res, v)
			for k, r := range op.Regions {
				rres[k] = append(rres[k], r.Results[i])
			}
		}
	}
	op.Results = res
	for k, r := range op.Regions {
		r.Results = rres[k]
	}
}

func (c *testCase) clone() *testCase {
	return &testCase{f: ir.Clone(c.f), args: c.args, donated: slices.Clone(c.donated), opts: c.opts, concurrent: c.concurrent}
}

// withResults returns c computing only the given results of its body.
func (c *testCase) withResults(keepOps bool, idx ...int) *testCase {
	n := c.clone()
	var res []*ir.Value
	for _, i := range idx {
		res = append(res, n.f.Body.Results[i])
	}
	n.f.Body.Results = res
	n.dce(keepOps)
	return n
}

// cut returns c with body op i replaced by new parameters holding its
// results' values (computed by eval), or nil.
func (c *testCase) cut(i int, keepOps bool) *testCase {
	n := c.clone()
	b := n.f.Body
	op := b.Ops[i]
	probe := n.clone()
	probe.f.Body.Results = slices.Clone(probe.f.Body.Ops[i].Results)
	probe.dce(false)
	stripShardings(probe.f.Body) // eval runs the global program
	vals, err := eval.Run(probe.f, cloneAll(probe.args))
	if err != nil {
		return nil
	}
	repl := map[*ir.Value]*ir.Value{}
	for k, v := range op.Results {
		repl[v] = b.AddParam(v.Type)
		n.args = append(slices.Clone(n.args), vals[k])
		n.donated = append(n.donated, false)
	}
	b.Ops = slices.Delete(slices.Clone(b.Ops), i, i+1)
	for _, o := range b.Ops {
		for k, a := range o.Args {
			if r, ok := repl[a]; ok {
				o.Args[k] = r
			}
		}
	}
	for k, v := range b.Results {
		if r, ok := repl[v]; ok {
			b.Results[k] = r
		}
	}
	n.dce(keepOps)
	if ir.Verify(n.f) != nil {
		return nil
	}
	return n
}

// minimize shrinks c while it still fails the same way (a mismatch stays a
// mismatch, an internal error an internal error).
func minimize(c *testCase, fail *failure) *testCase {
	return shrink(c, func(n *testCase) bool {
		f := run(n)
		return f != nil && f.internal == fail.internal
	})
}

// shrink makes c smaller while same(c) holds: first one result alone, then
// body ops replaced by parameters holding their values, within a bounded
// number of tries.
func shrink(c *testCase, same func(*testCase) bool) *testCase {
	const maxTries = 400
	tries := 0
	try := func(n *testCase) bool {
		tries++
		return n != nil && same(n)
	}
	// Dead code removed (unless the failure needs it), then one result
	// alone.
	keepOps := true
	if n := c.withResults(false, iotaInts(len(c.f.Body.Results))...); try(n) {
		c, keepOps = n, false
	}
	if len(c.f.Body.Results) > 1 {
		for i := range c.f.Body.Results {
			if n := c.withResults(keepOps, i); try(n) {
				c = n
				break
			}
		}
	}
	// Ops replaced by their values, last ones first, until nothing more
	// goes.
	for changed := true; changed && tries < maxTries; {
		changed = false
		for i := len(c.f.Body.Ops) - 1; i >= 0 && tries < maxTries; i-- {
			if i >= len(c.f.Body.Ops) {
				continue
			}
			if n := c.cut(i, keepOps); try(n) {
				c, changed = n, true
			}
		}
	}
	return c
}

func iotaInts(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func (c *testCase) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "options: %+v donated %v, %d concurrent runs\n%s", c.opts, c.donated, c.concurrent, c.f)
	writeArgs(&b, c.args)
	return b.String()
}

// writeArgs writes each argument's type and first 16 values to b.
func writeArgs(b *strings.Builder, args []*ir.Literal) {
	for i, a := range args {
		n := min(a.Type.Size(), 16)
		vals := make([]float64, n)
		for j := range vals {
			vals[j] = a.Float64At(j)
		}
		more := ""
		if n < a.Type.Size() {
			more = " ..."
		}
		fmt.Fprintf(b, "arg %d %v: %v%s\n", i, a.Type, vals, more)
	}
}

// TestCPUExecRandom runs random programs through passes and cpuexec
// (asynchronous copies on; multiply-add contraction off, compared bit for
// bit, and on, compared within fmaTol) and compares them with eval on the
// uncompiled program. See the package documentation for its environment.
func TestCPUExecRandom(t *testing.T) {
	n := envInt(t, settings.RandomPrograms, 400)
	if testing.Short() && !settings.RandomPrograms.IsSet() {
		n = 60
	}
	first := envInt(t, settings.RandomSeed, 1)
	feat, err := randprog.ParseFeatures(defaultFeatures(), settings.RandomFeatures.Get())
	if err != nil {
		t.Fatalf("FERRY_RANDOM_FEATURES: %v", err)
	}
	if !settings.AsyncCopy.IsSet() {
		t.Setenv("FERRY_ASYNC_COPY", "1") // the default, said out loud
	}
	var mismatches, internal, remat, aliased, fmaDiffers, fmaJumps, shown int
	for seed := first; seed < first+n; seed++ {
		c, desc, err := newCase(seed, feat)
		if err != nil {
			internal++
			t.Errorf("seed %d: generating: %v", seed, err)
			continue
		}
		if seed%8 == 0 {
			remat++
		}
		fail := run(c)
		if c.aliased {
			aliased++
		}
		if c.fmaDiffers {
			fmaDiffers++
		}
		if c.fmaJumps {
			fmaJumps++
			t.Logf("seed %d: contraction changed a result beyond the tolerance through an op that jumps (a bitcast, a comparison, a rounding); without contraction it agrees bit for bit", seed)
		}
		if fail == nil {
			continue
		}
		if fail.internal {
			internal++
		} else {
			mismatches++
		}
		msg := fmt.Sprintf("FERRY_RANDOM_SEED=%d FERRY_RANDOM_PROGRAMS=1 FERRY_RANDOM_FEATURES=%s: %v\nprogram: %s\n%v", seed, feat, fail, desc, c)
		if shown < 5 {
			shown++
			small := minimize(c, fail)
			msg += fmt.Sprintf("\nsmaller reproduction (%v):\n%v", run(small), small)
		}
		t.Error(msg)
	}
	jit := ""
	if !vmath.JITAvailable() {
		jit = " (no fused-chain JIT on this CPU: nothing is contracted)"
	}
	t.Logf("%d programs (seeds %d..%d; %d remat steps, %d with a donated parameter aliased, %d where contraction changed result bits, %d of them beyond the tolerance through an op that jumps%s), features %s: %d mismatches, %d internal errors",
		n, first, first+n-1, remat, aliased, fmaDiffers, fmaJumps, jit, feat, mismatches, internal)
}

// FuzzCPUExec is TestCPUExecRandom driven by the fuzzer (go test -fuzz
// FuzzCPUExec ./internal/testkit/difftest): the input is the seed, the features are
// the default mix with FERRY_RANDOM_FEATURES applied.
func FuzzCPUExec(f *testing.F) {
	feat, err := randprog.ParseFeatures(defaultFeatures(), settings.RandomFeatures.Get())
	if err != nil {
		f.Fatalf("FERRY_RANDOM_FEATURES: %v", err)
	}
	for _, s := range []uint64{1, 8, 42, 1234567} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		c, desc, err := newCase(seed, feat)
		if err != nil {
			t.Fatalf("seed %d: generating: %v", seed, err)
		}
		if fail := run(c); fail != nil {
			small := minimize(c, fail)
			t.Fatalf("FERRY_RANDOM_SEED=%d FERRY_RANDOM_FEATURES=%s: %v\nprogram: %s\n%v\nsmaller reproduction (%v):\n%v", seed, feat, fail, desc, c, run(small), small)
		}
	})
}

// shrink keeps what the predicate needs and cuts the rest: asked to keep an
// exp, it leaves the exp and the ops from it to one result, every argument
// matching its parameter, and the values unchanged (the cut ops' values
// become arguments).
func TestShrink(t *testing.T) {
	hasExp := func(c *testCase) bool {
		return slices.ContainsFunc(c.f.Body.Ops, func(op *ir.Op) bool { return op.Code == ir.Exp })
	}
	feat := randprog.Features{Extended: true}
	shrunk := 0
	for seed := uint64(1); seed < 200 && shrunk < 5; seed++ {
		c, _, err := newCase(seed, feat)
		if err != nil || seed%8 == 0 {
			continue
		}
		if c.dce(false); !hasExp(c) || len(c.f.Body.Ops) < 8 {
			continue // no live exp, or too small to tell
		}
		want, err := eval.Run(c.f, cloneAll(c.args))
		if err != nil {
			t.Fatal(err)
		}
		s := shrink(c, hasExp)
		if !hasExp(s) || ir.Verify(s.f) != nil || len(s.args) != len(s.f.Body.Params) || len(s.donated) != len(s.args) {
			t.Fatalf("seed %d: bad shrink\n%v", seed, s)
		}
		if len(s.f.Body.Ops) >= len(c.f.Body.Ops) || len(s.f.Body.Results) != 1 {
			t.Fatalf("seed %d: %d ops, %d results left of %d ops\n%v", seed, len(s.f.Body.Ops), len(s.f.Body.Results), len(c.f.Body.Ops), s)
		}
		// Every op left is the exp or reads, through the others, from it.
		fromExp := map[*ir.Value]bool{}
		for _, op := range s.f.Body.Ops {
			reads := op.Code == ir.Exp || slices.ContainsFunc(op.Args, func(v *ir.Value) bool { return fromExp[v] })
			if !reads {
				t.Fatalf("seed %d: %v left over\n%v", seed, op.Code, s)
			}
			for _, v := range op.Results {
				fromExp[v] = true
			}
		}
		// The remaining result's value is the original one it stands for.
		got, err := eval.Run(s.f, cloneAll(s.args))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(want, func(w *ir.Literal) bool { return compare([]*ir.Literal{w}, got, 0) == nil }) {
			t.Fatalf("seed %d: the shrunk program computes another value\n%v", seed, s)
		}
		shrunk++
	}
	if shrunk == 0 {
		t.Fatal("no program to shrink")
	}
}
