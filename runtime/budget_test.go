package runtime_test

import (
	"errors"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// budgetModel is a small scanned model: L layers x = tanh(x @ w1[l]) @ w2[l],
// loss sum(x), differentiated with respect to w1 and w2.
type budgetModel struct{ L, B, D, H int }

type budgetW struct{ W1, W2 *trace.Array }

func budgetLayer(x *trace.Array, w budgetW) *trace.Array {
	return trace.MatMul(trace.Tanh(trace.MatMul(x, w.W1)), w.W2)
}

func budgetGrad(layer func(*trace.Array, budgetW) *trace.Array) func(w budgetW, x *trace.Array) budgetW {
	return func(w budgetW, x *trace.Array) budgetW {
		return trace.Grad(func(w budgetW) *trace.Array {
			final, _ := trace.ScanTree(func(x *trace.Array, w budgetW) (*trace.Array, struct{}) {
				return layer(x, w), struct{}{}
			}, x, w)
			return trace.Sum(final)
		})(w)
	}
}

type budgetData struct {
	m         budgetModel
	x, w1, w2 []float64
	gw1, gw2  []float64 // float64 reference gradients
	xa        *trace.Array
	w         budgetW
}

func newBudgetData(m budgetModel, seed uint64) *budgetData {
	r := rand.New(rand.NewPCG(seed, 7))
	rnd := func(n int, s float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = r.NormFloat64() * s
		}
		return v
	}
	d := &budgetData{m: m, x: rnd(m.B*m.D, 1), w1: rnd(m.L*m.D*m.H, 1/math.Sqrt(float64(m.D))), w2: rnd(m.L*m.H*m.D, 1/math.Sqrt(float64(m.H)))}
	f32 := func(v []float64) []float32 {
		o := make([]float32, len(v))
		for i, x := range v {
			o[i] = float32(x)
		}
		return o
	}
	// Round the inputs to f32 so that the reference sees what the model sees.
	for _, v := range [][]float64{d.x, d.w1, d.w2} {
		for i := range v {
			v[i] = float64(float32(v[i]))
		}
	}
	d.xa = rt.FromSlice(f32(d.x), m.B, m.D)
	d.w = budgetW{W1: rt.FromSlice(f32(d.w1), m.L, m.D, m.H), W2: rt.FromSlice(f32(d.w2), m.L, m.H, m.D)}
	d.reference()
	return d
}

// reference computes the gradients in float64 by hand.
func (d *budgetData) reference() {
	m := d.m
	B, D, H := m.B, m.D, m.H
	xs := make([][]float64, m.L+1)
	hs := make([][]float64, m.L)
	xs[0] = d.x
	for l := 0; l < m.L; l++ {
		w1, w2 := d.w1[l*D*H:(l+1)*D*H], d.w2[l*H*D:(l+1)*H*D]
		h := make([]float64, B*H)
		for b := 0; b < B; b++ {
			for j := 0; j < H; j++ {
				s := 0.0
				for k := 0; k < D; k++ {
					s += xs[l][b*D+k] * w1[k*H+j]
				}
				h[b*H+j] = math.Tanh(s)
			}
		}
		x := make([]float64, B*D)
		for b := 0; b < B; b++ {
			for j := 0; j < D; j++ {
				s := 0.0
				for k := 0; k < H; k++ {
					s += h[b*H+k] * w2[k*D+j]
				}
				x[b*D+j] = s
			}
		}
		hs[l], xs[l+1] = h, x
	}
	d.gw1, d.gw2 = make([]float64, len(d.w1)), make([]float64, len(d.w2))
	g := make([]float64, B*D)
	for i := range g {
		g[i] = 1
	}
	for l := m.L - 1; l >= 0; l-- {
		w1, w2 := d.w1[l*D*H:(l+1)*D*H], d.w2[l*H*D:(l+1)*H*D]
		gw1, gw2 := d.gw1[l*D*H:(l+1)*D*H], d.gw2[l*H*D:(l+1)*H*D]
		h := hs[l]
		da := make([]float64, B*H)
		for b := 0; b < B; b++ {
			for k := 0; k < H; k++ {
				s := 0.0
				for j := 0; j < D; j++ {
					gw2[k*D+j] += h[b*H+k] * g[b*D+j]
					s += g[b*D+j] * w2[k*D+j]
				}
				da[b*H+k] = s * (1 - h[b*H+k]*h[b*H+k])
			}
		}
		ng := make([]float64, B*D)
		for b := 0; b < B; b++ {
			for k := 0; k < D; k++ {
				s := 0.0
				for j := 0; j < H; j++ {
					gw1[k*H+j] += xs[l][b*D+k] * da[b*H+j]
					s += da[b*H+j] * w1[k*H+j]
				}
				ng[b*D+k] = s
			}
		}
		g = ng
	}
}

