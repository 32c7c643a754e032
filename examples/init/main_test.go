package main

import (
	"bytes"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestMain gives the CPU backend the 8 virtual devices of the sharded
// cases' meshes, as main does.
func TestMain(m *testing.M) {
	if err := rt.SetCPUDeviceCount(meshDevices); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// testSizes are small versions of every measured case (a 256 KiB pairwise
// tensor, a 512 KiB matrix, 0.25 MiB stacks), a 128 MiB matrix analysed, and
// the 7B-size stack analysed at the program's size (compiling it costs what
// a small one does).
var testSizes = sizes{
	Nodes: 64, Channels: 16,
	MatRows: 256, MatCols: 512,
	FullRows: 4096, FullCols: 8192,
	Layers: 4, DModel: 64, Heads: 2, Hidden: 128,
	BigLayers: programSizes.BigLayers,
	BigDModel: programSizes.BigDModel,
	BigHeads:  programSizes.BigHeads,
	BigHidden: programSizes.BigHidden,
}

// stackBytes counts the bytes of L bf16 Transformer blocks of width d and MLP
// width hidden: two LayerNorms (scale and bias, 2d each), the four d×d
// attention projections, and the MLP's d×hidden and hidden×d weights with
// their biases.
func stackBytes(L, d, hidden int) int64 {
	perLayer := 2*2*d + 4*d*d + d*hidden + hidden + hidden*d + d
	return int64(L) * int64(perLayer) * 2
}

// stackCases are the rows of stacked-block initialisers; their peak (or
// analysed total) must be at most maxRatio × their output.
var stackCases = []string{"stack_bf16", "stack_f32_cast", "stack_vmap_bf16", "stack_vmap_f32_cast", "stack_bf16_7b", "stack_vmap_bf16_7b", "stack_vmap_f32_cast_7b"}

const maxRatio = 1.05

// TestPeaksHoldTheirOutputs runs the cases in sequence in one process, as the
// program does, twice over (the second time without the analysis-only rows),
// and checks that every measured peak holds at least the case's output (it is
// alive when the peak is read), and the outputs against the sizes. An earlier
// case's memory freed during a later case once made attention_jit report
// 0.0065 × its output. The stacked-block initialisers must stay within
// maxRatio × their output (checkStacks).
func TestPeaksHoldTheirOutputs(t *testing.T) {
	s := testSizes
	pairwise := int64(s.Nodes * s.Nodes * s.Channels * 4)
	stack := stackBytes(s.Layers, s.DModel, s.Hidden)
	big := stackBytes(s.BigLayers, s.BigDModel, s.BigHidden)
	want := map[string]int64{
		"attention_eager": pairwise, "attention_eager_kept": pairwise, "attention_jit": pairwise,
		"random_matrix":      int64(s.MatRows * s.MatCols * 4),
		"random_matrix_full": int64(s.FullRows * s.FullCols * 4),
		"stack_bf16":         stack, "stack_f32_cast": stack, "stack_vmap_bf16": stack, "stack_vmap_f32_cast": stack,
		"stack_bf16_7b": big, "stack_vmap_bf16_7b": big, "stack_vmap_f32_cast_7b": big,
	}
	analysisRows := 4
	for _, in := range shardInits {
		for _, l := range shardLayouts {
			name := in.name + "_sharded_" + l.name
			want[name] = int64(s.MatRows * s.MatCols * 4)
			want[name+"_full"] = int64(s.FullRows * s.FullCols * 4)
			analysisRows++
		}
	}
	for round := range 2 {
		analyses := round == 0
		rows, err := run(s, analyses)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		n := len(want)
		if !analyses {
			n -= analysisRows
		}
		if len(rows) != n {
			t.Fatalf("round %d: %d rows, want %d", round, len(rows), n)
		}
		if c := caseCount(analyses); c != n {
			t.Errorf("round %d: caseCount %d (the status line's total), want %d", round, c, n)
		}
		checkTable(t, rows)
		for _, r := range rows {
			if w, ok := want[r.Case]; !ok || r.OutputBytes != w {
				t.Errorf("round %d: %s: output %d bytes, want %d", round, r.Case, r.OutputBytes, w)
			}
			// A sharded case's peaks and analysis are per device, of its
			// block; the others' of the whole output.
			perDevice := r.OutputBytes
			if r.Sharding != "" {
				perDevice = r.ShardBytes
			}
			if r.PeakDeviceBytes == 0 { // analysed, not run
				if !strings.HasSuffix(r.Case, "_full") && !strings.HasSuffix(r.Case, "_7b") || r.AnalysedTotalBytes < perDevice {
					t.Errorf("round %d: %+v", round, r)
				}
				continue
			}
			if perDevice <= 0 || r.PeakDeviceBytes < perDevice {
				t.Errorf("round %d: %s: peak %d bytes < output %d bytes (ratio %.4f)", round, r.Case, r.PeakDeviceBytes, perDevice, r.Ratio)
			}
		}
		// The kept case holds 3 pairwise tensors besides its output.
		if r := rows[1]; r.PeakDeviceBytes < 4*pairwise {
			t.Errorf("round %d: attention_eager_kept: peak %d < 4 × %d", round, r.PeakDeviceBytes, pairwise)
		}
		checkStacks(t, rows)
		checkSharded(t, rows, analyses)
	}
}

// checkTable checks the printed table: a header and a line per row whose
// sizes carry binary units, never a bare byte count.
func checkTable(t *testing.T, rows []row) {
	t.Helper()
	var b bytes.Buffer
	printTable(&b, rows)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != len(rows)+1 {
		t.Fatalf("table of %d lines for %d rows:\n%s", len(lines), len(rows), b.String())
	}
	for i, r := range rows {
		line := lines[i+1]
		for _, n := range []int64{r.OutputBytes, r.TempBytes} {
			if !strings.Contains(line, backend.FormatBytes(n)) {
				t.Errorf("%s: %q lacks %s", r.Case, line, backend.FormatBytes(n))
			}
		}
		if f := strings.Fields(line); len(f) < 6 || !strings.HasPrefix(line, r.Case+" ") || r.OutputBytes >= 1<<10 && strings.Contains(line, fmt.Sprint(r.OutputBytes)) {
			t.Errorf("%s: table line %q", r.Case, line)
		}
	}
}

// checkStacks checks the rows of the stacked-block initialisers: every
// measured peak and analysed total at most maxRatio × the bf16 output, and
// the memory analysis of each Vmap case equal to nn.NewStack's at the same
// sizes (arguments, outputs, aliases) but for its temps, which hold only PRNG
// keys and are a few KiB for either.
func checkStacks(t *testing.T, rows []row) {
	t.Helper()
	byCase := map[string]row{}
	for _, r := range rows {
		byCase[r.Case] = r
	}
	for _, name := range stackCases {
		r, ok := byCase[name]
		if !ok {
			continue // analysis rows of round 1
		}
		got := r.PeakDeviceBytes
		if got == 0 {
			got = r.AnalysedTotalBytes
		}
		if float64(got) > maxRatio*float64(r.OutputBytes) {
			t.Errorf("%s: peak %d bytes > %.2f × output %d bytes (ratio %.4f)", name, got, maxRatio, r.OutputBytes, r.Ratio)
		}
		if r.AnalysedTotalBytes < r.OutputBytes {
			t.Errorf("%s: analysed total %d bytes < output %d bytes", name, r.AnalysedTotalBytes, r.OutputBytes)
		}
	}
	const maxTemp = 64 << 10
	for _, pair := range [][2]string{
		{"stack_bf16", "stack_vmap_bf16"}, {"stack_bf16", "stack_vmap_f32_cast"},
		{"stack_bf16_7b", "stack_vmap_bf16_7b"}, {"stack_bf16_7b", "stack_vmap_f32_cast_7b"},
	} {
		a, okA := byCase[pair[0]]
		b, okB := byCase[pair[1]]
		if !okA || !okB {
			continue
		}
		ma, mb := a.analysis, b.analysis
		if mb.ArgumentBytes != ma.ArgumentBytes || mb.OutputBytes != ma.OutputBytes || mb.AliasBytes != ma.AliasBytes ||
			mb.HostTotalBytes() != 0 || ma.HostTotalBytes() != 0 {
			t.Errorf("%s analysis %v, want %s's %v (temps aside)", pair[1], mb, pair[0], ma)
		}
		if ma.TempBytes > maxTemp || mb.TempBytes > maxTemp {
			t.Errorf("temps of %s %d bytes and %s %d bytes: want at most %d (PRNG keys only)", pair[0], ma.TempBytes, pair[1], mb.TempBytes, maxTemp)
		}
	}
}

// TestMeasureEarlierMemoryFreedDuring: memory in use before a case and
// freed while it runs (as an earlier case's garbage is, by its cleanups)
// must not hide the case's output: measure reports the peak with the output
// in it, or an error, never a smaller peak.
func TestMeasureEarlierMemoryFreedDuring(t *testing.T) {
	n := 1<<14 + testseed.Rand(t, 1).IntN(1<<14)
	earlier := rt.FromSlice(make([]float32, n))
	peak, out, err := measure(func() []*trace.Array {
		if err := earlier.Delete(); err != nil {
			t.Fatal(err)
		}
		return []*trace.Array{rt.FromSlice(make([]float32, n))}
	})
	if err == nil && peak < out {
		t.Fatalf("peak %d bytes < output %d bytes, and no error", peak, out)
	}
}

// perLayerStack is the reference of vmapStack: layer i initialised on its
// own with key i of random.Split(key, L) by layer (nn.NewBlock in bf16,
// eager or jitted), and every leaf stacked on a new leading axis.
func perLayerStack(key *trace.Array, L int, layer func(k *trace.Array) nn.Block) []*trace.Array {
	keys := random.Split(key, L)
	var leaves [][]*trace.Array
	for i := range L {
		leaves = append(leaves, trace.Leaves(layer(trace.Index(keys, i))))
	}
	out := make([]*trace.Array, len(leaves[0]))
	for j := range out {
		col := make([]*trace.Array, L)
		for i := range L {
			col[i] = leaves[i][j]
		}
		out[j] = trace.Stack(0, col...)
	}
	return out
}

// checkVmapStack checks that both Vmap cases (bf16, and f32 then cast),
// jitted as the program does, return the bits of the per-layer reference at these sizes, from a
// fresh seed.
func checkVmapStack(t *testing.T, L, d, heads, hidden int, layer func(k *trace.Array) nn.Block) {
	t.Helper()
	seed := testseed.Uint64(t)
	key := random.NewKey(seed)
	want := perLayerStack(key, L, layer)
	for _, dt := range []ir.DType{ir.BFloat16, ir.Float32} {
		init, _, err := jitted(vmapID(dt, L, d, heads, hidden), vmapStack(dt, L, d, heads, hidden), key)
		if err != nil {
			t.Fatal(err)
		}
		got := trace.Leaves(init(key))
		if len(got) != len(want) {
			t.Fatalf("Vmap from %v: %d leaves, want %d", dt, len(got), len(want))
		}
		for j := range got {
			if !got[j].Type().Equal(want[j].Type()) {
				t.Fatalf("Vmap from %v, seed %d: leaf %d is %v, want %v", dt, seed, j, got[j].Type(), want[j].Type())
			}
			g, err := got[j].Literal()
			if err != nil {
				t.Fatal(err)
			}
			w, err := want[j].Literal()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(g.Data, w.Data) {
				t.Errorf("Vmap from %v, seed %d: leaf %d (%v) differs from the per-layer init", dt, seed, j, got[j].Type())
			}
		}
	}
}

// TestVmapStackIsPerLayerInit: the Vmap of nn.NewBlock over the layer keys,
// straight into bf16 or f32 then cast, is bit for bit each layer initialised
// eagerly with its key, stacked.
func TestVmapStackIsPerLayerInit(t *testing.T) {
	s := testSizes
	checkVmapStack(t, s.Layers, s.DModel, s.Heads, s.Hidden, func(k *trace.Array) nn.Block {
		return nn.NewBlock(k, ir.BFloat16, s.DModel, s.Heads, s.Hidden)
	})
}

// TestVmapStackIsPerLayerInitProgramSize is TestVmapStackIsPerLayerInit at
// the program's sizes with the layer initialiser jitted (eager would take
// minutes). It takes about 30 s on a loaded 2-core machine, so it runs only
// with FERRY_INIT_PROGRAM_SIZE=1.
func TestVmapStackIsPerLayerInitProgramSize(t *testing.T) {
	if !settings.InitProgramSize.Get() {
		t.Skip("set FERRY_INIT_PROGRAM_SIZE=1 to run it")
	}
	s := programSizes
	checkVmapStack(t, s.Layers, s.DModel, s.Heads, s.Hidden, rt.Jit(func(k *trace.Array) nn.Block {
		return nn.NewBlock(k, ir.BFloat16, s.DModel, s.Heads, s.Hidden)
	}))
}

// checkSharded checks the rows of the sharded initialisers: one per
// initialiser and layout (and its _full analysis when analyses is set), each
// device's block of the output 1/8 of it, every measured per-device peak
// between the block and maxRatio × the block, the per-device analysis the
// block plus at most (maxRatio − 1) × the block, and the sharded values
// bit-identical to the unsharded init's.
func checkSharded(t *testing.T, rows []row, analyses bool) {
	t.Helper()
	byCase := map[string]row{}
	for _, r := range rows {
		byCase[r.Case] = r
	}
	for _, in := range shardInits {
		for _, l := range shardLayouts {
			name := in.name + "_sharded_" + l.name
			names := []string{name}
			if analyses {
				names = append(names, name+"_full")
			}
			for _, n := range names {
				r, ok := byCase[n]
				if !ok {
					t.Errorf("no row %s", n)
					continue
				}
				checkShardedRow(t, r)
			}
		}
	}
}

// checkShardedRow checks one row of checkSharded.
func checkShardedRow(t *testing.T, r row) {
	t.Helper()
	if r.Sharding == "" || r.ShardBytes*meshDevices != r.OutputBytes {
		t.Errorf("%s: sharding %q, block %d bytes of %d: want 1/%d", r.Case, r.Sharding, r.ShardBytes, r.OutputBytes, meshDevices)
		return
	}
	bound := maxRatio * float64(r.ShardBytes)
	m := r.analysis
	if m.OutputBytes != r.ShardBytes || float64(m.TotalBytes()) > bound || m.HostTotalBytes() != 0 {
		t.Errorf("%s: per-device analysis %v, want output %d bytes, total at most %.0f", r.Case, m, r.ShardBytes, bound)
	}
	if r.PeakDeviceBytes == 0 { // analysed, not run
		if r.Ratio > maxRatio || r.PeakPerDevice != nil || r.BitIdentical != nil {
			t.Errorf("%s: %+v", r.Case, r)
		}
		return
	}
	if len(r.PeakPerDevice) != meshDevices {
		t.Fatalf("%s: peaks of %d devices, want %d", r.Case, len(r.PeakPerDevice), meshDevices)
	}
	var most int64
	for d, p := range r.PeakPerDevice {
		if p < r.ShardBytes || float64(p) > bound {
			t.Errorf("%s: device %d peak %d bytes, want between its block %d and %.0f", r.Case, d, p, r.ShardBytes, bound)
		}
		most = max(most, p)
	}
	if r.PeakDeviceBytes != most || r.Ratio > maxRatio || r.Ratio != float64(most)/float64(r.ShardBytes) {
		t.Errorf("%s: peak %d bytes, ratio %.4f; the largest device peak is %d bytes", r.Case, r.PeakDeviceBytes, r.Ratio, most)
	}
	if r.BitIdentical == nil || !*r.BitIdentical {
		t.Errorf("%s: sharded values differ from the unsharded init's", r.Case)
	}
}

// TestShardedAnalysisFullSize: at the program's size, f32[32768, 262144]
// over 8 devices, each device's analysis is its 4 GiB block and at most
// (maxRatio − 1) × 4 GiB more, for every sharded initialiser and layout
// (compiling them costs what compiling a small one does).
func TestShardedAnalysisFullSize(t *testing.T) {
	s := programSizes
	key := random.NewKey(testseed.Uint64(t))
	for _, in := range shardInits {
		for _, l := range shardLayouts {
			sh, err := l.sharding()
			if err != nil {
				t.Fatal(err)
			}
			_, m, err := jitted(fmt.Sprint("full ", in.name, " ", sh, " ", s.FullRows, s.FullCols), initMatrix(in.init, s.FullRows, s.FullCols), key, rt.OutShardings(sh))
			if err != nil {
				t.Fatal(err)
			}
			const block = 4 << 30
			if m.OutputBytes != block || float64(m.TotalBytes()) > maxRatio*block {
				t.Errorf("%s over %v: per-device analysis %v, want a 4 GiB output and at most %.2f × it in all", in.name, sh, m, maxRatio)
			}
		}
	}
}

// shardingCases are the layouts the bit-identity tests try: each mesh with
// each spec that names only its axes.
func shardingCases(t *testing.T) []*ir.NamedSharding {
	t.Helper()
	meshes := []struct {
		shape []int
		axes  []string
	}{{[]int{8}, []string{"x"}}, {[]int{2, 4}, []string{"x", "y"}}, {[]int{4, 2}, []string{"x", "y"}}}
	specs := []ir.PartitionSpec{ir.P("x", ""), ir.P("", "x"), ir.P("x", "y"), ir.P("y", "x"), {{"x", "y"}, {}}}
	var out []*ir.NamedSharding
	for _, ms := range meshes {
		mesh, err := ir.NewMesh(ms.shape, ms.axes)
		if err != nil {
			t.Fatal(err)
		}
		for _, spec := range specs {
			if len(ms.axes) == 1 && (strings.Contains(spec.String(), "y")) {
				continue
			}
			sh, err := ir.NewNamedSharding(mesh, spec)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, sh)
		}
	}
	return out
}

// TestShardedInitBitIdentical: every initialiser jitted with its output
// sharded over 8 devices, for every mesh and spec of shardingCases, puts on
// each device exactly its block, and the block holds the bits of that block
// of the same initialiser jitted unsharded, from a fresh key.
func TestShardedInitBitIdentical(t *testing.T) {
	const rows, cols = 32, 64
	inits := []struct {
		name string
		fn   func(key *trace.Array) *trace.Array
	}{
		{"LecunNormal", initMatrix(nn.LecunNormal, rows, cols)},
		{"GlorotUniform", initMatrix(nn.GlorotUniform, rows, cols)},
		{"NormalInit(0.02)", initMatrix(nn.NormalInit(0.02), rows, cols)},
		{"LecunNormal bf16", func(k *trace.Array) *trace.Array { return nn.LecunNormal(k, ir.BFloat16, ir.Shape{rows, cols}) }},
		{"Zeros", initMatrix(nn.Zeros, rows, cols)},
		{"random.Uniform", func(k *trace.Array) *trace.Array { return random.Uniform(k, ir.Float32, ir.Shape{rows, cols}, -1, 2) }},
		{"random.Bits", func(k *trace.Array) *trace.Array { return random.Bits(k, rows, cols) }},
	}
	seed := testseed.Uint64(t)
	key := random.NewKey(seed)
	for _, in := range inits {
		want, err := rt.Jit(in.fn)(key).Literal()
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range shardingCases(t) {
			x := rt.Jit(in.fn, rt.OutShardings(sh))(key)
			checkBlocks(t, fmt.Sprintf("%s over %v, seed %d", in.name, sh, seed), x, want, sh)
			if err := x.Delete(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkBlocks checks that x, sharded as sh, has one block on each device
// of sh's mesh, of the shape sh gives, holding the bits of that block of
// want (a matrix).
func checkBlocks(t *testing.T, what string, x *trace.Array, want *ir.Literal, sh *ir.NamedSharding) {
	t.Helper()
	shards, err := rt.Shards(x)
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) != meshDevices {
		t.Fatalf("%s: %d blocks, want %d", what, len(shards), meshDevices)
	}
	blockShape, err := sh.ShardShape(want.Type.Shape)
	if err != nil {
		t.Fatal(err)
	}
	cols, es := want.Type.Shape[1], want.Type.DType.Size()
	for _, s := range shards {
		got, err := s.Array.Literal()
		if err != nil {
			t.Fatal(err)
		}
		start, limit, err := sh.ShardBounds(want.Type.Shape, s.Device.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Type.Shape.Equal(blockShape) || !slices.Equal(s.Start, start) || !slices.Equal(s.Limit, limit) {
			t.Fatalf("%s: device %d holds %v at [%v, %v), want %v at [%v, %v)", what, s.Device.ID, got.Type.Shape, s.Start, s.Limit, blockShape, start, limit)
		}
		var ref []byte
		for i := start[0]; i < limit[0]; i++ {
			ref = append(ref, want.Data[(i*cols+start[1])*es:(i*cols+limit[1])*es]...)
		}
		if !bytes.Equal(got.Data, ref) {
			t.Errorf("%s: device %d's block [%v, %v) differs from the unsharded init's", what, s.Device.ID, start, limit)
		}
	}
}
