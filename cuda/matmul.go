package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ferryml/ferry/ir"
)

// Numeric values of the cuBLASLt, cuBLAS and CUDA enums used here. They are
// part of the libraries' ABI (the headers give each enumerator an explicit
// value); checked against cublasLt.h (cublasLtMatmulDescAttributes_t,
// cublasLtMatrixLayoutAttribute_t, cublasLtMatmulPreferenceAttributes_t,
// cublasLtEpilogue_t, cublasLtMatmulHeuristicResult_t), cublas_api.h
// (cublasComputeType_t, cublasOperation_t) and library_types.h
// (cudaDataType_t), as published in the CUDA 11.x/12.x toolkits and mirrored
// by NVIDIA's nvmath-python bindings (nvmath.bindings.cublasLt.
// MatmulDescAttribute: COMPUTE_TYPE 0, SCALE_TYPE 1, TRANSA 3, TRANSB 4,
// EPILOGUE 7, BIAS_POINTER 8).
const (
	// cudaDataType_t.
	cudaR32F  = 0
	cudaR64F  = 1
	cudaR16F  = 2
	cudaR16BF = 14

	// cublasComputeType_t.
	cublasCompute32F         = 68
	cublasCompute32FFastTF32 = 77
	cublasCompute64F         = 70

	// cublasOperation_t.
	cublasOpN = 0
	cublasOpT = 1

	// cublasLtMatmulDescAttributes_t (value types in the comments).
	ltDescScaleType   = 1 // int32
	ltDescTransA      = 3 // int32 (cublasOperation_t)
	ltDescTransB      = 4 // int32
	ltDescEpilogue    = 7 // uint32 (cublasLtEpilogue_t)
	ltDescBiasPointer = 8 // const void*

	// cublasLtMatrixLayoutAttribute_t.
	ltLayoutBatchCount         = 5 // int32
	ltLayoutStridedBatchOffset = 6 // int64, in elements

	// cublasLtMatmulPreferenceAttributes_t (the same values in CUDA 13's
	// cublasLt.h, as nvmath-python's bindings for cuBLASLt 13 list them:
	// MAX_WORKSPACE_BYTES 1, MIN_ALIGNMENT_A_BYTES..D_BYTES 5..8).
	ltPrefMaxWorkspaceBytes = 1 // uint64
	ltPrefMinAlignmentA     = 5 // uint32, bytes; default 256
	ltPrefMinAlignmentB     = 6
	ltPrefMinAlignmentC     = 7
	ltPrefMinAlignmentD     = 8

	// cublasLtEpilogue_t.
	ltEpilogueDefault  = 1
	ltEpilogueBias     = 4
	ltEpilogueGelu     = 32
	ltEpilogueGeluBias = 36

	// sizeof(cublasLtMatmulHeuristicResult_t): cublasLtMatmulAlgo_t algo
	// (uint64_t data[8], 64 bytes), size_t workspaceSize (at 64),
	// cublasStatus_t state (int, at 72), float wavesCount (at 76),
	// int reserved[4] (at 80).
	ltHeuristicResultSize = 96
	ltAlgoSize            = 64
	ltHeuristicWorkspace  = 64
	ltHeuristicState      = 72
)

// TF32Env names the environment variable that lets float32 matmuls use
// TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32) when set to 1; by default
// they compute in exact float32 (CUBLAS_COMPUTE_32F), matching the CPU
// backend to float32 rounding.
const TF32Env = "FERRY_CUDA_ALLOW_TF32"

// MatmulSpec is a dot_general as one cuBLASLt matmul: the layout and the
// cuBLASLt data types (cudaDataType_t of A, B and C/D, the compute type and
// the scale type of alpha and beta).
type MatmulSpec struct {
	Layout              MatmulLayout
	AType, BType, CType int32
	Compute, Scale      int32
}

// MatmulSpecFor returns the cuBLASLt form of a dot_general: f32 (exact f32
// compute, or TF32 when allowTF32), f16 and bf16 with f32 accumulation and
// scale, f64; or an error saying why cuBLASLt does not take it (integer
// dtypes, an empty dimension, or a layout PlanMatmul rejects), in which case
// the generated kernel computes it.
func MatmulSpecFor(op *ir.Op, allowTF32 bool) (MatmulSpec, error) {
	l, err := PlanMatmul(op)
	if err != nil {
		return MatmulSpec{}, err
	}
	if l.M == 0 || l.N == 0 || l.K == 0 || l.Batch == 0 {
		return MatmulSpec{}, fmt.Errorf("empty matmul %d×%d×%d (batch %d)", l.M, l.N, l.K, l.Batch)
	}
	s := MatmulSpec{Layout: l}
	var dt int32
	switch op.Args[0].Type.DType {
	case ir.Float32:
		dt, s.Compute, s.Scale = cudaR32F, cublasCompute32F, cudaR32F
		if allowTF32 {
			s.Compute = cublasCompute32FFastTF32
		}
	case ir.Float16:
		dt, s.Compute, s.Scale = cudaR16F, cublasCompute32F, cudaR32F
	case ir.BFloat16:
		dt, s.Compute, s.Scale = cudaR16BF, cublasCompute32F, cudaR32F
	case ir.Float64:
		dt, s.Compute, s.Scale = cudaR64F, cublasCompute64F, cudaR64F
	default:
		return MatmulSpec{}, fmt.Errorf("dtype %v has no cuBLASLt matmul here", op.Args[0].Type.DType)
	}
	s.AType, s.BType, s.CType = dt, dt, dt
	return s, nil
}

