package cpuexec

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// ---- a naive planner for hand-built programs ----

// planOpts tweaks naivePlan.
type planOpts struct {
	donated []bool
	alias   map[int]int // result index → donated parameter reused for it
	// inPlace maps a value to the parameter of its region it is computed
	// into (in-place updates inside nested regions).
	inPlace map[*ir.Value]int
}

// naivePlan gives every op result its own slot in the arena (64-byte
// aligned, no reuse), the first occurrence of each top-level result an
// output (or an alias), and nested regions arenas after the enclosing
// region's temporaries.
func naivePlan(f *ir.Func, o planOpts) *passes.Program {
	p := &passes.Program{Func: f, Donated: o.donated}
	p.Plan = planRegion(f.Body, true, o)
	p.Analysis.TempBytes = p.Plan.Arena[ir.Device]
	p.Analysis.HostTempBytes = p.Plan.Arena[ir.PinnedHost]
	return p
}

func planRegion(r *ir.Region, top bool, o planOpts) *passes.RegionPlan {
	pl := &passes.RegionPlan{Region: r, Values: map[*ir.Value]passes.Buffer{}, Sub: map[*ir.Op][]*passes.RegionPlan{}, SubOffset: map[*ir.Op][2]int64{}}
	for i, p := range r.Params {
		pl.Values[p] = passes.Buffer{Kind: passes.BufParam, Space: p.Type.Space, Index: i, Size: p.Type.Bytes()}
	}
	resultOf := map[*ir.Value]int{}
	if top {
		for i := len(r.Results) - 1; i >= 0; i-- {
			resultOf[r.Results[i]] = i
		}
	}
	var used [2]int64
	for _, op := range r.Ops {
		for _, v := range op.Results {
			b := passes.Buffer{Space: v.Type.Space, Size: v.Type.Bytes()}
			if i, ok := resultOf[v]; ok {
				b.Kind, b.Index = passes.BufOutput, i
				if prm, ok := o.alias[i]; ok {
					b.Kind, b.Param = passes.BufAlias, prm
				}
			} else if prm, ok := o.inPlace[v]; ok {
				b.Kind, b.Index = passes.BufParam, prm
			} else {
				b.Kind, b.Offset = passes.BufTemp, used[b.Space]
				used[b.Space] += (b.Size + 63) / 64 * 64
			}
			pl.Values[v] = b
		}
	}
	var nested [2]int64
	for _, op := range r.Ops {
		if len(op.Regions) == 0 || op.Code == ir.Fusion {
			continue
		}
		pl.SubOffset[op] = used
		for _, sr := range op.Regions {
			sp := planRegion(sr, false, o)
			pl.Sub[op] = append(pl.Sub[op], sp)
			for s := range nested {
				nested[s] = max(nested[s], sp.Arena[s])
			}
		}
	}
	for s := range pl.Arena {
		pl.Arena[s] = used[s] + nested[s]
	}
	return pl
}

// ---- a counting allocator ----

type allocRec struct {
	space    ir.MemorySpace
	size     int64
	what     string
	released int
}

type countAlloc struct {
	mu     sync.Mutex
	recs   []*allocRec
	failAt int // fail the n-th call (1-based); 0: never
	misal  bool
	bytes  int64
}

func (a *countAlloc) Alloc(space ir.MemorySpace, size int64, what string) ([]byte, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failAt > 0 && len(a.recs)+1 == a.failAt {
		a.recs = append(a.recs, &allocRec{space: space, size: size, what: what, released: -1})
		return nil, nil, fmt.Errorf("out of memory (test)")
	}
	rec := &allocRec{space: space, size: size, what: what}
	a.recs = append(a.recs, rec)
	a.bytes += size
	mem := alignedBytes(int(size) + 8)
	// Fill with garbage: executors must not rely on zeroed memory.
	for i := range mem {
		mem[i] = byte(i*7 + 3)
	}
	if a.misal {
		mem = mem[1:]
	}
	return mem[:size], func() {
		a.mu.Lock()
		rec.released++
		a.mu.Unlock()
	}, nil
}

