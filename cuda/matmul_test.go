package cuda

import (
	"encoding/binary"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// fakeLt records cuBLASLt calls and plays the library's part: it hands out
// handles, copies attribute values, returns one algorithm from the
// heuristic and remembers what cublasLtMatmul was given.
type fakeLt struct {
	calls   []ltRecord
	next    uintptr
	objects map[uintptr]*ltObject
	algo    [ltAlgoSize]byte
	ws      uint64
	noAlgo  bool
}

type ltRecord struct {
	name string
	args []uintptr
	data []byte // SetAttribute: the value bytes
}

// ltObject is what the fake knows about a descriptor.
type ltObject struct {
	kind      string
	create    []uintptr
	attrs     map[uintptr][]byte
	destroyed bool
}

func newFakeLt() *fakeLt {
	f := &fakeLt{next: 0x1000, objects: map[uintptr]*ltObject{}, ws: 4096}
	for i := range f.algo {
		f.algo[i] = byte(0xA0 + i)
	}
	return f
}

// The helpers below touch C-style addresses; they are kept out of line
// because inlining them into fakeLt.call crashes the go1.26.8 compiler
// (disjointTypes panic in the SSA lowering of a memmove).

//go:noinline
func readMem(p uintptr, n int) []byte { return slices.Clone(bytesAt(p, n)) }

//go:noinline
func bytesAt(p uintptr, n int) []byte { return unsafe.Slice((*byte)(ptrFromUintptr(p)), n) }

//go:noinline
func putUintptr(p, v uintptr) { *(*uintptr)(ptrFromUintptr(p)) = v }

//go:noinline
func putInt32(p uintptr, v int32) { *(*int32)(ptrFromUintptr(p)) = v }

func (f *fakeLt) call(name string, args ...uintptr) Result {
	rec := ltRecord{name: name, args: slices.Clone(args)}
	switch name {
	case "cublasLtMatmulDescCreate", "cublasLtMatrixLayoutCreate", "cublasLtMatmulPreferenceCreate":
		f.next += 0x10
		putUintptr(args[0], f.next)
		f.objects[f.next] = &ltObject{kind: name, create: slices.Clone(args[1:]), attrs: map[uintptr][]byte{}}
	case "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutSetAttribute", "cublasLtMatmulPreferenceSetAttribute":
		rec.data = readMem(args[2], int(args[3]))
		o := f.objects[args[0]]
		if o == nil {
			return 7 // CUBLAS_STATUS_INVALID_VALUE
		}
		o.attrs[args[1]] = rec.data
	case "cublasLtMatmulAlgoGetHeuristic":
		if f.noAlgo {
			putInt32(args[9], 0)
			break
		}
		res := bytesAt(args[8], ltHeuristicResultSize)
		copy(res, f.algo[:])
		binary.LittleEndian.PutUint64(res[ltHeuristicWorkspace:], f.ws)
		binary.LittleEndian.PutUint32(res[ltHeuristicState:], 0)
		putInt32(args[9], 1)
	case "cublasLtMatmul":
		rec.data = append(append(readMem(args[2], 8), readMem(args[7], 8)...), readMem(args[12], ltAlgoSize)...)
	case "cublasLtMatmulDescDestroy", "cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceDestroy":
		if o := f.objects[args[0]]; o != nil {
			o.destroyed = true
		}
	}
	f.calls = append(f.calls, rec)
	return 0
}

func (f *fakeLt) find(name string) []ltRecord {
	var out []ltRecord
	for _, c := range f.calls {
		if c.name == name {
			out = append(out, c)
		}
	}
	return out
}

func le32(b []byte) int64 { return int64(int32(binary.LittleEndian.Uint32(b))) }
func le64(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) }

// ltMatrix is a matrix layout as the fake saw it.
type ltMatrix struct {
	dt               int64
	rows, cols, ld   int64
	batch            int64
	stride           int64
	batchSet, strSet bool
}