// ltMaxAlignment is the largest alignment worth telling cuBLASLt about: its
// default assumption for every matrix, which excludes the algorithms that
// need more.
const ltMaxAlignment = 256

// LtAlign is the alignment in bytes that cuBLASLt may assume of A, B, C and
// D (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES): a power of two,
// at most ltMaxAlignment.
type LtAlign [4]uint32

// ltAlignment is the alignment of a matrix at address p (in bytes, the
// largest power of two up to ltMaxAlignment dividing it) and, when batch > 1,
// of every batch's matrix at p + i*strideBytes. Arena temporaries are only
// 64-byte aligned (passes.Alignment), and cuBLASLt's heuristic assumes 256
// unless told otherwise.
func ltAlignment(p uintptr, strideBytes int64, batch int) uint32 {
	a := uint64(p) | ltMaxAlignment
	if batch > 1 {
		a |= uint64(strideBytes)
	}
	return uint32(a & -a)
}

// elemBytes is the size of a cudaDataType_t element used here.
func elemBytes(dt int32) int64 {
	switch dt {
	case cudaR64F:
		return 8
	case cudaR16F, cudaR16BF:
		return 2
	}
	return 4
}

// Align returns the alignment of the matmul's matrices at rhs (A), lhs (B)
// and out (C and D), with its batch strides.
func (s MatmulSpec) Align(rhs, lhs, out uintptr) LtAlign {
	l := s.Layout
	c := ltAlignment(out, l.StrideC*elemBytes(s.CType), l.Batch)
	return LtAlign{
		ltAlignment(rhs, l.StrideA*elemBytes(s.AType), l.Batch),
		ltAlignment(lhs, l.StrideB*elemBytes(s.BType), l.Batch),
		c, c,
	}
}

// ltAPI is the part of cuBLASLt a matmul calls: the loaded library's symbol
// table, or a test's fake that records the calls.
type ltAPI interface {
	call(name string, args ...uintptr) Result
}

// ltCells holds every value passed to cuBLASLt by address. It is allocated
// on the heap (never moved) and kept by the LtMatmul, so the addresses stay
// valid for the calls.
type ltCells struct {
	out      uintptr
	val      [16]byte
	returned int32
	alpha    [8]byte
	beta     [8]byte
}

// ltChoice is the heuristic's algorithm for one alignment of the matrices
// (a heap cell whose address cublasLtMatmul gets).
type ltChoice struct {
	heur      [ltHeuristicResultSize]byte
	workspace uint64
}

// LtMatmul is one prepared cuBLASLt matmul: its operation descriptor, the
// matrix layouts of A, B and C (= D), and the algorithm the heuristic chose
// for each alignment of the matrices met so far. Prepare it once at compile
// time with the alignment the buffer plan gives; Run enqueues it on a
// stream, asking the heuristic again (once) should its pointers be less
// aligned than that.
type LtMatmul struct {
	Spec MatmulSpec
	// Workspace is the bytes the algorithm of the prepared alignment needs.
	Workspace uint64
	// Align is the alignment NewLtMatmul prepared for.
	Align        LtAlign
	api          ltAPI
	handle       uintptr
	desc         uintptr
	la, lb       uintptr
	lc           uintptr
	pref         uintptr
	maxWorkspace uint64
	cells        *ltCells

	mu      sync.Mutex
	choices map[LtAlign]*ltChoice
}

// check calls a cuBLASLt entry point. The addresses it passes point into
// m.cells (heap, kept by m); go:uintptrescapes keeps any other address
// converted in a call to check alive too, as for Driver.Check.
//
//go:uintptrescapes
func (m *LtMatmul) check(name string, args ...uintptr) error {
	if r := m.api.call(name, args...); r != 0 {
		return fmt.Errorf("cuda: %s: cublasStatus %d", name, r)
	}
	return nil
}

