package cuda

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The device-compiler check: every kernel the generator makes (the op table
// on every dtype, the traced cases, and the steps of the examples' MLP and
// Transformer train steps) is compiled by the real NVRTC for each of
// nvrtcArchs, and any error or warning in NVRTC's log fails the test. NVRTC
// needs no GPU and no driver: LoadNVRTC loads it alone. Kernels are compiled
// in batches, one NVRTC program per CPU and architecture: 60 op kernels took
// 4.7 s one program each and 2.1 s as one program (sm_80, one core).

// nvrtcArchs are the architectures every generated kernel is compiled for.
var nvrtcArchs = []string{"sm_80", "sm_90"}

// requireNVRTCEnv, set to 1, turns the NVRTC tests' skip (no NVRTC found)
// into a failure; .ci/nvrtc.sh sets it.
const requireNVRTCEnv = "FERRY_REQUIRE_NVRTC"

// needNVRTC loads NVRTC from SearchDirs, or skips (fails under
// FERRY_REQUIRE_NVRTC=1) saying how to install it.
func needNVRTC(t *testing.T) *NVRTC {
	t.Helper()
	n, err := LoadNVRTC(SearchDirs())
	if err != nil {
		msg := "NVRTC not found, so the generated kernels are not compiled for the GPU. To enable: `bash scripts/venv` " +
			"(installs the pinned nvidia-cuda-nvrtc wheel into .venv) and run with VIRTUAL_ENV=$PWD/.venv (the repository root's), " +
			"or set " + LibDirEnv + " to the directory holding libnvrtc.so* (for example .venv/lib/python3.*/site-packages/nvidia/cu13/lib); " +
			".ci/nvrtc.sh does this.\n" + err.Error()
		if settings.RequireNVRTC.Get() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ma, mi, err := n.Version()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NVRTC %d.%d from %s", ma, mi, n.Path)
	return n
}

// nvrtcProgram is the prelude once and then every kernel of ks without its
// prelude, its entries renamed c<i>_<name> (kernels may share entry names).
// Kernel i is lines first[i] to first[i+1]-1 (first has len(ks)+1 entries).
// Every kernel's source must start with the prelude.
func nvrtcProgram(ks []*Kernel) (src string, first []int) {
	var b strings.Builder
	b.WriteString(Prelude)
	for ci, k := range ks {
		first = append(first, strings.Count(b.String(), "\n")+1)
		fmt.Fprintf(&b, "/* kernel %d */\n", ci)
		for _, e := range k.Entries {
			fmt.Fprintf(&b, "#define %s c%d_%s\n", e.Name, ci, e.Name)
		}
		b.WriteString(strings.TrimPrefix(k.Source, Prelude))
		for _, e := range k.Entries {
			fmt.Fprintf(&b, "#undef %s\n", e.Name)
		}
	}
	first = append(first, strings.Count(b.String(), "\n")+1)
	return b.String(), first
}

// nvrtcLogError is a compile that failed or left a log (warnings).
type nvrtcLogError struct {
	arch, log string
	err       error // the compile error, nil when it only warned
}

func (e *nvrtcLogError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("NVRTC for %s: %v", e.arch, e.err)
	}
	return fmt.Sprintf("NVRTC for %s warns:\n%s", e.arch, e.log)
}

// nvrtcDiag is one diagnostic of an NVRTC log: the line it points at, and
// its text (the message and the quoted source line).
type nvrtcDiag struct {
	line  int
	error bool
	text  string
}

// nvrtcDiagAt matches the first line of a diagnostic, "name(line): error" or
// "name(line): warning #177-D".
var nvrtcDiagAt = regexp.MustCompile(`^(.+)\((\d+)\): (error|warning)`)

// parseNVRTCLog splits an NVRTC log into its diagnostics. Lines before the
// first diagnostic and NVRTC's summary lines ("Remark: ...", "1 error
// detected ...") belong to none.
func parseNVRTCLog(log string) []nvrtcDiag {
	var ds []nvrtcDiag
	for _, l := range strings.Split(log, "\n") {
		if m := nvrtcDiagAt.FindStringSubmatch(l); m != nil {
			line, _ := strconv.Atoi(m[2])
			ds = append(ds, nvrtcDiag{line: line, error: m[3] == "error", text: l})
			continue
		}
		if len(ds) == 0 || strings.HasPrefix(l, "Remark:") || strings.Contains(l, "detected in the compilation of") {
			continue
		}
		ds[len(ds)-1].text += "\n" + l
	}
	for i := range ds {
		ds[i].text = strings.TrimRight(ds[i].text, "\n ")
	}
	return ds
}

// nvrtcKernels compiles ks for arch as one program and returns, per kernel,
// why it is not clean: no prelude, or the errors and warnings of NVRTC's log
// that point into it (a *nvrtcLogError). Kernels with errors are left out and
// the rest compiled again. A failure or a diagnostic outside every kernel
// (in the prelude) is every remaining kernel's.
func nvrtcKernels(n *NVRTC, arch string, ks []*Kernel) []error {
	errs := make([]error, len(ks))
	var live []int
	for i, k := range ks {
		if !strings.HasPrefix(k.Source, Prelude) {
			errs[i] = errors.New("the source does not start with the prelude")
			continue
		}
		live = append(live, i)
	}
	for len(live) > 0 {
		sub := make([]*Kernel, len(live))
		for p, i := range live {
			sub[p] = ks[i]
		}
		src, first := nvrtcProgram(sub)
		img, log, err := n.CompileLog(src, "batch.cu", arch)
		if err == nil && len(img) == 0 {
			err = errors.New("empty image")
		}
		if err == nil && log == "" {
			return errs
		}
		mine := map[int][]nvrtcDiag{} // positions in live → their diagnostics
		failed := map[int]bool{}
		everyone := len(parseNVRTCLog(log)) == 0
		for _, d := range parseNVRTCLog(log) {
			p := sort.SearchInts(first, d.line+1) - 1 // the last kernel starting at or before the line
			if p < 0 || p == len(sub) {
				everyone = true
				break
			}
			mine[p] = append(mine[p], d)
			failed[p] = failed[p] || d.error
		}
		if everyone || err != nil && len(failed) == 0 {
			for _, i := range live {
				errs[i] = &nvrtcLogError{arch: arch, log: log, err: err}
			}
			return errs
		}
		var keep []int
		for p, i := range live {
			ds, ok := mine[p]
			if !ok {
				keep = append(keep, i)
				continue
			}
			le := &nvrtcLogError{arch: arch}
			for _, d := range ds {
				le.log += d.text + "\n"
			}
			if failed[p] {
				le.err = errors.New("compile error")
			}
			errs[i] = le
		}
		if err == nil { // only warnings: the others compiled cleanly
			return errs
		}
		live = keep
	}
	return errs
}

// nvrtcAll compiles ks for every arch of archs, in one program per CPU and
// arch, and returns errs[kernel][arch].
func nvrtcAll(n *NVRTC, archs []string, ks []*Kernel) [][]error {
	errs := make([][]error, len(ks))
	for i := range errs {
		errs[i] = make([]error, len(archs))
	}
	parts := max(1, min(runtime.GOMAXPROCS(0), len(ks)))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for a, arch := range archs {
		for p := range parts {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				var idx []int
				var sub []*Kernel
				for i := p; i < len(ks); i += parts {
					idx = append(idx, i)
					sub = append(sub, ks[i])
				}
				for j, err := range nvrtcKernels(n, arch, sub) {
					errs[idx[j]][a] = err
				}
			})
		}
	}
	wg.Wait()
	return errs
}

