package passes_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

func parse(t testing.TB, text string) *ir.Func {
	t.Helper()
	f, err := ir.Parse(text)
	require.NoError(t, err, "parsing\n%s", text)
	return f
}

// only disables every optional pass except the named ones.
func only(names ...string) passes.Options {
	var o passes.Options
	for _, p := range passes.Pipeline {
		if !p.Required && !slices.Contains(names, p.Name) {
			o.Disable = append(o.Disable, p.Name)
		}
	}
	return o
}

func TestPipelineTable(t *testing.T) {
	var names []string
	for _, p := range passes.Pipeline {
		names = append(names, p.Name)
		require.NotNil(t, p.Run, p.Name)
		require.NotEmpty(t, p.Doc, p.Name)
	}
	require.Equal(t, []string{"canonicalize", "constant-fold", "dot-layout", "cse", "reduce-scatter", "dce", "scan-sink", "recompute", "fusion", "schedule", "liveness", "prefetch", "buffer-assignment", "memory-analysis"}, names)
}

func TestCompileOptionErrors(t *testing.T) {
	f := parse(t, `func @f(%0: f32[2]) -> (f32[2]) {
  %1 = exp(%0) : f32[2]
  return %1
}`)
	_, err := passes.Compile(f, passes.Options{Disable: []string{"nope"}})
	require.ErrorContains(t, err, `unknown pass "nope"`)
	_, err = passes.Compile(f, passes.Options{Disable: []string{"buffer-assignment"}})
	require.ErrorContains(t, err, "required")
	_, err = passes.Compile(f, passes.Options{Donated: []bool{true, true}})
	require.ErrorContains(t, err, "donation flags")
	bad := ir.NewFunc("bad")
	bad.Body.Results = []*ir.Value{{ID: 5}}
	_, err = passes.Compile(bad, passes.Options{})
	require.Error(t, err)
}

