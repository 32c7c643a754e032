package vmath

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

// codeHashCases are the chains whose generated code TestCodeHashes pins:
// every op alone, laid out as the kernels compile it (oneOp), and a few
// longer chains (gelu forms, random chains that spill) over the ops up to
// OpErf (a new op adds its own case; the others must not change).
func codeHashCases() map[string]func() ([]Instr, int, []bool) {
	cases := map[string]func() ([]Instr, int, []bool){
		"geluCode":          geluCode,
		"geluTanhChain":     func() ([]Instr, int, []bool) { return geluTanhChain, 18, nil },
		"geluLogisticChain": func() ([]Instr, int, []bool) { return geluLogisticChain, 16, nil },
		"rsqrt":             func() ([]Instr, int, []bool) { return []Instr{{Op: OpRsqrt, Dst: 1}}, 2, nil },
		"maskChain":         maskHashChain,
		"maskShared":        maskSharedChain,
	}
	for op := OpAdd; op <= OpErf; op++ {
		nvals := 2
		if op <= OpMin {
			nvals = 3
		}
		cases[fmt.Sprintf("op%d", op)] = func() ([]Instr, int, []bool) {
			return []Instr{{Op: op, Dst: int32(nvals - 1), A: 0, B: int32(nvals - 2)}}, nvals, nil
		}
	}
	for _, sz := range []struct {
		seed            uint64
		nin, nuni, nins int
	}{{1, 3, 1, 14}, {2, 4, 2, 30}, {3, 6, 2, 60}} {
		cases[fmt.Sprintf("rand%d", sz.seed)] = func() ([]Instr, int, []bool) {
			r := rand.New(rand.NewPCG(sz.seed, 7))
			code, uni := randChain(r, sz.nin, sz.nuni, sz.nins, OpErf)
			return code, sz.nin + sz.nins, uni
		}
	}
	return cases
}

// codeHash is the SHA-256 (first 8 bytes, hex) of the code generated for
// a chain: for AVX2 (vex) or AVX-512, with contraction on and off, with
// ordinary and non-temporal stores.
func codeHash(t *testing.T, code []Instr, nvals int, uniform []bool, vex bool) string {
	h := sha256.New()
	for _, fuse := range []bool{false, true} {
		vals, err := checkChain(code, nvals, uniform)
		if err != nil {
			t.Fatal(err)
		}
		cc, _ := contract(code, vals, fuse)
		c, err := generateChain(cc, vals, vex)
		if err != nil {
			t.Fatal(err)
		}
		nt, err := generateUnrolled(cc, vals, true, c.unroll, vex)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(c.code)
		h.Write(nt.code)
	}
	return fmt.Sprintf("%x", h.Sum(nil)[:8])
}

// TestCodeHashes checks that the generator's code for a fixed set of
// chains is byte for byte what it was when the AVX-512 kernels were
// checked on AVX-512 hardware (bit for bit against the hand-written
// kernels they replaced; see the package doc): a change to the generated
// code must be deliberate, and rechecked there. VMATH_CODEHASH=print
// prints the table.
func TestCodeHashes(t *testing.T) {
	want := map[string][2]string{ // AVX-512, AVX2
		"geluCode":          {"87bf52027f5d255a", "3926f09ca487c61d"},
		"geluLogisticChain": {"5e9cfa0a4d440bb2", "8b00dba1da029086"},
		"geluTanhChain":     {"e0a7118e16b708e5", "352452590c1ae596"},
		"op1":               {"bc7445794aae5395", "b8bb14f16232b9b9"},
		"op10":              {"2e7e5e1c8f082321", "602d6fcdf7b6156d"},
		"op11":              {"2c27f1396ef550ef", "ca935b8e69bbfbea"},
		"op12":              {"d21a7d2e55f2b564", "f7a72c0700e4c3ba"},
		"op13":              {"714ff74af4fce2dd", "967e30e8d1ba1346"},
		"op14":              {"d4b180ff05822a09", "a5f2b07ace56c8ee"},
		"op2":               {"dd468b0800d671fd", "4256c2f7056854ec"},
		"op3":               {"9995fbf6a85f8c14", "97ae2c49e9af70c3"},
		"op4":               {"3400b779ddeb2809", "a814f15f8bc9ad08"},
		"op5":               {"859faf580f343fd8", "9f1f34939a623447"},
		"op6":               {"eb5322c7d5354481", "e7dc0b34ef564c77"},
		"op7":               {"4cafeb3b5794c91c", "551d68181a87aa92"},
		"op8":               {"aaffb1f953c827a8", "d0dc409540913e9f"},
		"op9":               {"cd43837ed6322b0d", "695a023d53fb8776"},
		"rand1":             {"2c11323634bb71e4", "a60392229357b87c"},
		"rand2":             {"959c2fad9a6a9fbc", "d8daac804493fb4f"},
		"rand3":             {"cb2cc11d91b57c57", "6e1e7934728d7833"},
		"rsqrt":             {"23ac18573b3014fa", "cfbbf2477c9c22fb"},
		"maskChain":         {"f20a5766fa72d7f0", "a4e4bb50f2b657f7"},
		"maskShared":        {"c643a32fb03d6358", "77cf6b967a0dd2bc"},
	}
	cases := codeHashCases()
	print := os.Getenv("VMATH_CODEHASH") == "print"
	for name, mk := range cases {
		code, nvals, uni := mk()
		got := [2]string{codeHash(t, code, nvals, uni, false), codeHash(t, code, nvals, uni, true)}
		if print {
			fmt.Printf("\t\t%q: {%q, %q},\n", name, got[0], got[1])
			continue
		}
		if got != want[name] {
			t.Errorf("%s: generated code hashes %v, want %v", name, got, want[name])
		}
	}
}

// maskHashChain is where(a > b, a*b, -a) with the compare's mask kept in
// registers.
func maskHashChain() ([]Instr, int, []bool) {
	return []Instr{
		{Op: OpGt | NoStore, Dst: 2, A: 0, B: 1},
		{Op: OpMul | NoStore, Dst: 3, A: 0, B: 1},
		{Op: OpNeg | NoStore, Dst: 4, A: 0},
		{Op: OpSelect, Dst: 5, A: 2, B: 3, C: 4},
	}, 6, nil
}

// maskSharedChain reads one compare's mask in two selects (so it is a
// value: all bits set where true).
func maskSharedChain() ([]Instr, int, []bool) {
	return []Instr{
		{Op: OpGe | NoStore, Dst: 2, A: 0, B: 1},
		{Op: OpSelect, Dst: 3, A: 2, B: 0, C: 1},
		{Op: OpSelect, Dst: 4, A: 2, B: 1, C: 0},
	}, 5, nil
}