// namedKernel is a generated kernel and where it comes from.
type namedKernel struct {
	name string
	k    *Kernel
}

// checkNVRTC compiles every kernel of nks for nvrtcArchs in batches and, in
// a subtest per failing kernel, reports its errors or warnings with the log
// of the kernel compiled alone and its numbered source.
func checkNVRTC(t *testing.T, n *NVRTC, nks []namedKernel) {
	t.Helper()
	var ks []*Kernel
	first := map[string]int{} // source → index in ks: equal kernels compile once
	index := make([]int, len(nks))
	for i, nk := range nks {
		j, ok := first[nk.k.Source]
		if !ok {
			j = len(ks)
			first[nk.k.Source] = j
			ks = append(ks, nk.k)
		}
		index[i] = j
	}
	errs := nvrtcAll(n, nvrtcArchs, ks)
	t.Logf("%d kernels (%d distinct) compiled for %v", len(nks), len(ks), nvrtcArchs)
	for i, nk := range nks {
		for a, err := range errs[index[i]] {
			if err == nil {
				continue
			}
			t.Run(nk.name+"/"+nvrtcArchs[a], func(t *testing.T) {
				_, log, aerr := n.CompileLog(nk.k.Source, "kernel.cu", nvrtcArchs[a])
				if aerr == nil && log == "" {
					t.Fatalf("the batch reported a problem though the kernel compiles cleanly alone: %v", err)
				}
				t.Fatalf("%v\nthe kernel alone: error %v, log:\n%s\n%s", err, aerr, log, numbered(nk.k.Source))
			})
		}
	}
}

