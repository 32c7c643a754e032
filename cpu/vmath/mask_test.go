package vmath

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"testing"
)

// cmp64 is the reference of compare op: the predicate on float64 (NaN
// compares false, except ne).
func cmp64(op int32, a, b float32) bool {
	x, y := float64(a), float64(b)
	switch op {
	case OpEq:
		return x == y
	case OpNe:
		return !(x == y)
	case OpLt:
		return x < y
	case OpLe:
		return x <= y
	case OpGt:
		return x > y
	}
	return x >= y
}

// randMaskChain is a random chain mixing the arithmetic ops with compares
// (whose masks only selects read, as cpuexec emits them) and selects;
// mask[v] reports value v is a mask.
func randMaskChain(r *rand.Rand, nin, nins int) (code []Instr, mask []bool) {
	nv := nin
	mask = make([]bool, nin+nins)
	pick := func() int32 {
		for {
			v := r.IntN(nv)
			if r.IntN(2) == 0 && nv > nin {
				v = nv - 1 - r.IntN(min(3, nv-nin))
			}
			if !mask[v] {
				return int32(v)
			}
		}
	}
	var masks []int32
	for k := 0; k < nins; k++ {
		in := Instr{Dst: int32(nv)}
		switch c := r.IntN(3); {
		case c == 0:
			in.Op, in.A, in.B = OpEq+int32(r.IntN(6)), pick(), pick()
			mask[nv] = true
			masks = append(masks, int32(nv))
		case c == 1 && len(masks) > 0:
			in.Op, in.A, in.B, in.C = OpSelect, masks[r.IntN(len(masks))], pick(), pick()
		default:
			in.Op, in.A, in.B = OpAdd+int32(r.IntN(int(opEnd-OpAdd))), pick(), pick()
		}
		if r.IntN(3) == 0 {
			in.Op |= NoStore
		}
		code = append(code, in)
		nv++
	}
	return code, mask
}

// TestMaskChainMatchesReference checks chains with compares and selects,
// AVX2 and AVX-512 code where the CPU runs them, bit for bit against a
// reference (float64 compares, a Go select, the kernels for the other ops;
// contraction off), over inputs with NaNs, ±0 and infinities.
func TestMaskChainMatchesReference(t *testing.T) {
	widths := map[string]bool{}
	for _, im := range available() {
		switch im {
		case avx2Impl:
			widths["avx2"] = true
		case avx512Impl:
			widths["avx512"] = true
		}
	}
	if !JITAvailable() || len(widths) == 0 {
		t.Skip("no code generation here")
	}
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	for trial := 0; trial < 60; trial++ {
		nin, nins := 1+r.IntN(6), 1+r.IntN(40)
		code, mask := randMaskChain(r, nin, nins)
		nv := nin + nins
		for _, vex := range []bool{true, false} {
			if !widths[map[bool]string{true: "avx2", false: "avx512"}[vex]] {
				continue
			}
			ch, err := compileChain(code, nv, nil, vex, false)
			if err != nil {
				t.Fatal(err)
			}
			checkMaskChain(t, r, ch, code, mask, nin)
		}
	}
}

// checkMaskChain runs ch (compiled from code) over random inputs of
// several lengths and compares it bit for bit with the reference.
func checkMaskChain(t *testing.T, r *rand.Rand, ch *Chain, code []Instr, mask []bool, nin int) {
	t.Helper()
	nv := len(mask)
	for _, n := range []int{1, 7, 8, 9, 33, 100, 1031} {
		got, want := make([][]float32, nv), make([][]float32, nv)
		for i := range got {
			got[i] = make([]float32, n)
			if i < nin {
				copy(got[i], randVec(r, n))
				for j := range got[i] {
					if i > 0 && r.IntN(4) == 0 { // equal operands are common in ReLU's max gradient
						got[i][j] = got[i-1][j]
					}
				}
			}
			want[i] = append([]float32(nil), got[i]...)
		}
		ptrs := make([]*float32, nv)
		for i := range ptrs {
			ptrs[i] = &got[i][0]
		}
		if !ch.Run(ptrs, n) {
			t.Fatal("Run refused")
		}
		runChainRef(code, want, n)
		for k, in := range code {
			if in.Op&NoStore != 0 {
				continue
			}
			for j := 0; j < n; j++ {
				if g, w := got[in.Dst][j], want[in.Dst][j]; math.Float32bits(g) != math.Float32bits(w) {
					t.Fatalf("%d lanes, n=%d instruction %d (op %#x, mask %v, a=%v b=%v): element %d got %#x, want %#x",
						ch.lanes, n, k, in.Code(), mask[in.Dst], want[in.A][j], want[in.B][j], j, math.Float32bits(g), math.Float32bits(w))
				}
			}
		}
	}
}

func hasMask(code []Instr) bool {
	for _, in := range code {
		if isMaskOp(in.Code()) {
			return true
		}
	}
	return false
}

// TestMaskKernels checks CompareKernel and Select against the reference,
// and that RunProgram computes chains with compares (the pure-Go kernels
// where it leaves them).
func TestMaskKernels(t *testing.T) {
	r := testseed.Rand(t, 12)
	a, b := randVec(r, 77), randVec(r, 77)
	for i := 0; i < 77; i += 5 {
		b[i] = a[i]
	}
	for op := OpEq; op < OpSelect; op++ {
		if CompareByName(maskOps[op-OpEq].name) != op {
			t.Errorf("CompareByName(%q)", maskOps[op-OpEq].name)
		}
		m, dst := make([]float32, 77), make([]float32, 77)
		CompareKernel(op)(m, a, b)
		Select(dst, m, a, b)
		for i := range m {
			w := cmp64(op, a[i], b[i])
			if bits := math.Float32bits(m[i]); bits != 0 && bits != 0xffffffff || (bits != 0) != w {
				t.Fatalf("op %#x: mask %#x for %v, %v", op, bits, a[i], b[i])
			}
			ws := b[i]
			if w {
				ws = a[i]
			}
			if math.Float32bits(dst[i]) != math.Float32bits(ws) {
				t.Fatalf("select: %v, want %v", dst[i], ws)
			}
		}
	}
	if CompareKernel(OpAdd) != nil || CompareByName("add") != 0 {
		t.Error("add is a compare")
	}
}