// canonCases are programs and the op codes canonicalize (with dce) leaves.
var canonCases = []struct {
	name, ir string
	want     []string
}{
	{"int add zero", `func @f(%0: i32[4]) -> (i32[4]) {
  %1 = constant() {value=dense<i32[], 0>} : i32[]
  %2 = broadcast_in_dim(%1) {dims=[], shape=[4]} : i32[4]
  %3 = add(%2, %0) : i32[4]
  %4 = sub(%3, %2) : i32[4]
  return %4
}`, nil},
	{"float add +0 is kept", `func @f(%0: f32[4]) -> (f32[4]) {
  %1 = constant() {value=dense<f32[], 0>} : f32[]
  %2 = broadcast_in_dim(%1) {dims=[], shape=[4]} : f32[4]
  %3 = add(%0, %2) : f32[4]
  return %3
}`, []string{"constant", "broadcast_in_dim", "add"}},
	{"float add -0, sub +0", `func @f(%0: f32[4]) -> (f32[4]) {
  %1 = constant() {value=dense<f32[4], [-0, -0, -0, -0]>} : f32[4]
  %2 = add(%0, %1) : f32[4]
  %3 = constant() {value=dense<f32[], 0>} : f32[]
  %4 = broadcast_in_dim(%3) {dims=[], shape=[4]} : f32[4]
  %5 = sub(%2, %4) : f32[4]
  return %5
}`, nil},
	{"float sub -0 is kept", `func @f(%0: f32[4]) -> (f32[4]) {
  %1 = constant() {value=dense<f32[4], [-0, -0, -0, -0]>} : f32[4]
  %2 = sub(%0, %1) : f32[4]
  return %2
}`, []string{"constant", "sub"}},
	{"mul and div by one", `func @f(%0: f32[2,3]) -> (f32[2,3]) {
  %1 = constant() {value=dense<f32[], 1>} : f32[]
  %2 = broadcast_in_dim(%1) {dims=[], shape=[2,3]} : f32[2,3]
  %3 = mul(%2, %0) : f32[2,3]
  %4 = div(%3, %2) : f32[2,3]
  %5 = mul(%4, %2) : f32[2,3]
  return %5
}`, nil},
	{"double negation and select of equal operands", `func @f(%0: i32[3], %1: bool[3]) -> (i32[3]) {
  %2 = neg(%0) : i32[3]
  %3 = neg(%2) : i32[3]
  %4 = select(%1, %3, %3) : i32[3]
  return %4
}`, nil},
	{"reshape chains", `func @f(%0: f32[2,6]) -> (f32[3,4], f32[2,6]) {
  %1 = reshape(%0) {shape=[12]} : f32[12]
  %2 = reshape(%1) {shape=[3,4]} : f32[3,4]
  %3 = reshape(%2) {shape=[2,6]} : f32[2,6]
  return %2, %3
}`, []string{"reshape"}},
	{"transpose chains", `func @f(%0: f32[2,3,4]) -> (f32[2,3,4], f32[4,2,3]) {
  %1 = transpose(%0) {perm=[1,2,0]} : f32[3,4,2]
  %2 = transpose(%1) {perm=[2,0,1]} : f32[2,3,4]
  %3 = transpose(%1) {perm=[1,2,0]} : f32[4,2,3]
  %4 = transpose(%3) {perm=[0,1,2]} : f32[4,2,3]
  return %2, %4
}`, []string{"transpose"}},
	{"identity shape ops", `func @f(%0: f32[2,3]{pinned_host}) -> (f32[2,3]) {
  %1 = device_put(%0) {space=#device} : f32[2,3]
  %2 = device_put(%1) {space=#device} : f32[2,3]
  %3 = convert(%2) {dtype=f32} : f32[2,3]
  %4 = broadcast_in_dim(%3) {dims=[0,1], shape=[2,3]} : f32[2,3]
  %5 = slice(%4) {limit=[2,3], start=[0,0], strides=[1,1]} : f32[2,3]
  %6 = bitcast_convert(%5) {dtype=f32} : f32[2,3]
  %7 = transpose(%6) {perm=[0,1]} : f32[2,3]
  %8 = reshape(%7) {shape=[2,3]} : f32[2,3]
  return %8
}`, []string{"device_put"}},
	{"partial slice is kept", `func @f(%0: f32[4]) -> (f32[2]) {
  %1 = slice(%0) {limit=[4], start=[2], strides=[1]} : f32[2]
  return %1
}`, []string{"slice"}},
	{"broadcast of broadcast", `func @f(%0: f32[3]) -> (f32[4,2,3]) {
  %1 = broadcast_in_dim(%0) {dims=[1], shape=[2,3]} : f32[2,3]
  %2 = broadcast_in_dim(%1) {dims=[1,2], shape=[4,2,3]} : f32[4,2,3]
  return %2
}`, []string{"broadcast_in_dim"}},
}

func TestCanonicalize(t *testing.T) {
	for _, c := range canonCases {
		t.Run(c.name, func(t *testing.T) {
			f := parse(t, c.ir)
			p := checkSame(t, f, only("canonicalize", "dce"))
			require.Equal(t, c.want, codes(p.Func.Body), "%s", p.Func)
		})
	}
}

func TestCanonicalizeComposedAttrs(t *testing.T) {
	p := checkSame(t, parse(t, canonCases[7].ir), only("canonicalize", "dce"))
	require.Equal(t, []int{2, 0, 1}, p.Func.Body.Ops[0].Attrs.Ints("perm"))
	p = checkSame(t, parse(t, canonCases[10].ir), only("canonicalize", "dce"))
	require.Equal(t, []int{2}, p.Func.Body.Ops[0].Attrs.Ints("dims"))
}

func TestConstantFold(t *testing.T) {
	f := parse(t, `func @f(%0: f32[2048]) -> (f32[2048], f32[3], i32[]) {
  %1 = constant() {value=dense<f32[], 2>} : f32[]
  %2 = broadcast_in_dim(%1) {dims=[], shape=[2048]} : f32[2048]
  %3 = constant() {value=dense<f32[], 3>} : f32[]
  %4 = broadcast_in_dim(%3) {dims=[], shape=[2048]} : f32[2048]
  %5 = mul(%2, %4) : f32[2048]
  %6 = exp(%5) : f32[2048]
  %7 = add(%0, %6) : f32[2048]
  %8 = constant() {value=dense<f32[3], [1, 2, 3]>} : f32[3]
  %9 = exp(%8) : f32[3]
  %10 = constant() {value=dense<i32[3], [4, 5, 6]>} : i32[3]
  %11 = reduce_sum(%10) {axes=[0]} : i32[]
  return %7, %9, %11
}`)
	p := checkSame(t, f, only("constant-fold", "dce"))
	body := p.Func.Body
	require.Equal(t, []string{"constant", "broadcast_in_dim", "add", "constant", "constant"}, codes(body), "%s", p.Func)
	for _, op := range body.Ops {
		if op.Code == ir.Constant {
			require.LessOrEqual(t, op.Result().Type.Size(), 3, "no large literal")
		}
	}
	require.Equal(t, int32(15), ir.View[int32](body.Ops[4].Attrs.Literal("value"))[0])
}