// check verifies that every allocation was released exactly want times
// (arenas always once, outputs once if released is true).
func (a *countAlloc) requireReleased(t *testing.T, outputs bool) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.recs {
		if r.released < 0 {
			continue
		}
		want := 1
		if r.what != "temp arena" && !outputs {
			want = 0
		}
		require.Equal(t, want, r.released, "%s (%d bytes in %v) released %d times", r.what, r.size, r.space, r.released)
	}
}

// ---- building ----

func addOp(t testing.TB, r *ir.Region, code ir.Code, args []*ir.Value, attrs ir.Attrs, regions ...*ir.Region) *ir.Op {
	t.Helper()
	op, err := r.AddOp(code, args, attrs, regions...)
	require.NoError(t, err)
	return op
}

func add1(t testing.TB, r *ir.Region, code ir.Code, attrs ir.Attrs, args ...*ir.Value) *ir.Value {
	t.Helper()
	return addOp(t, r, code, args, attrs).Result()
}

func constant[T ir.Native](t testing.TB, r *ir.Region, v T) *ir.Value {
	return add1(t, r, ir.Constant, ir.Attrs{"value": ir.Scalar(v)})
}

func bcast(t testing.TB, r *ir.Region, v *ir.Value, shape []int, dims ...int) *ir.Value {
	if dims == nil {
		dims = []int{}
	}
	return add1(t, r, ir.BroadcastInDim, ir.Attrs{"shape": shape, "dims": dims}, v)
}

func matmulAttrs() ir.Attrs {
	return ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}}
}

// fuse appends a fusion op of the given kind to r over args, whose region
// body builds from its parameters.
func fuse(t testing.TB, f *ir.Func, r *ir.Region, kind string, args []*ir.Value, body func(rg *ir.Region, ps []*ir.Value) []*ir.Value) *ir.Op {
	t.Helper()
	rg := f.NewRegion()
	var ps []*ir.Value
	for _, a := range args {
		ps = append(ps, rg.AddParam(a.Type))
	}
	rg.Results = body(rg, ps)
	return addOp(t, r, ir.Fusion, args, ir.Attrs{"kind": kind}, rg)
}

// ---- data ----

// inputs is the distribution of the executor tests' inputs: floats in
// [-2, 2), signed integers in [-100, 100), unsigned in [0, 100).
var inputs = randprog.Values{
	Float: randprog.Range{Lo: -2, Hi: 2},
	Int:   randprog.Range{Lo: -100, Hi: 100},
	Uint:  randprog.Range{Lo: 0, Hi: 100},
}

func randLit(r *rand.Rand, t ir.Type) *ir.Literal { return inputs.Literal(r, t) }

func randArgs(r *rand.Rand, f *ir.Func) []*ir.Literal { return inputs.Args(r, f) }

func cloneAll(ls []*ir.Literal) []*ir.Literal {
	out := make([]*ir.Literal, len(ls))
	for i, l := range ls {
		out[i] = l.Clone()
	}
	return out
}

// ---- running ----

// runBoth executes p on args with a counting allocator and compares every
// result byte for byte with eval.Run of the same function (a NaN matching
// any NaN: which operand's NaN a sum of two NaNs keeps depends on the order
// the Go compiler gives a commutative add's operands, and differs between
// builds of the reference, with and without -race); it checks the
// allocation discipline and returns the results.
func runBoth(t *testing.T, p *passes.Program, args []*ir.Literal) []*ir.Literal {
	t.Helper()
	return runCompare(t, p, args, func(i int, got, want *ir.Literal) {
		if !bytes.Equal(got.Data, want.Data) && !equalButNaNs(got, want) {
			require.Failf(t, "result differs", "result %d (%v):\n got %v\nwant %v", i, got.Type, head(got), head(want))
		}
	})
}

