package vmath

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/cpu/internal/x86emu"
	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// emuInstrs decodes the instructions of generated code (up to the last
// RET before the constant pool) and returns their offsets and decodings.
func emuInstrs(code []byte) ([]int, []*x86emu.Inst, error) {
	var offs []int
	var ins []*x86emu.Inst
	for off := 0; off < len(code); {
		if code[off] == 0xcc { // the padding before the pool
			break
		}
		in, err := x86emu.Decode(code[off:], 0)
		if err != nil {
			return nil, nil, fmt.Errorf("offset %#x: %v", off, err)
		}
		offs, ins = append(offs, off), append(ins, in)
		off += in.Len
	}
	return offs, ins, nil
}

// emuMutations are the corruptions of one EVEX instruction the test
// applies: flip the immediate's low bit (a compare predicate, a
// VGETMANTPS interval, a VPTERNLOGD truth table), or turn the opcode into
// its sibling (add/sub, mul/div, max/min, multiply-add/multiply-subtract).
var emuOpcodeSwaps = map[byte]byte{0x58: 0x5c, 0x5c: 0x58, 0x59: 0x5e, 0x5e: 0x59, 0x5f: 0x5d, 0x5d: 0x5f,
	0xa8: 0xaa, 0xaa: 0xa8, 0xb8: 0xba, 0xba: 0xb8, 0xbc: 0xbe, 0xac: 0xae}

// TestEmuCatchesAVX512Mutations proves the interpreted tests fail on a
// wrong AVX-512 result, on any host: in AVX-512 chains of every op (and a
// multiply-add and a compare joined to its select), each EVEX instruction
// with an immediate or an arithmetic opcode is corrupted in a copy of the
// code, one at a time, and the comparison TestEmuChains makes must then
// fail, while the intact code passes it (nearEquivalent lists the few
// corruptions that may change no result).
func TestEmuCatchesAVX512Mutations(t *testing.T) {
	r := testseed.Rand(t, 34)
	chains := [][]Instr{
		{{Op: OpMul | NoStore, Dst: 2, A: 0, B: 1}, {Op: OpAdd, Dst: 3, A: 2, B: 1}},
		{{Op: OpGt | NoStore, Dst: 2, A: 0, B: 1}, {Op: OpSelect, Dst: 3, A: 2, B: 0, C: 1}},
	}
	for op := OpAdd; op < opEnd; op++ {
		chains = append(chains, []Instr{{Op: op, Dst: 2, A: 0, B: 1}})
	}
	m := &emuMutations{t: t}
	for _, code := range chains {
		m.chain(r, code)
	}
	if m.missed > m.total/50 {
		t.Errorf("%d of %d corruptions unnoticed", m.missed, m.total)
	}
	if m.total < 40 {
		t.Fatalf("only %d corruptions tried", m.total)
	}
	t.Logf("%d corruptions of AVX-512 instructions, %d unnoticed", m.total, m.missed)
}

// emuMutations counts the corruptions TestEmuCatchesAVX512Mutations tried
// and those that went unnoticed.
type emuMutations struct {
	t             *testing.T
	total, missed int
}

// emuMutationDense is the length of the case whose inputs are dense where
// erf's correction terms matter most.
const emuMutationDense = chainMaxPerCall + 5

// emuMutationSweep is the length of the case that runs the whole sweep
// grid through the main loop.
const emuMutationSweep = 8192

// chain compiles code with EVEX instructions, checks it intact on its
// cases, then corrupts each of its EVEX instructions in turn and counts
// the corruptions that no case notices.
func (m *emuMutations) chain(r *rand.Rand, code []Instr) {
	t := m.t
	uniform := make([]bool, int(code[len(code)-1].Dst)+1)
	ec, err := compileEmu(code, len(uniform), uniform, false, true)
	if err != nil {
		t.Fatal(err)
	}
	vals, _ := checkChain(code, len(uniform), uniform)
	cc, _ := contract(code, vals, true)
	cases, inputs := emuMutationCases(r, code, uniform)
	for i, c := range cases {
		if _, err := ec.check(c, cc, inputs[i], false, true); err != nil {
			t.Fatalf("intact %v: %v", code, err)
		}
	}
	offs, ins, err := emuInstrs(ec.code)
	if err != nil {
		t.Fatal(err)
	}
	orig := ec.code
	for k, in := range ins {
		b := in.Bytes
		if b[0] != 0x62 {
			continue // EVEX only
		}
		at := offs[k]
		for _, mut := range evexMutations(in, at) {
			bad := append([]byte(nil), orig...)
			mut(bad)
			ec.code = bad
			caught := false
			for i, c := range cases {
				if _, err := ec.check(c, cc, inputs[i], false, true); err != nil {
					caught = true
					break
				}
			}
			m.total++
			if !caught {
				t.Logf("chain %v: corrupting %s at offset %#x (% x → % x) went unnoticed", code, in.Name, at,
					b, bad[at:at+in.Len])
				m.missed++
				if !nearEquivalent(code[0].Code(), in) {
					t.Fail()
				}
			}
		}
	}
	ec.code = orig
}