func TestCSE(t *testing.T) {
	f := parse(t, `func @f(%0: f32[4], %1: f32[4]) -> (f32[4], f32[4], f32[4], f32[4]) {
  %2 = exp(%0) : f32[4]
  %3 = exp(%0) : f32[4]
  %4 = add(%2, %3) : f32[4]
  %5 = add(%3, %2) : f32[4]
  %6 = constant() {value=dense<f32[], 1.5>} : f32[]
  %7 = constant() {value=dense<f32[], 1.5>} : f32[]
  %8 = constant() {value=dense<f32[], 2.5>} : f32[]
  %9 = broadcast_in_dim(%6) {dims=[], shape=[4]} : f32[4]
  %10 = broadcast_in_dim(%7) {dims=[], shape=[4]} : f32[4]
  %11 = broadcast_in_dim(%8) {dims=[], shape=[4]} : f32[4]
  %12 = mul(%9, %1) : f32[4]
  %13 = mul(%10, %1) : f32[4]
  %14 = mul(%11, %1) : f32[4]
  return %4, %5, %12, %14
}`)
	p := checkSame(t, f, only("cse", "dce"))
	require.Equal(t, []string{"exp", "add", "constant", "constant", "broadcast_in_dim", "broadcast_in_dim", "mul", "mul"}, codes(p.Func.Body), "%s", p.Func)
	r := p.Func.Body.Results
	require.Same(t, r[0], r[1], "add(a, a) twice is one op")
	_ = f
}

func TestCSESkipsRegionOps(t *testing.T) {
	f := parse(t, `func @f(%0: f32[4]) -> (f32[4], f32[4]) {
  %3 = scan(%0) {length=2, num_carry=1, num_consts=0} (
    ^(%1: f32[4]) {
      %2 = exp(%1) : f32[4]
      return %2
    }) : f32[4]
  %6 = scan(%0) {length=2, num_carry=1, num_consts=0} (
    ^(%4: f32[4]) {
      %5 = exp(%4) : f32[4]
      return %5
    }) : f32[4]
  return %3, %6
}`)
	p := checkSame(t, f, only("cse", "dce"))
	require.Equal(t, []string{"scan", "scan"}, codes(p.Func.Body))
}

func TestDCERegions(t *testing.T) {
	f := parse(t, `func @f(%0: f32[4], %1: f32[3,4], %2: f32[3,4], %11: f32[4]) -> (f32[3,4], f32[4]) {
  %8, %9, %10, %12 = scan(%11, %0, %1, %2) {length=3, num_carry=1, num_consts=1, reverse=true} (
    ^(%13: f32[4], %3: f32[4], %4: f32[4], %5: f32[4]) {
      %6 = add(%3, %4) : f32[4]
      %7 = exp(%5) : f32[4]
      %14 = tanh(%6) : f32[4]
      %15 = mul(%6, %6) : f32[4]
      return %6, %7, %14, %15
    }) : f32[4], f32[3,4], f32[3,4], f32[3,4]
  %16 = exp(%0) : f32[4]
  %17 = constant() {value=dense<bool[], true>} : bool[]
  %20, %21 = cond(%17, %0, %16) (
    ^(%18: f32[4], %19: f32[4]) {
      %22 = neg(%18) : f32[4]
      return %22, %19
    },
    ^(%23: f32[4], %24: f32[4]) {
      return %23, %24
    }) : f32[4], f32[4]
  return %12, %20
}`)
	p := checkSame(t, f, only("dce"))
	body := p.Func.Body
	require.Equal(t, []string{"scan", "constant", "cond"}, codes(body), "%s", p.Func)
	scan := body.Ops[0]
	require.Equal(t, 0, scan.Attrs.Int("num_consts"), "the unused const goes")
	require.Equal(t, []*ir.Value{body.Params[0], body.Params[1]}, scan.Args, "carry and the one xs still read")
	require.Len(t, scan.Results, 2, "carry and the used ys")
	require.Equal(t, []string{"add", "mul"}, codes(scan.Regions[0]))
	cond := body.Ops[2]
	require.Len(t, cond.Results, 1)
	require.Len(t, cond.Args, 2, "pred and %0: exp(%0) is gone")
}