func (d *budgetData) check(t *testing.T, g budgetW) {
	t.Helper()
	for _, p := range []struct {
		name string
		got  []float32
		want []float64
	}{{"w1", g.W1.Float32s(), d.gw1}, {"w2", g.W2.Float32s(), d.gw2}} {
		require.Len(t, p.got, len(p.want))
		scale := 0.0
		for _, w := range p.want {
			scale = math.Max(scale, math.Abs(w))
		}
		for i, w := range p.want {
			require.InDelta(t, w, float64(p.got[i]), 1e-4*scale+1e-5, "%s[%d]", p.name, i)
		}
	}
}

// compileBudget compiles budgetGrad(layer) for d under opts.
func compileBudget(t *testing.T, d *budgetData, layer func(*trace.Array, budgetW) *trace.Array, opts ...rt.Option) (*rt.Compiled, error) {
	t.Helper()
	l, err := rt.NewJitted(budgetGrad(layer), opts...).Lower(d.w, d.xa)
	if err != nil {
		return nil, err
	}
	return l.Compile()
}

func runBudget(t *testing.T, c *rt.Compiled, d *budgetData) budgetW {
	t.Helper()
	out, err := c.Call(d.w, d.xa)
	require.NoError(t, err)
	return out[0].(budgetW)
}

func TestMemoryBudgetFitsAndKeepsGradients(t *testing.T) {
	d := newBudgetData(budgetModel{L: 6, B: 16, D: 32, H: 64}, testseed.Uint64(t))
	base, err := compileBudget(t, d, budgetLayer)
	require.NoError(t, err)
	require.Nil(t, base.MemoryPlan())
	d.check(t, runBudget(t, base, d))
	baseline := base.MemoryAnalysis().TotalBytes()

	// The minimum: a budget of one byte names it.
	_, err = compileBudget(t, d, budgetLayer, rt.MemoryBudget(1))
	var be *rt.MemoryBudgetError
	require.ErrorAs(t, err, &be)
	require.Less(t, be.Minimum, baseline)
	require.Equal(t, baseline, be.Baseline)
	require.Contains(t, err.Error(), "smallest budget that fits")
	require.NotEmpty(t, be.Dominant)
	t.Log(err)

	for i := 0; i <= 4; i++ {
		budget := be.Minimum + (baseline-be.Minimum)*int64(i)/4
		c, err := compileBudget(t, d, budgetLayer, rt.MemoryBudget(budget))
		require.NoError(t, err, "budget %d", budget)
		ma := c.MemoryAnalysis()
		require.LessOrEqual(t, ma.TotalBytes(), budget)
		p := c.MemoryPlan()
		require.NotNil(t, p)
		require.Equal(t, budget, p.Budget)
		require.Equal(t, ma.TotalBytes(), p.TotalBytes)
		require.Contains(t, ma.String(), "memory plan")
		t.Logf("budget %d: %v", budget, p)
		d.check(t, runBudget(t, c, d))
	}
	// Just below the minimum: the error again.
	_, err = compileBudget(t, d, budgetLayer, rt.MemoryBudget(be.Minimum-1))
	require.ErrorAs(t, err, &be)
}