func (f *fakeLt) matrix(t *testing.T, h uintptr) ltMatrix {
	o := f.objects[h]
	if o == nil || o.kind != "cublasLtMatrixLayoutCreate" {
		t.Fatalf("handle %#x is not a matrix layout", h)
	}
	m := ltMatrix{dt: int64(o.create[0]), rows: int64(o.create[1]), cols: int64(o.create[2]), ld: int64(o.create[3]), batch: 1}
	if b, ok := o.attrs[ltLayoutBatchCount]; ok {
		if len(b) != 4 {
			t.Fatalf("BATCH_COUNT set with %d bytes, want 4 (int32)", len(b))
		}
		m.batch, m.batchSet = le32(b), true
	}
	if b, ok := o.attrs[ltLayoutStridedBatchOffset]; ok {
		if len(b) != 8 {
			t.Fatalf("STRIDED_BATCH_OFFSET set with %d bytes, want 8 (int64)", len(b))
		}
		m.stride, m.strSet = le64(b), true
	}
	for a := range o.attrs {
		if a != ltLayoutBatchCount && a != ltLayoutStridedBatchOffset {
			t.Errorf("unexpected layout attribute %d", a)
		}
	}
	return m
}

// at is element (i, j) of batch b of a column-major matrix in data.
func (m ltMatrix) at(data []float64, b, i, j int64) float64 {
	return data[b*m.stride+i+j*m.ld]
}

// The descriptors NewLtMatmul builds, read back from the fake library and
// applied with cuBLASLt's documented semantics (D = op(A)·op(B), column
// major, strided batches) to random data, reproduce eval's dot_general; and
// the attribute sizes, compute and scale types, the algorithm pointer and
// alpha/beta are the documented ones.
// The handle, maximum workspace and pointers of the descriptor test.
const (
	ltHandle, ltMaxWS               = 0x77, 1 << 22
	rhsP, lhsP, outP, wsP, ltStream = 0xA000, 0xB000, 0xC000, 0xD000, 0xE000
)

// ltCase is a dot_general and the compute, scale and data types its
// cuBLASLt descriptors must have.
type ltCase struct {
	dt             ir.DType
	tf32           bool
	ls, rs         []int
	lb, rb, lc, rc []int
	compute, scale int64
	cudaType       int64
}

func TestLtMatmulDescriptors(t *testing.T) {
	rng := testseed.Rand(t, 11)
	type c = ltCase
	f32c := func(ls, rs, lb, rb, lc, rc []int) c {
		return c{ir.Float32, false, ls, rs, lb, rb, lc, rc, cublasCompute32F, cudaR32F, cudaR32F}
	}
	cases := []c{
		f32c([]int{3, 4}, []int{4, 5}, nil, nil, []int{1}, []int{0}),
		f32c([]int{4, 3}, []int{4, 5}, nil, nil, []int{0}, []int{0}),
		f32c([]int{3, 4}, []int{5, 4}, nil, nil, []int{1}, []int{1}),
		f32c([]int{4, 3}, []int{5, 4}, nil, nil, []int{0}, []int{1}),
		f32c([]int{2, 3, 4}, []int{2, 4, 5}, []int{0}, []int{0}, []int{2}, []int{1}),
		f32c([]int{2, 4, 3}, []int{2, 5, 4}, []int{0}, []int{0}, []int{1}, []int{2}),
		f32c([]int{4}, []int{4, 5}, nil, nil, []int{0}, []int{0}),
		f32c([]int{3, 4}, []int{4}, nil, nil, []int{1}, []int{0}),
		{ir.Float32, true, []int{3, 4}, []int{4, 5}, nil, nil, []int{1}, []int{0}, cublasCompute32FFastTF32, cudaR32F, cudaR32F},
		{ir.BFloat16, false, []int{3, 4}, []int{4, 5}, nil, nil, []int{1}, []int{0}, cublasCompute32F, cudaR32F, cudaR16BF},
		{ir.Float16, false, []int{2, 4, 3}, []int{2, 4, 5}, []int{0}, []int{0}, []int{1}, []int{1}, cublasCompute32F, cudaR32F, cudaR16F},
		{ir.Float64, false, []int{3, 4}, []int{5, 4}, nil, nil, []int{1}, []int{1}, cublasCompute64F, cudaR64F, cudaR64F},
	}
	for _, k := range cases {
		checkLtCase(t, rng, k)
	}
}