// generate is GenerateOp that fails t.
func generate(t *testing.T, op *ir.Op) *Kernel {
	t.Helper()
	k, err := GenerateOp(op)
	if err != nil {
		t.Fatalf("%v: %v", op.Code, err)
	}
	return k
}

// opTableKernels generates every op of opCases on every dtype it takes.
func opTableKernels(t *testing.T) []namedKernel {
	var out []namedKernel
	for _, c := range opCases() {
		f := ir.NewFunc("probe")
		var args []*ir.Value
		for _, p := range c.params {
			args = append(args, f.Body.AddParam(p))
		}
		op, err := f.Body.AddOp(c.code, args, c.attrs)
		if err != nil {
			continue // the op does not take this dtype
		}
		out = append(out, namedKernel{"ops/" + c.name, generate(t, op)})
	}
	return out
}

// stepKernels compiles f with the pass pipeline as Backend.Compile does and
// generates every kernel the backend may compile for it: each step's own
// kernel (an output fusion's with its Product entry, which the backend
// skips when cuBLASLt computes the product). The steps in the bodies of
// scan, while and cond ops are included; fused groups the plan does not
// describe (they run on the host) are not.
func stepKernels(t *testing.T, prefix string, f *ir.Func) []namedKernel {
	t.Helper()
	p, err := passes.Compile(f, passes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out []namedKernel
	var walk func(prefix string, r *ir.Region)
	walk = func(prefix string, r *ir.Region) {
		for i, op := range r.Ops {
			name := fmt.Sprintf("%s/%d_%v", prefix, i, op.Code)
			switch {
			case op.Code == ir.Constant || op.Code == ir.Sort || op.Code == ir.DevicePut:
				continue
			case op.Code != ir.Fusion && op.Code.Info().Class == ir.ClassRegion:
				for j, body := range op.Regions {
					walk(fmt.Sprintf("%s.%d", name, j), body)
				}
				continue
			case op.Code == ir.Fusion:
				name += "_" + op.Attrs.String("kind")
				pk, err := passes.LowerKernel(op)
				if err != nil {
					t.Fatal(err)
				}
				if pk.Mode == passes.KernelUnsupported {
					t.Logf("%s runs on the host: %s", name, pk.Why)
					continue
				}
			}
			out = append(out, namedKernel{name, generate(t, op)})
		}
	}
	walk(prefix, p.Func.Body)
	return out
}

// lowered traces fn on args with rt.Lower.
func lowered(t *testing.T, fn any, args ...any) *ir.Func {
	t.Helper()
	l, err := rt.Lower(fn, args...)
	if err != nil {
		t.Fatal(err)
	}
	return l.Func
}

// mlpKernels are the kernels of examples/mlp's train and eval steps at its
// default sizes (784 → 512 → 10, ReLU, Adam, batch 128).
func mlpKernels(t *testing.T) []namedKernel {
	const batch, features, hidden, classes = 128, 784, 512, 10
	params := rt.Jit(func(key *trace.Array) nn.MLP {
		return nn.NewMLP(key, ir.Float32, []int{features, hidden, classes}, nn.Relu)
	})(random.NewKey(1))
	opt := optim.Adam[nn.MLP](optim.Constant(1e-3), 0.9, 0.999, 1e-8)
	state, err := opt.Init(params)
	if err != nil {
		t.Fatal(err)
	}
	x := rt.FromSlice(make([]float32, batch*features), batch, features)
	y := rt.FromSlice(make([]int32, batch), batch)
	step := func(p nn.MLP, s optim.AdamState[nn.MLP], x, y *trace.Array) (nn.MLP, optim.AdamState[nn.MLP], *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p nn.MLP) *trace.Array {
			return nn.SoftmaxCrossEntropy(p.Apply(x), y)
		})(p)
		p, s, err := optim.Step(opt, g, s, p)
		return p, s, loss, err
	}
	eval := func(p nn.MLP, x, y *trace.Array) (correct, lossSum *trace.Array) {
		logits := p.Apply(x)
		hit := trace.Equal(trace.Convert(trace.ArgMax(logits, 1), ir.Int32), y)
		return trace.Sum(trace.Convert(hit, ir.Float32)), trace.Mul(nn.SoftmaxCrossEntropy(logits, y), trace.Scalar(batch))
	}
	return append(stepKernels(t, "mlp_train_step", lowered(t, step, params, state, x, y)),
		stepKernels(t, "mlp_eval", lowered(t, eval, params, x, y))...)
}