func TestMemoryBudgetRespectsUserRemat(t *testing.T) {
	d := newBudgetData(budgetModel{L: 4, B: 8, D: 16, H: 32}, testseed.Uint64(t))
	// The user offloads the layer input and recomputes the rest.
	user := trace.Remat(func(x *trace.Array, w budgetW) *trace.Array {
		return budgetLayer(trace.CheckpointName(x, "x"), w)
	}, trace.SaveAndOffloadOnlyTheseNames(nil, []string{"x"}, ir.Device, ir.PinnedHost))
	plain, err := compileBudget(t, d, user)
	require.NoError(t, err)
	// A budget the user's choice already fits: nothing changes.
	c, err := compileBudget(t, d, user, rt.MemoryBudget(plain.MemoryAnalysis().TotalBytes()))
	require.NoError(t, err)
	require.Equal(t, plain.MemoryAnalysis().TotalBytes(), c.MemoryAnalysis().TotalBytes())
	require.Equal(t, plain.MemoryAnalysis().HostTempBytes, c.MemoryAnalysis().HostTempBytes)
	for _, v := range c.MemoryPlan().Values {
		require.Equal(t, "keep", v.Action, "%+v", v)
	}
	d.check(t, runBudget(t, c, d))
	// Under a budget that needs more the user's choice stays: nothing is
	// left to plan but the weights' placement, so at the smallest budget the
	// weights are in pinned_host and every residual is as the user said.
	_, err = compileBudget(t, d, user, rt.MemoryBudget(1))
	var be *rt.MemoryBudgetError
	require.ErrorAs(t, err, &be)
	require.Less(t, be.Minimum, plain.MemoryAnalysis().TotalBytes())
	c, err = compileBudget(t, d, user, rt.MemoryBudget(be.Minimum))
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, c.MemoryPlan().HostArguments())
	for _, v := range c.MemoryPlan().Values {
		require.Contains(t, []string{"keep", "stream", passes.ActionHostArgument}, v.Action, "%+v", v)
	}
	require.Equal(t, plain.MemoryAnalysis().HostTempBytes, c.MemoryAnalysis().HostTempBytes, "the user's offload")
	d.check(t, runBudget(t, c, d))
}

// A function that traces differently each time cannot be planned: the
// error says so instead of mixing up the decisions.
func TestMemoryBudgetUnstableTrace(t *testing.T) {
	d := newBudgetData(budgetModel{L: 3, B: 64, D: 16, H: 32}, testseed.Uint64(t))
	traces := 0
	unstable := func(x *trace.Array, w budgetW) *trace.Array {
		traces++
		h := trace.MatMul(x, w.W1)
		if traces%2 == 0 {
			h = trace.Exp(h)
		} else {
			h = trace.Tanh(h)
		}
		return trace.MatMul(h, w.W2)
	}
	base, err := compileBudget(t, d, budgetLayer)
	require.NoError(t, err)
	_, err = compileBudget(t, d, unstable, rt.MemoryBudget(base.MemoryAnalysis().TotalBytes()*9/10))
	require.ErrorContains(t, err, "traced differently")
}

func TestParseMemoryBudget(t *testing.T) {
	for s, want := range map[string]int64{"3000000": 3000000, "512M": 512 << 20, "2k": 2048, "1.5G": 3 << 29, "64MiB": 64 << 20, "1MB": 1e6, "device": -1, " Device ": -1} {
		got, err := rt.ParseMemoryBudget(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "abc", "-5M", "0", "12X", "M"} {
		_, err := rt.ParseMemoryBudget(s)
		require.Error(t, err, s)
		require.Contains(t, err.Error(), rt.EnvMemoryBudget, s)
	}
}

func TestMemoryBudgetEnv(t *testing.T) {
	d := newBudgetData(budgetModel{L: 3, B: 8, D: 16, H: 32}, testseed.Uint64(t))
	t.Setenv(rt.EnvMemoryBudget, "lots")
	_, err := compileBudget(t, d, budgetLayer)
	require.Error(t, err)
	require.Contains(t, err.Error(), rt.EnvMemoryBudget)
	require.Contains(t, err.Error(), "lots")

	t.Setenv(rt.EnvMemoryBudget, "1")
	_, err = compileBudget(t, d, budgetLayer)
	var be *rt.MemoryBudgetError
	require.True(t, errors.As(err, &be), "%v", err)

	// The option wins over the environment.
	t.Setenv(rt.EnvMemoryBudget, "1")
	c, err := compileBudget(t, d, budgetLayer, rt.MemoryBudget(1<<40))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(c.MemoryPlan().String(), "memory plan"))

	_, err = compileBudget(t, d, budgetLayer, rt.MemoryBudget(-3))
	require.ErrorContains(t, err, "positive")
}