// equalButNaNs reports whether float literals a and b hold the same bytes
// in every element but those where both hold a NaN.
func equalButNaNs(a, b *ir.Literal) bool {
	if !a.Type.DType.IsFloat() || len(a.Data) != len(b.Data) {
		return false
	}
	n := a.Type.Size()
	w := len(a.Data) / max(n, 1)
	for j := range n {
		if bytes.Equal(a.Data[j*w:(j+1)*w], b.Data[j*w:(j+1)*w]) {
			continue
		}
		if !math.IsNaN(a.Float64At(j)) || !math.IsNaN(b.Float64At(j)) {
			return false
		}
	}
	return true
}

// runClose is runBoth with every element within atol + rtol*|want| of
// eval's (NaN where eval has NaN, the same infinities).
func runClose(t *testing.T, p *passes.Program, args []*ir.Literal, rtol, atol float64) []*ir.Literal {
	t.Helper()
	return runCompare(t, p, args, func(i int, got, want *ir.Literal) {
		for j := range want.Type.Size() {
			g, w := got.Float64At(j), want.Float64At(j)
			if g == w || math.IsNaN(g) && math.IsNaN(w) || math.Abs(g-w) <= atol+rtol*math.Abs(w) {
				continue
			}
			require.Failf(t, "result differs", "result %d (%v) element %d: got %v, want %v", i, got.Type, j, g, w)
		}
	})
}

// runCompare executes p on args with a counting allocator, compares every
// result with eval.Run's by cmp (after their types), checks the allocation
// discipline and returns the results.
func runCompare(t *testing.T, p *passes.Program, args []*ir.Literal, cmp func(i int, got, want *ir.Literal)) []*ir.Literal {
	t.Helper()
	want, err := eval.Run(p.Func, cloneAll(args))
	require.NoError(t, err)
	e, err := New(p)
	require.NoError(t, err)
	a := &countAlloc{}
	got, rel, err := e.Execute(args, a)
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for i := range want {
		require.True(t, got[i].Type.Equal(want[i].Type), "result %d: %v, want %v", i, got[i].Type, want[i].Type)
		cmp(i, got[i], want[i])
	}
	checkAllocs(t, p, a)
	a.requireReleased(t, false)
	for _, r := range rel {
		r()
	}
	a.requireReleased(t, true)
	return got
}

// checkAllocs checks one arena per space with a non-zero plan, of the
// planned size, and one allocation per non-aliased output.
func checkAllocs(t *testing.T, p *passes.Program, a *countAlloc) {
	t.Helper()
	aliased := map[int]bool{}
	for v, b := range p.Plan.Values {
		if b.Kind == passes.BufAlias && p.Func.Body.Results[b.Index] == v {
			aliased[b.Index] = true
		}
	}
	var arenas [2]int
	outputs := map[string]bool{}
	for _, r := range a.recs {
		if r.what == "temp arena" {
			arenas[r.space]++
			require.Equal(t, p.Plan.Arena[r.space], r.size, "arena size in %v", r.space)
			continue
		}
		require.False(t, outputs[r.what], "%s allocated twice", r.what)
		outputs[r.what] = true
	}
	for s := range arenas {
		want := 0
		if p.Plan.Arena[s] > 0 {
			want = 1
		}
		require.Equal(t, want, arenas[s], "arenas in %v", ir.MemorySpace(s))
	}
	for i, v := range p.Func.Body.Results {
		what := fmt.Sprintf("output %d", i)
		require.Equal(t, !aliased[i], outputs[what], "%s allocated", what)
		if !aliased[i] {
			for _, r := range a.recs {
				if r.what == what {
					require.Equal(t, v.Type.Bytes(), r.size)
					require.Equal(t, v.Type.Space, r.space)
				}
			}
		}
	}
}

func head(l *ir.Literal) []float64 {
	n := min(l.Type.Size(), 12)
	out := make([]float64, n)
	for i := range out {
		out[i] = l.Float64At(i)
	}
	return out
}