// checkLtCase builds k's matmul over a fake cuBLASLt, checks the calls it
// makes, and applies the layouts it describes to random operands.
func checkLtCase(t *testing.T, rng *rand.Rand, k ltCase) {
	t.Helper()
	fn := ir.NewFunc("f")
	l := fn.Body.AddParam(ir.TypeOf(k.dt, k.ls...))
	r := fn.Body.AddParam(ir.TypeOf(k.dt, k.rs...))
	op, err := fn.Body.AddOp(ir.DotGeneral, []*ir.Value{l, r}, ir.Attrs{"lhs_batch": orEmpty(k.lb), "rhs_batch": orEmpty(k.rb), "lhs_contract": k.lc, "rhs_contract": k.rc})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := MatmulSpecFor(op, k.tf32)
	if err != nil {
		t.Fatalf("%v %v × %v: %v", k.dt, k.ls, k.rs, err)
	}
	fake := newFakeLt()
	m, err := newLtMatmul(fake, ltHandle, spec, ltMaxWS, spec.Align(rhsP, lhsP, outP))
	if err != nil {
		t.Fatal(err)
	}
	if m.Workspace != fake.ws {
		t.Errorf("workspace %d, want the heuristic's %d", m.Workspace, fake.ws)
	}
	if err := m.Run(rhsP, lhsP, outP, wsP, 1<<20, ltStream); err != nil {
		t.Fatal(err)
	}
	trans, la, lb, lcc := checkLtCalls(t, fake, k)
	// Apply the layouts as cuBLASLt would.
	A, B, C := fake.matrix(t, la), fake.matrix(t, lb), fake.matrix(t, lcc)
	for _, x := range []ltMatrix{A, B, C} {
		if x.dt != k.cudaType {
			t.Fatalf("layout type %d, want %d", x.dt, k.cudaType)
		}
		if x.batchSet != (spec.Layout.Batch > 1) || x.strSet != (spec.Layout.Batch > 1) {
			t.Fatalf("batch attributes set %v/%v for batch %d", x.batchSet, x.strSet, spec.Layout.Batch)
		}
		if x.ld < x.rows {
			t.Fatalf("ld %d < rows %d", x.ld, x.rows)
		}
	}
	ta, tb := trans[ltDescTransA] == cublasOpT, trans[ltDescTransB] == cublasOpT
	opRows := func(x ltMatrix, tr bool) (int64, int64) {
		if tr {
			return x.cols, x.rows
		}
		return x.rows, x.cols
	}
	am, ak := opRows(A, ta)
	bk, bn := opRows(B, tb)
	if ak != bk || am != C.rows || bn != C.cols || A.batch != B.batch || B.batch != C.batch {
		t.Fatalf("inconsistent layouts: op(A) %d×%d, op(B) %d×%d, D %d×%d", am, ak, bk, bn, C.rows, C.cols)
	}
	ll, rl := randomLiteral(rng, l.Type), randomLiteral(rng, r.Type)
	wantL, err := eval.EvalOp(op, []*ir.Literal{ll, rl})
	if err != nil {
		t.Fatal(err)
	}
	av, bv := make([]float64, r.Type.Size()), make([]float64, l.Type.Size())
	for i := range av {
		av[i] = rl.Float64At(i)
	}
	for i := range bv {
		bv[i] = ll.Float64At(i)
	}
	got := ltApply(A, B, C, ta, tb, av, bv, op.Results[0].Type.Size())
	// ltApply computes the product in float64 from the operands; eval
	// accumulates f32 and 16-bit products in float32 (cpu/gemm's blocked
	// order) and rounds the result to the result's type. So: f64, 1e-9
	// (eval's float64 sums of K ≤ 64 terms are within K·1.1e-16 of Σ|ab|);
	// f32, 1e-5 (K·6e-8 ≈ 4e-6 of Σ|ab| for K ≤ 64, JAX's f32 default being
	// 1e-6 for one op); f16 and bf16, 2e-2 (eval's rounding to 16 bits,
	// half an ulp: 3.9e-3 for bf16, plus the float32 accumulation; JAX's
	// batched testDot allows f16 5e-2 and f64 5e-14, bf16's default is
	// 1e-2).
	tol := 1e-9
	if k.dt == ir.BFloat16 || k.dt == ir.Float16 {
		tol = 2e-2
	} else if k.dt == ir.Float32 {
		tol = 1e-5
	}
	for i := range got {
		w := wantL[0].Float64At(i)
		if math.Abs(got[i]-w) > tol*(1+math.Abs(w)) {
			t.Fatalf("%v %v × %v: element %d = %v, want %v", k.dt, k.ls, k.rs, i, got[i], w)
		}
	}
	m.Destroy()
	for h, o := range fake.objects {
		if !o.destroyed {
			t.Errorf("%s %#x not destroyed", o.kind, h)
		}
	}
}