// set calls a SetAttribute function with v (int32, uint32, int64, uint64 or
// uintptr) encoded in the cells.
func (m *LtMatmul) set(fn string, obj uintptr, attr int, v any) error {
	var u uint64
	n := 8
	switch x := v.(type) {
	case int32:
		u, n = uint64(uint32(x)), 4
	case uint32:
		u, n = uint64(x), 4
	case int64:
		u = uint64(x)
	case uint64:
		u = x
	case uintptr:
		u = uint64(x)
	default:
		return fmt.Errorf("cuda: attribute value %T", v)
	}
	if n == 4 {
		binary.LittleEndian.PutUint32(m.cells.val[:], uint32(u))
	} else {
		binary.LittleEndian.PutUint64(m.cells.val[:], u)
	}
	err := m.check(fn, obj, uintptr(attr), uintptr(unsafe.Pointer(&m.cells.val[0])), uintptr(n))
	runtime.KeepAlive(m.cells)
	if err != nil {
		return fmt.Errorf("%w (attribute %d)", err, attr)
	}
	return nil
}

func (m *LtMatmul) create(fn string, args ...uintptr) (uintptr, error) {
	m.cells.out = 0
	err := m.check(fn, append([]uintptr{uintptr(unsafe.Pointer(&m.cells.out))}, args...)...)
	runtime.KeepAlive(m.cells)
	return m.cells.out, err
}

// layout creates one matrix layout: rows × cols column-major with leading
// dimension ld, batched with stride when batch > 1.
func (m *LtMatmul) layout(dt int32, rows, cols, ld int, batch int, stride int64) (uintptr, error) {
	h, err := m.create("cublasLtMatrixLayoutCreate", uintptr(dt), uintptr(rows), uintptr(cols), uintptr(ld))
	if err != nil {
		return 0, err
	}
	if batch > 1 {
		if err := m.set("cublasLtMatrixLayoutSetAttribute", h, ltLayoutBatchCount, int32(batch)); err != nil {
			return h, err
		}
		if err := m.set("cublasLtMatrixLayoutSetAttribute", h, ltLayoutStridedBatchOffset, stride); err != nil {
			return h, err
		}
	}
	return h, nil
}

// NewLtMatmul creates the descriptors of spec and asks the heuristic for an
// algorithm needing at most maxWorkspace bytes and no more alignment of A,
// B, C and D than align. In cuBLASLt's column-major terms (see
// MatmulLayout) D (m×n = N×M, ld LDC) = op(A) (N×K) · op(B) (K×M): A is the
// dot's rhs, stored N×K (K×N when TransA), B its lhs, stored K×M (M×K when
// TransB). An error (no algorithm, for example) leaves the step to the
// generated kernel.
func NewLtMatmul(lt *CublasLt, handle uintptr, spec MatmulSpec, maxWorkspace uint64, align LtAlign) (*LtMatmul, error) {
	return newLtMatmul(lt.syms, handle, spec, maxWorkspace, align)
}

func newLtMatmul(api ltAPI, handle uintptr, spec MatmulSpec, maxWorkspace uint64, align LtAlign) (*LtMatmul, error) {
	m := &LtMatmul{Spec: spec, api: api, handle: handle, cells: new(ltCells), maxWorkspace: maxWorkspace,
		Align: align, choices: map[LtAlign]*ltChoice{}}
	ok := false
	defer func() {
		if !ok {
			m.Destroy()
		}
	}()
	l := spec.Layout
	var err error
	if m.desc, err = m.create("cublasLtMatmulDescCreate", uintptr(spec.Compute), uintptr(spec.Scale)); err != nil {
		return nil, err
	}
	op := func(t bool) int32 {
		if t {
			return cublasOpT
		}
		return cublasOpN
	}
	if err := m.set("cublasLtMatmulDescSetAttribute", m.desc, ltDescTransA, op(l.TransA)); err != nil {
		return nil, err
	}
	if err := m.set("cublasLtMatmulDescSetAttribute", m.desc, ltDescTransB, op(l.TransB)); err != nil {
		return nil, err
	}
	ar, ac := l.N, l.K
	if l.TransA {
		ar, ac = l.K, l.N
	}
	if m.la, err = m.layout(spec.AType, ar, ac, l.LDA, l.Batch, l.StrideA); err != nil {
		return nil, err
	}
	br, bc := l.K, l.M
	if l.TransB {
		br, bc = l.M, l.K
	}
	if m.lb, err = m.layout(spec.BType, br, bc, l.LDB, l.Batch, l.StrideB); err != nil {
		return nil, err
	}
	if m.lc, err = m.layout(spec.CType, l.N, l.M, l.LDC, l.Batch, l.StrideC); err != nil {
		return nil, err
	}
	if m.pref, err = m.create("cublasLtMatmulPreferenceCreate"); err != nil {
		return nil, err
	}
	if err := m.set("cublasLtMatmulPreferenceSetAttribute", m.pref, ltPrefMaxWorkspaceBytes, maxWorkspace); err != nil {
		return nil, err
	}
	ch, err := m.choose(align)
	if err != nil {
		return nil, err
	}
	m.Workspace = ch.workspace
	c := m.cells
	if spec.Scale == cudaR64F {
		binary.LittleEndian.PutUint64(c.alpha[:], math.Float64bits(1))
	} else {
		binary.LittleEndian.PutUint32(c.alpha[:], math.Float32bits(1))
	}
	ok = true
	return m, nil
}