// Weights kept in pinned_host stream into a planned scan body: the body
// needs no device_put of its own, the argument bytes on device drop, and the
// gradients are unchanged.
func TestMemoryBudgetStreamsHostParams(t *testing.T) {
	d := newBudgetData(budgetModel{L: 4, B: 8, D: 16, H: 32}, testseed.Uint64(t))
	hw := budgetW{W1: trace.DevicePut(d.w.W1, ir.PinnedHost), W2: trace.DevicePut(d.w.W2, ir.PinnedHost)}
	// Without a budget the layer's matrix product refuses host operands.
	_, err := rt.NewJitted(budgetGrad(budgetLayer)).Lower(hw, d.xa)
	require.Error(t, err)

	j := rt.NewJitted(budgetGrad(budgetLayer), rt.MemoryBudget(1<<30))
	l, err := j.Lower(hw, d.xa)
	require.NoError(t, err)
	c, err := l.Compile()
	require.NoError(t, err)
	ma := c.MemoryAnalysis()
	require.Equal(t, int64(d.m.B*d.m.D*4), ma.ArgumentBytes, "only x is a device argument")
	require.Equal(t, hw.W1.Type().Bytes()+hw.W2.Type().Bytes(), ma.HostArgumentBytes)
	streams := 0
	for _, v := range c.MemoryPlan().Values {
		if v.Action == "stream" {
			streams++
		}
	}
	require.Equal(t, 2, streams, "w1 and w2 stream in: %v", c.MemoryPlan())
	out, err := c.Call(hw, d.xa)
	require.NoError(t, err)
	d.check(t, out[0].(budgetW))
}

// FERRY_DUMP_IR writes the plan beside the buffer plan's analysis.
func TestMemoryBudgetDumpsPlan(t *testing.T) {
	d := newBudgetData(budgetModel{L: 3, B: 8, D: 16, H: 32}, testseed.Uint64(t))
	dir := t.TempDir()
	t.Setenv("FERRY_DUMP_IR", dir)
	_, err := compileBudget(t, d, budgetLayer, rt.MemoryBudget(1<<30), rt.WithName("dumped"))
	require.NoError(t, err)
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	found := false
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f.Name()))
		require.NoError(t, err)
		require.NotContains(t, f.Name(), "ferry_rate_probe")
		if strings.Contains(string(b), "// memory plan for a budget of 1.00 GiB") {
			found = true
		}
	}
	require.True(t, found, "no dump shows the plan")
}

// A scan body with control flow of its own is left as written; the scan
// nested in it is planned. The gradients stay those of the plain program.
func TestMemoryBudgetNestedScan(t *testing.T) {
	d := newBudgetData(budgetModel{L: 4, B: 8, D: 16, H: 32}, testseed.Uint64(t))
	nested := func(w budgetW, x *trace.Array) budgetW {
		return trace.Grad(func(w budgetW) *trace.Array {
			// Two outer iterations of two layers each.
			ws := budgetW{W1: trace.Reshape(w.W1, 2, 2, d.m.D, d.m.H), W2: trace.Reshape(w.W2, 2, 2, d.m.H, d.m.D)}
			final, _ := trace.ScanTree(func(x *trace.Array, w budgetW) (*trace.Array, struct{}) {
				y, _ := trace.ScanTree(func(x *trace.Array, w budgetW) (*trace.Array, struct{}) {
					return budgetLayer(x, w), struct{}{}
				}, x, w)
				return trace.Tanh(y), struct{}{}
			}, x, ws)
			return trace.Sum(final)
		})(w)
	}
	plain, err := rt.NewJitted(nested).Lower(d.w, d.xa)
	require.NoError(t, err)
	pc, err := plain.Compile()
	require.NoError(t, err)
	out, err := pc.Call(d.w, d.xa)
	require.NoError(t, err)
	want := out[0].(budgetW)
	total := pc.MemoryAnalysis().TotalBytes()

	_, err = rt.NewJitted(nested, rt.MemoryBudget(1)).Lower(d.w, d.xa)
	var be *rt.MemoryBudgetError
	require.ErrorAs(t, err, &be)
	require.Less(t, be.Minimum, total, "the inner scan's residuals are planned")
	l, err := rt.NewJitted(nested, rt.MemoryBudget(be.Minimum)).Lower(d.w, d.xa)
	require.NoError(t, err)
	c, err := l.Compile()
	require.NoError(t, err)
	require.LessOrEqual(t, c.MemoryAnalysis().TotalBytes(), be.Minimum)
	out, err = c.Call(d.w, d.xa)
	require.NoError(t, err)
	got := out[0].(budgetW)
	require.InDeltaSlice(t, want.W1.Float32s(), got.W1.Float32s(), 1e-5)
	require.InDeltaSlice(t, want.W2.Float32s(), got.W2.Float32s(), 1e-5)
}