// checkLtCalls checks the descriptors, preference, heuristic and matmul
// calls made on fake for case k (ptrs: rhs, lhs, out, workspace, stream)
// and returns the transposes and the layouts of A, B and C.
func checkLtCalls(t *testing.T, fake *fakeLt, k ltCase) (trans map[uintptr]int64, la, lb, lcc uintptr) {
	t.Helper()
	// Operation descriptor.
	dc := fake.find("cublasLtMatmulDescCreate")
	if len(dc) != 1 || int64(dc[0].args[1]) != k.compute || int64(dc[0].args[2]) != k.scale {
		t.Fatalf("%v: matmul desc created with %v, want compute %d scale %d", k.dt, dc, k.compute, k.scale)
	}
	var descH uintptr
	for h, o := range fake.objects {
		if o.kind == "cublasLtMatmulDescCreate" {
			descH = h
		}
	}
	trans = map[uintptr]int64{}
	for a, b := range fake.objects[descH].attrs {
		if len(b) != 4 {
			t.Fatalf("desc attribute %d set with %d bytes, want 4 (int32)", a, len(b))
		}
		trans[a] = le32(b)
	}
	if len(trans) != 2 {
		t.Fatalf("desc attributes %v, want TRANSA and TRANSB", trans)
	}
	// Preference.
	pc := fake.find("cublasLtMatmulPreferenceSetAttribute")
	if len(pc) != 5 || pc[0].args[1] != ltPrefMaxWorkspaceBytes || len(pc[0].data) != 8 || le64(pc[0].data) != ltMaxWS {
		t.Fatalf("preference attributes %+v, want MAX_WORKSPACE_BYTES = %d as uint64 and four alignments", pc, ltMaxWS)
	}
	// Heuristic and matmul arguments.
	hc := fake.find("cublasLtMatmulAlgoGetHeuristic")[0]
	mc := fake.find("cublasLtMatmul")[0]
	if hc.args[0] != ltHandle || hc.args[1] != descH || hc.args[7] != 1 {
		t.Fatalf("heuristic args %#x", hc.args)
	}
	la, lb, lcc, ld := hc.args[2], hc.args[3], hc.args[4], hc.args[5]
	if lcc != ld {
		t.Fatalf("heuristic C layout %#x != D layout %#x", lcc, ld)
	}
	want := []uintptr{ltHandle, descH, mc.args[2], rhsP, la, lhsP, lb, mc.args[7], outP, lcc, outP, lcc, mc.args[12], wsP, 1 << 20, ltStream}
	if !slices.Equal(mc.args, want) {
		t.Fatalf("cublasLtMatmul args\n %#x\nwant\n %#x", mc.args, want)
	}
	alpha, beta := mc.data[:8], mc.data[8:16]
	if k.scale == cudaR64F {
		if math.Float64frombits(binary.LittleEndian.Uint64(alpha)) != 1 || binary.LittleEndian.Uint64(beta) != 0 {
			t.Fatalf("alpha/beta %x %x, want double 1 and 0", alpha, beta)
		}
	} else if math.Float32frombits(binary.LittleEndian.Uint32(alpha)) != 1 || binary.LittleEndian.Uint32(beta[:4]) != 0 {
		t.Fatalf("alpha/beta %x %x, want float 1 and 0", alpha, beta)
	}
	if !slices.Equal(mc.data[16:], fake.algo[:]) {
		t.Fatal("cublasLtMatmul did not get the heuristic's algorithm")
	}
	return trans, la, lb, lcc
}