// choose returns the heuristic's algorithm for matrices aligned to align,
// asking the heuristic (with MIN_ALIGNMENT_{A,B,C,D}_BYTES set to align)
// the first time. m.mu must not be held.
func (m *LtMatmul) choose(align LtAlign) (*ltChoice, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch := m.choices[align]; ch != nil {
		return ch, nil
	}
	for i, attr := range []int{ltPrefMinAlignmentA, ltPrefMinAlignmentB, ltPrefMinAlignmentC, ltPrefMinAlignmentD} {
		if align[i] == 0 || align[i]&(align[i]-1) != 0 || align[i] > ltMaxAlignment {
			return nil, fmt.Errorf("cuda: cuBLASLt alignment %v: want powers of two up to %d", align, ltMaxAlignment)
		}
		if err := m.set("cublasLtMatmulPreferenceSetAttribute", m.pref, attr, align[i]); err != nil {
			return nil, err
		}
	}
	ch, c := new(ltChoice), m.cells
	c.returned = 0
	err := m.check("cublasLtMatmulAlgoGetHeuristic", m.handle, m.desc, m.la, m.lb, m.lc, m.lc, m.pref, 1,
		uintptr(unsafe.Pointer(&ch.heur[0])), uintptr(unsafe.Pointer(&c.returned)))
	runtime.KeepAlive(c)
	if err != nil {
		return nil, err
	}
	if c.returned < 1 {
		return nil, fmt.Errorf("cuda: cuBLASLt has no algorithm for %+v aligned to %v", m.Spec, align)
	}
	if st := int32(binary.LittleEndian.Uint32(ch.heur[ltHeuristicState:])); st != 0 {
		return nil, fmt.Errorf("cuda: cuBLASLt heuristic state %d for %+v", st, m.Spec)
	}
	ch.workspace = binary.LittleEndian.Uint64(ch.heur[ltHeuristicWorkspace:])
	if ch.workspace > m.maxWorkspace {
		return nil, fmt.Errorf("cuda: cuBLASLt algorithm needs %d workspace bytes, %d allowed", ch.workspace, m.maxWorkspace)
	}
	m.choices[align] = ch
	return ch, nil
}

// Run enqueues D = A·B (alpha 1, beta 0; C is D) on stream: rhs is the
// dot's rhs (A), lhs its lhs (B), out the result (D); workspace holds
// workspaceBytes, at least what the algorithm needs. The algorithm is the
// one chosen for the alignment of these pointers (Spec.Align).
func (m *LtMatmul) Run(rhs, lhs, out, workspace uintptr, workspaceBytes uint64, stream uintptr) error {
	ch, err := m.choose(m.Spec.Align(rhs, lhs, out))
	if err != nil {
		return err
	}
	if ch.workspace > workspaceBytes {
		return fmt.Errorf("cuda: cuBLASLt algorithm needs %d workspace bytes, %d given", ch.workspace, workspaceBytes)
	}
	c := m.cells
	err = m.check("cublasLtMatmul", m.handle, m.desc,
		uintptr(unsafe.Pointer(&c.alpha[0])), rhs, m.la, lhs, m.lb,
		uintptr(unsafe.Pointer(&c.beta[0])), out, m.lc, out, m.lc,
		uintptr(unsafe.Pointer(&ch.heur[0])), workspace, uintptr(workspaceBytes), stream)
	runtime.KeepAlive(c)
	runtime.KeepAlive(ch)
	return err
}

// Destroy releases the descriptors.
func (m *LtMatmul) Destroy() {
	for _, d := range []struct {
		fn string
		h  *uintptr
	}{
		{"cublasLtMatmulPreferenceDestroy", &m.pref}, {"cublasLtMatrixLayoutDestroy", &m.lc},
		{"cublasLtMatrixLayoutDestroy", &m.lb}, {"cublasLtMatrixLayoutDestroy", &m.la},
		{"cublasLtMatmulDescDestroy", &m.desc},
	} {
		if *d.h != 0 {
			m.api.call(d.fn, *d.h)
			*d.h = 0
		}
	}
}