// TestScheduleFreesEarly: the traced order keeps two large products live at
// once; the scheduler reduces each right after its product.
func TestScheduleFreesEarly(t *testing.T) {
	f := parse(t, `func @f(%0: f32[64,64], %1: f32[64,64], %2: f32[64,64]) -> (f32[]) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[64,64]
  %4 = dot_general(%0, %2) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[64,64]
  %5 = reduce_sum(%3) {axes=[0,1]} : f32[]
  %6 = reduce_sum(%4) {axes=[0,1]} : f32[]
  %7 = add(%5, %6) : f32[]
  return %7
}`)
	traced := checkSame(t, f, only())
	sched := checkSame(t, f, only("schedule"))
	require.GreaterOrEqual(t, traced.Analysis.TempBytes, int64(2*64*64*4))
	require.Less(t, sched.Analysis.TempBytes, traced.Analysis.TempBytes)
	require.Equal(t, []string{"dot_general", "reduce_sum", "dot_general", "reduce_sum", "add"}, codes(sched.Func.Body))
}

// TestScheduleNeverWorse compiles random programs with and without the
// scheduler: the arena never grows.
func TestScheduleNeverWorse(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		f := randprog.New(seed, randprog.All())
		with, err := passes.Compile(f, passes.Options{})
		require.NoError(t, err)
		without, err := passes.Compile(f, passes.Options{Disable: []string{"schedule"}})
		require.NoError(t, err)
		require.LessOrEqual(t, with.Analysis.TempBytes, without.Analysis.TempBytes, "seed %d", seed)
	}
}

func TestDonationAlias(t *testing.T) {
	// %0 is donated and dies at the add that makes result 0: aliased (read
	// element for element). %1 is donated but read after result 1 is made.
	f := parse(t, `func @f(%0: f32[8], %1: f32[8], %2: f32[8]) -> (f32[8], f32[8], f32[8]) {
  %3 = add(%0, %2) : f32[8]
  %4 = exp(%3) : f32[8]
  %5 = mul(%1, %4) : f32[8]
  %6 = dot_general(%1, %5) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[]
  %7 = broadcast_in_dim(%6) {dims=[], shape=[8]} : f32[8]
  return %3, %5, %7
}`)
	p := checkSame(t, f, passes.Options{Donated: []bool{true, true, false}, Disable: []string{"fusion"}})
	v := p.Plan.Values
	r := p.Func.Body.Results
	require.Equal(t, passes.Buffer{Kind: passes.BufAlias, Space: ir.Device, Size: 32, Index: 0, Param: 0}, v[r[0]])
	require.Equal(t, passes.BufOutput, v[r[1]].Kind, "%1 is read after result 1 is written")
	require.Equal(t, passes.BufAlias, v[r[2]].Kind, "%1 is dead by result 2")
	require.Equal(t, 1, v[r[2]].Param)
	require.Equal(t, int64(64), p.Analysis.AliasBytes)
	require.Equal(t, int64(96), p.Analysis.OutputBytes)
}

func TestResultsParamAndTwice(t *testing.T) {
	f := parse(t, `func @f(%0: f32[8]) -> (f32[8], f32[8], f32[8], f32[8]) {
  %1 = exp(%0) : f32[8]
  return %0, %1, %1, %0
}`)
	p := checkSame(t, f, passes.Options{Donated: []bool{true}})
	v := p.Plan.Values
	require.Equal(t, passes.BufParam, v[p.Func.Body.Params[0]].Kind)
	// %0 is returned, so it lives to the end and cannot be aliased.
	require.Equal(t, passes.Buffer{Kind: passes.BufOutput, Space: ir.Device, Size: 32, Index: 1}, v[p.Func.Body.Results[1]])
	require.Equal(t, int64(4*32), p.Analysis.OutputBytes)
}