// ltApply computes D = op(A)·op(B) as cuBLASLt defines it (column major,
// strided batches) from av (A's data) and bv (B's), into n elements.
func ltApply(A, B, C ltMatrix, ta, tb bool, av, bv []float64, n int) []float64 {
	ak := A.cols
	if ta {
		ak = A.rows
	}
	got := make([]float64, n)
	for b := int64(0); b < C.batch; b++ {
		for i := int64(0); i < C.rows; i++ {
			for j := int64(0); j < C.cols; j++ {
				var s float64
				for p := int64(0); p < ak; p++ {
					var x, y float64
					if ta {
						x = A.at(av, b, p, i)
					} else {
						x = A.at(av, b, i, p)
					}
					if tb {
						y = B.at(bv, b, j, p)
					} else {
						y = B.at(bv, b, p, j)
					}
					s += x * y
				}
				got[b*C.stride+i+j*C.ld] = s
			}
		}
	}
	return got
}

// Integer dots, empty dimensions and a heuristic without an algorithm stay
// with the generated kernel (an error, and the descriptors are released).
func TestLtMatmulFallbacks(t *testing.T) {
	fn := ir.NewFunc("f")
	l := fn.Body.AddParam(ir.TypeOf(ir.Int32, 3, 4))
	r := fn.Body.AddParam(ir.TypeOf(ir.Int32, 4, 5))
	op, _ := fn.Body.AddOp(ir.DotGeneral, []*ir.Value{l, r}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}})
	if _, err := MatmulSpecFor(op, false); err == nil {
		t.Error("int32 dot accepted")
	}
	l0 := fn.Body.AddParam(ir.TypeOf(ir.Float32, 3, 0))
	r0 := fn.Body.AddParam(ir.TypeOf(ir.Float32, 0, 5))
	op0, _ := fn.Body.AddOp(ir.DotGeneral, []*ir.Value{l0, r0}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}})
	if _, err := MatmulSpecFor(op0, false); err == nil {
		t.Error("K = 0 dot accepted")
	}
	lf := fn.Body.AddParam(ir.TypeOf(ir.Float32, 3, 4))
	rf := fn.Body.AddParam(ir.TypeOf(ir.Float32, 4, 5))
	opf, _ := fn.Body.AddOp(ir.DotGeneral, []*ir.Value{lf, rf}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}})
	spec, err := MatmulSpecFor(opf, false)
	if err != nil {
		t.Fatal(err)
	}
	fake := newFakeLt()
	fake.noAlgo = true
	if _, err := newLtMatmul(fake, 1, spec, 1<<20, LtAlign{256, 256, 256, 256}); err == nil {
		t.Fatal("no algorithm accepted")
	}
	for h, o := range fake.objects {
		if !o.destroyed {
			t.Errorf("%s %#x leaked after the error", o.kind, h)
		}
	}
}