// evexMutations returns the corruptions tried of the EVEX instruction in
// at offset at of the code: an opcode swapped for a similar one, and the
// low bit of an imm8 flipped.
func evexMutations(in *x86emu.Inst, at int) []func(c []byte) {
	b := in.Bytes
	var muts []func(c []byte)
	if sw, ok := emuOpcodeSwaps[b[4]]; ok && (b[1]&7 == 1 && b[2]&3 == 0 && b[4] < 0x60 || b[1]&7 == 2 && b[2]&3 == 1 && b[4] >= 0xa8) {
		muts = append(muts, func(c []byte) { c[at+4] = sw })
	}
	if hasImm(in.Name) {
		muts = append(muts, func(c []byte) { c[at+in.Len-1] ^= 1 })
	}
	return muts
}

// emuMutationCases returns the cases of code and their inputs. 149 and
// 1045 elements: the main loop (up to 8 vectors per iteration), the
// single-vector loop once and the masked tail; 13: the tail alone. The
// dense case's inputs are dense in ±[0.875, 1.5], where erf's exp
// (1 - e^Q) is largest and its correction terms matter most, and in
// [-6, 6]. Then seed-independent inputs (sweepGrid): the whole grid
// through the main loop, and 32 slices of 127 elements through the
// single-vector loop and the masked tail, which the random cases reach
// with a few dozen elements only.
func emuMutationCases(r *rand.Rand, code []Instr, uniform []bool) ([]*emuCase, [][][]float32) {
	lens := []int{149, 1045, 13, emuMutationDense, emuMutationSweep}
	for range 32 {
		lens = append(lens, 127)
	}
	var cases []*emuCase
	for _, n := range lens {
		cases = append(cases, &emuCase{code: code, nin: 2, uniform: uniform, n: n})
	}
	inputs := make([][][]float32, len(cases))
	slice := 0
	for i, c := range cases {
		inputs[i] = c.newVals(r)
		for k, v := range inputs[i][:2] { // every edge value in every part of the loop
			for j := k; j < len(v); j += 5 {
				v[j] = edgeValues[(j/5)%len(edgeValues)]
			}
		}
		if c.n == emuMutationSweep || c.n == 127 {
			at := 0
			if c.n == 127 {
				at, slice = slice*127, slice+1
			}
			for j := range c.n {
				inputs[i][0][j], inputs[i][1][j] = sweepGrid(at+j, emuMutationSweep)
			}
		}
		if c.n == emuMutationDense {
			fillDense(r, inputs[i][:2])
		}
	}
	return cases, inputs
}

// fillDense fills vs with values, every other one dense in ±[0.875, 1.5]
// (negative every fourth), the others in [-6, 6].
func fillDense(r *rand.Rand, vs [][]float32) {
	for _, v := range vs {
		for j := range v {
			v[j] = float32(r.Float64()*12 - 6)
			if j%2 == 0 {
				v[j] = float32(0.875 + r.Float64()*0.625)
				if j%4 == 0 {
					v[j] = -v[j]
				}
			}
		}
	}
}

// hasImm reports whether the instruction named name ends in an imm8 whose
// low bit changes its result.
func hasImm(name string) bool {
	switch name {
	case "VCMPPS", "VGETMANTPS", "VPTERNLOGD", "VRNDSCALEPS":
		return true
	}
	return false
}

// nearEquivalent reports whether corrupting in may leave op's results
// unchanged over any inputs the test draws, so that going unnoticed is no
// failure: in erf, tanh and logistic, e^x's last correction terms (the
// table's error and ln2's low part, 2^-22 relative, VFNMADD231PS and
// VFMADD213PS) reach the result through 1 ± e^x or a division that mostly
// rounds them away (the same instructions are caught in exp); in log,
// the x == 0 → -inf fix-up (VCMPPS EQ) is redundant with what the
// reduction computes for ±0, so EQ_OQ → LT_OS changes nothing.
func nearEquivalent(op int32, in *x86emu.Inst) bool {
	switch op {
	case OpErf, OpTanh, OpLogistic:
		return in.Name == "VFNMADD231PS" || in.Name == "VFMADD213PS"
	case OpLog:
		return in.Name == "VCMPPS" && in.Bytes[in.Len-1] == cmpEQ
	}
	return false
}

// sweepGrid is element j of n of the mutation test's seed-independent
// inputs: for the first operand, even elements a grid over [-12, 12], odd
// ones every 64th mantissa in [1, 2) over 64 binades (log's reduction);
// for the second, magnitudes e^-8 … e^8 of alternating sign.
func sweepGrid(j, n int) (float32, float32) {
	x := -12 + 24*float64(j)/float64(n)
	if j%2 == 1 {
		x = math.Ldexp(1+float64(j/128)/64, j/2%64-32)
	}
	return float32(x), float32(math.Copysign(math.Exp(float64(j%512)/32-8), float64(j%2*2-1)))
}