// lmModel is examples/transformer's language model: a tied embedding,
// learned positions, an nn.Stack and a final LayerNorm.
type lmModel struct {
	Tok    nn.Embedding
	Pos    *trace.Array
	Blocks nn.Stack
	Norm   nn.LayerNorm
}

func (m lmModel) loss(ids, labels *trace.Array, opts ...nn.StackOption) *trace.Array {
	x := trace.Add(m.Tok.Apply(ids), m.Pos)
	x = m.Blocks.Apply(x, opts...)
	return nn.SoftmaxCrossEntropy(m.Tok.Attend(m.Norm.Apply(x)), labels)
}

// transformerKernels are the kernels of examples/transformer's train step at
// its default sizes (4 blocks, d 128, 4 heads, seq 64, batch 32; a vocabulary
// of 96 symbols), with gradient clipping and AdamW under warmup-cosine, for
// the remat policies none and dots.
func transformerKernels(t *testing.T) []namedKernel {
	const vocab, seq, layers, d, heads, batch = 96, 64, 4, 128, 4, 32
	params := rt.Jit(func(key *trace.Array) lmModel {
		ks := random.Keys(key, 3)
		return lmModel{
			Tok:    nn.NewEmbedding(ks[0], ir.Float32, vocab, d),
			Pos:    nn.NormalInit(0.02)(ks[1], ir.Float32, ir.Shape{seq, d}),
			Blocks: nn.NewStack(ks[2], ir.Float32, layers, d, heads, 4*d),
			Norm:   nn.NewLayerNorm(ir.Float32, d),
		}
	})(random.NewKey(2))
	opt := optim.Chain(
		optim.ClipByGlobalNorm[lmModel](1),
		optim.AdamW[lmModel](optim.WarmupCosine(3e-3, 100, 2000, 3e-4), 0.9, 0.95, 1e-8, 0.01),
	)
	state, err := optim.InitIn(opt, params, ir.Device)
	if err != nil {
		t.Fatal(err)
	}
	ids := rt.FromSlice(make([]int32, batch*seq), batch, seq)
	var out []namedKernel
	for _, remat := range []struct {
		name string
		opts []nn.StackOption
	}{{"none", nil}, {"dots", []nn.StackOption{nn.WithRemat(trace.DotsSaveable)}}} {
		type optState = optim.ChainState[optim.EmptyState, optim.AdamState[lmModel]]
		step := func(p lmModel, s optState, x, y *trace.Array) (lmModel, optState, *trace.Array, error) {
			loss, g := trace.ValueAndGrad(func(p lmModel) *trace.Array { return p.loss(x, y, remat.opts...) })(p)
			upd, s2, err := opt.Update(g, s, p)
			if err != nil {
				return lmModel{}, optState{}, nil, err
			}
			p2, err := optim.ApplyUpdates(p, upd)
			return p2, s2, loss, err
		}
		out = append(out, stepKernels(t, "transformer_train_step_remat_"+remat.name, lowered(t, step, params, state, ids, ids))...)
	}
	return out
}

// TestNVRTCGeneratedKernels compiles every generated kernel with the real
// NVRTC for sm_80 and sm_90 and fails on any compiler error or warning.
func TestNVRTCGeneratedKernels(t *testing.T) {
	n := needNVRTC(t)
	nks := opTableKernels(t)
	for _, c := range genCases {
		nks = append(nks, stepKernels(t, "traced/"+c.name, traceFn(t, c.params, c.fn))...)
	}
	nks = append(nks, mlpKernels(t)...)
	nks = append(nks, transformerKernels(t)...)
	checkNVRTC(t, n, nks)
}