// The output fusions the pass pipeline makes of dense layers are rendered
// from the plan's description: a Product entry computing the dot_general
// into the buffer of result DotResult, then the epilogue reading it there.
// Run on the host (gcc), the whole kernel matches eval of the fusion, and so
// does the epilogue alone over a DotResult buffer holding eval's product —
// what the backend launches after cuBLASLt wrote it.
func TestOutputFusionEpilogueHostC(t *testing.T) {
	b := newHostBatch(needGCC(t))
	defer b.run()
	rng := testseed.Rand(t, 12)
	f32 := func(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }
	progs := []struct {
		name   string
		params []ir.Type
		fn     func(x []*trace.Array) []*trace.Array
	}{
		{"dense_gelu", []ir.Type{f32(6, 8), f32(8, 5), f32(5)}, func(x []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Gelu(trace.Add(trace.MatMul(x[0], x[1]), x[2]), true)}
		}},
		{"batched_scale", []ir.Type{f32(2, 3, 4), f32(2, 4, 5)}, func(x []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Tanh(trace.Mul(trace.MatMul(x[0], x[1]), trace.Scalar(0.5)))}
		}},
		{"product_bits_reused", []ir.Type{f32(3, 4), f32(4, 6)}, func(x []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Convert(trace.Mul(trace.MatMul(x[0], x[1]), trace.Scalar(3)), ir.Int32)}
		}},
	}
	type run struct {
		job  *hostJob
		want []*ir.Literal
	}
	for _, p := range progs {
		t.Run(p.name, func(t *testing.T) {
			prog, err := passes.Compile(traceFn(t, p.params, p.fn), passes.Options{FusionInPlace: false})
			if err != nil {
				t.Fatal(err)
			}
			var runs []run
			for _, op := range prog.Func.Body.Ops {
				if op.Code != ir.Fusion || op.Attrs.String("kind") != "output" {
					continue
				}
				pk, err := passes.LowerKernel(op)
				if err != nil {
					t.Fatal(err)
				}
				if pk.Mode != passes.KernelOutput {
					t.Fatalf("the output fusion is not described: %s", pk.Why)
				}
				k, err := GenerateKernel(pk)
				if err != nil {
					t.Fatal(err)
				}
				if !k.Entries[0].Product || slices.ContainsFunc(k.Entries[1:], func(e Entry) bool { return e.Product }) {
					t.Fatalf("entries %+v: want the Product entry first, and only there", k.Entries)
				}
				var ins []*ir.Literal
				for _, a := range op.Args {
					ins = append(ins, randomLiteral(rng, a.Type))
				}
				d, err := eval.EvalOp(pk.Dot, []*ir.Literal{ins[pk.DotArgs[0]], ins[pk.DotArgs[1]]})
				if err != nil {
					t.Fatal(err)
				}
				want, err := eval.EvalOp(op, ins)
				if err != nil {
					t.Fatal(err)
				}
				epilogue := *k
				epilogue.Entries = k.Entries[1:]
				initial := slices.Clone(ins)
				for i, r := range op.Results {
					l := ir.NewLiteral(r.Type)
					if i == pk.DotResult {
						copy(l.Data, d[0].Data)
					}
					initial = append(initial, l)
				}
				runs = append(runs, run{b.add(k, ins), want}, run{b.add(&epilogue, initial), want})
			}
			if len(runs) == 0 {
				t.Fatalf("no output fusion in\n%v", prog.Func)
			}
			t.Parallel()
			for _, r := range runs {
				got := b.results(t, r.job)
				for i := range r.want {
					compareKernel(t, fmt.Sprintf("%s result %d", p.name, i), r.job.k, got[i], r.want[i])
				}
			}
		})
	}
}

// ltAlignment is the largest power of two up to 256 dividing the address of
// every batch's matrix, checked against a search over the batches.
func TestLtAlignment(t *testing.T) {
	rng := testseed.Rand(t, 17)
	for range 2000 {
		p := uintptr(rng.IntN(1<<20)) << rng.IntN(10)
		stride := int64(rng.IntN(1<<12)) << rng.IntN(9)
		batch := 1 + rng.IntN(4)
		want := uint32(256)
		for want > 1 {
			ok := true
			for i := range batch {
				if (uint64(p)+uint64(int64(i)*stride))%uint64(want) != 0 {
					ok = false
				}
			}
			if ok {
				break
			}
			want /= 2
		}
		if got := ltAlignment(p, stride, batch); got != want {
			t.Fatalf("ltAlignment(%#x, %d, %d) = %d, want %d", p, stride, batch, got, want)
		}
	}
}