// MemoryBudgetDeviceCapacity budgets the allocator's limit.
func TestMemoryBudgetDeviceCapacity(t *testing.T) {
	collectGarbage()
	require.NoError(t, rt.ConfigureMemory(rt.MemoryConfig{Capacity: 64 << 20, Fraction: 0.5}))
	defer func() {
		collectGarbage()
		require.NoError(t, rt.ConfigureMemory(rt.MemoryConfig{}))
	}()
	d := newBudgetData(budgetModel{L: 3, B: 8, D: 16, H: 32}, testseed.Uint64(t))
	defer func() {
		for _, a := range []*trace.Array{d.xa, d.w.W1, d.w.W2} {
			_ = a.Delete()
		}
	}()
	c, err := compileBudget(t, d, budgetLayer, rt.MemoryBudgetDeviceCapacity())
	require.NoError(t, err)
	require.Equal(t, rt.MemoryStats(ir.Device).Limit, c.MemoryPlan().Budget)
	require.Equal(t, int64(32<<20), c.MemoryPlan().Budget)
}

// A function differentiated at the top level without scans (layers
// unrolled in Go) is planned too.
func TestMemoryBudgetUnrolled(t *testing.T) {
	d := newBudgetData(budgetModel{L: 4, B: 256, D: 16, H: 64}, testseed.Uint64(t))
	unrolled := func(w budgetW, x *trace.Array) budgetW {
		return trace.Grad(func(w budgetW) *trace.Array {
			for i := range d.m.L {
				x = budgetLayer(x, budgetW{W1: trace.Index(w.W1, i), W2: trace.Index(w.W2, i)})
			}
			return trace.Sum(x)
		})(w)
	}
	compile := func(opts ...rt.Option) (*rt.Compiled, error) {
		l, err := rt.NewJitted(unrolled, opts...).Lower(d.w, d.xa)
		if err != nil {
			return nil, err
		}
		return l.Compile()
	}
	plain, err := compile()
	require.NoError(t, err)
	total := plain.MemoryAnalysis().TotalBytes()
	_, err = compile(rt.MemoryBudget(1))
	var be *rt.MemoryBudgetError
	require.ErrorAs(t, err, &be)
	require.Less(t, be.Minimum, total)
	for _, b := range []int64{be.Minimum, (be.Minimum + total) / 2, total} {
		c, err := compile(rt.MemoryBudget(b))
		require.NoError(t, err)
		require.LessOrEqual(t, c.MemoryAnalysis().TotalBytes(), b)
		t.Log(c.MemoryPlan())
		d.check(t, runBudget(t, c, d))
	}
}

// TestMemoryBudgetMinimumIndependentOfRates: the rates (measured, so
// varying with the machine's load; fixed here by FERRY_BUDGET_RATES) steer
// the planner between recomputing and offloading, but not what fits: the
// smallest minimum any rates reach fits under every rates.
func TestMemoryBudgetMinimumIndependentOfRates(t *testing.T) {
	d := newBudgetData(budgetModel{L: 4, B: 16, D: 32, H: 64}, testseed.Uint64(t))
	settings := []string{"1e11,2e9,5e9", "1e10,1e10,1e8", "1e12,1e12,1e6", "1e12,1e6,1e12"}
	least := int64(math.MaxInt64)
	for _, r := range settings {
		t.Setenv(rt.EnvBudgetRates, r)
		_, err := compileBudget(t, d, budgetLayer, rt.MemoryBudget(1))
		var be *rt.MemoryBudgetError
		require.ErrorAs(t, err, &be)
		t.Logf("rates %s: minimum %d", r, be.Minimum)
		least = min(least, be.Minimum)
	}
	for _, r := range settings {
		t.Setenv(rt.EnvBudgetRates, r)
		c, err := compileBudget(t, d, budgetLayer, rt.MemoryBudget(least))
		require.NoError(t, err, "rates %s, budget %d", r, least)
		require.LessOrEqual(t, c.MemoryAnalysis().TotalBytes(), least)
		d.check(t, runBudget(t, c, d))
	}
}