// The batch compile attributes an error or a warning to the kernel it is in
// and still compiles the others; a kernel without the prelude fails alone.
func TestNVRTCBatchAttributes(t *testing.T) {
	n := needNVRTC(t)
	add := buildOp(t, opCase{name: "add", params: []ir.Type{f32(3, 5), f32(3, 5)}, code: ir.Add})
	sum := buildOp(t, opCase{name: "sum", params: []ir.Type{f64(4, 70)}, code: ir.ReduceSum, attrs: ir.Attrs{"axes": []int{1}}})
	broken, warns, bare := *generate(t, add), *generate(t, sum), *generate(t, add)
	broken.Source += "int broken = ;\n"
	warns.Source += "FD int ferry_test_unused(void) { int never_used; return 1; }\n"
	bare.Source = strings.TrimPrefix(bare.Source, Prelude)
	ks := []*Kernel{generate(t, add), &broken, generate(t, sum), &warns, &bare}
	errs := nvrtcKernels(n, "sm_80", ks)
	var le *nvrtcLogError
	if !errors.As(errs[1], &le) || le.err == nil || !strings.Contains(le.log, "error") {
		t.Errorf("the kernel that does not compile: %v", errs[1])
	}
	if !errors.As(errs[3], &le) || le.err != nil || !strings.Contains(le.log, "never_used") {
		t.Errorf("the kernel that warns: %v", errs[3])
	}
	if errs[4] == nil || !strings.Contains(errs[4].Error(), "prelude") {
		t.Errorf("the kernel without the prelude: %v", errs[4])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Errorf("kernel %d: %v", i, errs[i])
		}
	}
}

// A kernel compiled alone, as the backend compiles it, leaves NVRTC's log
// empty: the prelude's functions that it does not use draw no warnings.
func TestNVRTCKernelAloneClean(t *testing.T) {
	n := needNVRTC(t)
	add := buildOp(t, opCase{name: "add", params: []ir.Type{f32(3, 5), f32(3, 5)}, code: ir.Add})
	k := generate(t, add)
	for _, arch := range nvrtcArchs {
		img, log, err := n.CompileLog(k.Source, "add.cu", arch)
		if err != nil || log != "" || len(img) == 0 {
			t.Errorf("%s: %d bytes, error %v, log:\n%s", arch, len(img), err, log)
		}
	}
}

// The NVRTC 13 API as the package calls it, without a driver: the version,
// the builtins library preloaded beside libnvrtc, a cubin (a CUDA ELF) for
// sm_XX from nvrtcGetCUBIN, PTX for compute_XX from nvrtcGetPTX, and a
// compile error carrying nvrtcGetProgramLog's text.
func TestNVRTCAPI(t *testing.T) {
	n := needNVRTC(t)
	ma, _, err := n.Version()
	if err != nil || ma < 12 {
		t.Fatalf("NVRTC version %d: %v", ma, err)
	}
	if n.Builtins == "" || !strings.Contains(n.Builtins, "libnvrtc-builtins.so") {
		t.Errorf("libnvrtc-builtins was not preloaded from beside %s", n.Path)
	}
	src := Prelude + "FERRY_KERNEL twice(const float* __restrict__ p0, float* __restrict__ out0, long long n) {\n" +
		"  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) out0[i] = 2.0f * p0[i];\n}\n"
	for _, arch := range nvrtcArchs {
		img, err := n.Compile(src, "twice.cu", arch)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elf.NewFile(bytes.NewReader(img))
		if err != nil {
			t.Fatalf("%s: the image is not an ELF cubin: %v", arch, err)
		}
		if f.Machine != elf.EM_CUDA {
			t.Errorf("%s: ELF machine %v, want EM_CUDA", arch, f.Machine)
		}
		var syms []string
		if ss, err := f.Symbols(); err == nil {
			for _, s := range ss {
				syms = append(syms, s.Name)
			}
		}
		if !slices.Contains(syms, "twice") {
			t.Errorf("%s: the cubin has no symbol twice (extern \"C\"): %v", arch, syms)
		}
	}
	ptx, err := n.Compile(src, "twice.cu", "compute_90")
	if err != nil {
		t.Fatal(err)
	}
	if s := string(ptx); !strings.Contains(s, ".target sm_90") || !strings.Contains(s, ".entry twice(") {
		t.Errorf("compute_90 did not give PTX for sm_90:\n%.400s", s)
	}
	_, err = n.Compile(src+"FERRY_KERNEL bad(long long n) { undeclared_name = 1; }\n", "bad.cu", "sm_80")
	if err == nil || !strings.Contains(err.Error(), "undeclared_name") || !strings.Contains(err.Error(), "bad.cu(") {
		t.Errorf("a compile error lacks NVRTC's log: %v", err)
	}
}