// The heuristic is told the alignment of A, B, C and D
// (MIN_ALIGNMENT_{A,B,C,D}_BYTES, uint32 attributes 5 to 8 of the
// preference): the prepared one, and, when Run gets pointers aligned less
// than that, their alignment, in a second heuristic call whose algorithm
// that Run and later ones with such pointers use.
func TestLtMatmulAlignment(t *testing.T) {
	fn := ir.NewFunc("f")
	l := fn.Body.AddParam(ir.TypeOf(ir.Float32, 2, 3, 4))
	r := fn.Body.AddParam(ir.TypeOf(ir.Float32, 2, 4, 5))
	op, err := fn.Body.AddOp(ir.DotGeneral, []*ir.Value{l, r}, ir.Attrs{"lhs_batch": []int{0}, "rhs_batch": []int{0}, "lhs_contract": []int{2}, "rhs_contract": []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := MatmulSpecFor(op, false)
	if err != nil {
		t.Fatal(err)
	}
	// Batch strides: A (rhs) 4·5·4 = 80 bytes, B (lhs) 3·4·4 = 48, C 3·5·4 = 60.
	if got, want := spec.Align(0x1000, 0x2000, 0x3000), (LtAlign{16, 16, 4, 4}); got != want {
		t.Fatalf("Align of 4 KiB aligned pointers = %v, want %v (the batch strides' alignment)", got, want)
	}
	fn2 := ir.NewFunc("g")
	l2 := fn2.Body.AddParam(ir.TypeOf(ir.Float32, 8, 16))
	r2 := fn2.Body.AddParam(ir.TypeOf(ir.Float32, 16, 32))
	op2, _ := fn2.Body.AddOp(ir.DotGeneral, []*ir.Value{l2, r2}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}})
	spec2, err := MatmulSpecFor(op2, false)
	if err != nil {
		t.Fatal(err)
	}
	fake := newFakeLt()
	prepared := LtAlign{64, 256, 128, 128}
	m, err := newLtMatmul(fake, 1, spec2, 1<<20, prepared)
	if err != nil {
		t.Fatal(err)
	}
	prefs := func() map[uintptr][]byte {
		for _, o := range fake.objects {
			if o.kind == "cublasLtMatmulPreferenceCreate" {
				return o.attrs
			}
		}
		t.Fatal("no preference")
		return nil
	}
	checkPrefs := func(want LtAlign) {
		t.Helper()
		p := prefs()
		for i, attr := range []uintptr{5, 6, 7, 8} {
			if b := p[attr]; len(b) != 4 || uint32(le32(b)) != want[i] {
				t.Fatalf("preference attribute %d = %x, want %d as uint32", attr, b, want[i])
			}
		}
	}
	checkPrefs(prepared)
	heuristics := func() int { return len(fake.find("cublasLtMatmulAlgoGetHeuristic")) }
	algoOf := func(i int) uintptr { return fake.find("cublasLtMatmul")[i].args[12] }
	// Pointers as aligned as prepared: no new heuristic call.
	if err := m.Run(0x10040, 0x20000, 0x30080, 0x40000, 1<<20, 7); err != nil {
		t.Fatal(err)
	}
	if heuristics() != 1 {
		t.Fatalf("%d heuristic calls, want 1", heuristics())
	}
	// A less aligned rhs (A): the heuristic is asked again with 16.
	if err := m.Run(0x10010, 0x20000, 0x30080, 0x40000, 1<<20, 7); err != nil {
		t.Fatal(err)
	}
	if heuristics() != 2 {
		t.Fatalf("%d heuristic calls, want 2", heuristics())
	}
	checkPrefs(LtAlign{16, 256, 128, 128})
	if err := m.Run(0x50010, 0x60000, 0x70080, 0x40000, 1<<20, 7); err != nil {
		t.Fatal(err)
	}
	if heuristics() != 2 || algoOf(1) != algoOf(2) || algoOf(0) == algoOf(1) {
		t.Fatalf("%d heuristic calls, algorithms %#x %#x %#x: want 2 calls and the second algorithm reused", heuristics(), algoOf(0), algoOf(1), algoOf(2))
	}
	if _, err := newLtMatmul(newFakeLt(), 1, spec2, 1<<20, LtAlign{48, 256, 256, 256}); err == nil {
		t.Error("an alignment of 48 accepted")
	}
}