func TestInPlace(t *testing.T) {
	f := parse(t, `func @f(%0: f32[256]) -> (f32[]) {
  %1 = exp(%0) : f32[256]
  %2 = dot_general(%1, %1) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[]
  %3 = broadcast_in_dim(%2) {dims=[], shape=[256]} : f32[256]
  %4 = mul(%1, %3) : f32[256]
  %5 = tanh(%4) : f32[256]
  %6 = reduce_sum(%5) {axes=[0]} : f32[]
  return %6
}`)
	p := checkSame(t, f, only())
	v := p.Plan.Values
	ops := p.Func.Body.Ops
	exp, bc, mul, tanh := v[ops[0].Result()], v[ops[2].Result()], v[ops[3].Result()], v[ops[4].Result()]
	require.Equal(t, exp, mul, "mul in place over exp, which dies there")
	require.Equal(t, mul, tanh, "tanh in place over mul")
	require.NotEqual(t, exp.Offset, bc.Offset)
	require.Equal(t, int64(2*1024+4), p.Analysis.TempBytes, "exp/mul/tanh, the broadcast, and the dot's scalar")
}

func TestDumpIR(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("FERRY_DUMP_IR", dir)
	f := layersForward(2, 4, 4, 8)
	f.Name = "dump me"
	compile(t, f, passes.Options{})
	files, err := filepath.Glob(filepath.Join(dir, "*.ir"))
	require.NoError(t, err)
	require.Len(t, files, len(passes.Pipeline)+1, "the input and one file per pass")
	plans, err := filepath.Glob(filepath.Join(dir, "*-exec.plan"))
	require.NoError(t, err)
	require.Len(t, plans, 1, "the executable plan")
	text, err := os.ReadFile(plans[0])
	require.NoError(t, err)
	require.Contains(t, string(text), "= loop scan(", "the executable plan's text form")
	var names []string
	for _, fn := range files {
		names = append(names, filepath.Base(fn))
		data, err := os.ReadFile(fn)
		require.NoError(t, err)
		_, err = ir.Parse(string(data))
		require.NoError(t, err, "%s parses", fn)
	}
	slices.Sort(names)
	seq := strings.SplitN(names[0], "-", 2)[0]
	want := []string{seq + "-dump_me-00-input.ir"}
	for i, p := range passes.Pipeline {
		want = append(want, seq+"-dump_me-"+twoDigits(i+1)+"-"+p.Name+".ir")
	}
	require.Equal(t, want, names)
	plan, err := os.ReadFile(filepath.Join(dir, want[1+slices.IndexFunc(passes.Pipeline, func(p passes.Pass) bool { return p.Name == "buffer-assignment" })]))
	require.NoError(t, err)
	require.Contains(t, string(plan), "// buffer plan after buffer-assignment:")
	require.Contains(t, string(plan), "temp device @")

	// Disabled passes write nothing; DumpDir overrides the variable.
	dir2 := t.TempDir()
	compile(t, f, passes.Options{DumpDir: dir2, Disable: []string{"fusion", "cse"}})
	files, err = filepath.Glob(filepath.Join(dir2, "*.ir"))
	require.NoError(t, err)
	require.Len(t, files, len(passes.Pipeline)-1)
}

func twoDigits(i int) string {
	return string([]byte{byte('0' + i/10), byte('0' + i%10)})
}

func TestCompileLeavesInputAlone(t *testing.T) {
	f := layersGrad(2, 4, 4, 8)
	before := f.String()
	orig := map[*ir.Op]bool{}
	f.Body.Walk(func(op *ir.Op) { orig[op] = true })
	p := compile(t, f, passes.Options{})
	require.Equal(t, before, f.String())
	p.Func.Body.Walk(func(op *ir.Op) { require.False(t, orig[op], "%v is shared with the input", op.Code) })
}

// VerifyFromEnv is true exactly when $FERRY_VERIFY_IR is non-empty.
func TestVerifyFromEnv(t *testing.T) {
	for env, want := range map[string]bool{"": false, "1": true, "yes": true} {
		t.Setenv(passes.EnvVerifyIR, env)
		if got := passes.VerifyFromEnv(); got != want {
			t.Errorf("%s=%q: passes.VerifyFromEnv() = %v, want %v", passes.EnvVerifyIR, env, got, want)
		}
	}
}
