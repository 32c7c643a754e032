package vmath

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestProgram checks that a program computes, bit for bit, what the
// functions of its opcodes compute one after the other: all of it with
// each generated-code implementation, none of it with pure Go.
func TestProgram(t *testing.T) { impls(t, testProgram) }

func testProgram(t *testing.T) {
	const n = 1000
	r := rand.New(rand.NewPCG(1, 2))
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 3)
		y[i] = float32(r.NormFloat64() * 3)
	}
	x[3], y[5] = float32(math.NaN()), float32(math.Inf(-1))
	// vals: 0 x, 1 y, then one value per instruction.
	vals := [][]float32{x, y}
	var code []Instr
	want := [][]float32{x, y}
	for op := OpAdd; op < opEnd; op++ {
		a, b := int32(len(vals)-1), int32(len(vals)-2)
		if op%3 == 0 {
			a, b = 1, 0
		}
		in := Instr{Op: op, Dst: int32(len(vals)), A: a, B: b}
		if len(code) > 0 && code[len(code)-1].Dst == a {
			in.Op |= AccA
		}
		if len(code) > 0 && code[len(code)-1].Dst == b {
			in.Op |= AccB
		}
		code = append(code, in)
		w := make([]float32, n)
		if f := kernel2[op]; f != nil {
			f(w, want[a], want[b])
		} else {
			kernel1[op](w, want[a])
		}
		want = append(want, w)
		vals = append(vals, make([]float32, n))
	}
	ptrs := make([]*float32, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i][0]
	}
	m := RunProgram(code, ptrs, n)
	// And with a result kept in registers only.
	vals2 := make([][]float32, len(vals))
	ptrs2 := make([]*float32, len(vals))
	for i := range vals {
		vals2[i] = append([]float32(nil), vals[i]...)
		if i >= 2 {
			clear(vals2[i])
		}
		ptrs2[i] = &vals2[i][0]
	}
	code2 := append([]Instr(nil), code...)
	code2[3].Op |= NoStore // read by the next one only (as a)
	RunProgram(code2, ptrs2, n)
	for i := range vals {
		for j := 0; j < m && i != int(code2[3].Dst); j++ {
			if math.Float32bits(vals2[i][j]) != math.Float32bits(want[i][j]) {
				t.Fatalf("NoStore: value %d element %d: got %v, want %v", i, j, vals2[i][j], want[i][j])
			}
		}
	}
	if want := map[bool]int{true: n, false: 0}[JITAvailable()]; m != want {
		t.Fatalf("RunProgram computed %d elements with %s kernels, want %d", m, Impl(), want)
	}
	for i := range want {
		for j := 0; j < m; j++ {
			if math.Float32bits(want[i][j]) != math.Float32bits(vals[i][j]) {
				t.Fatalf("value %d element %d: got %v, want %v", i, j, vals[i][j], want[i][j])
			}
		}
	}
}

// TestProgramFallback checks what RunProgram leaves to its caller: a
// program CompileChain refuses (a value written twice) computes nothing,
// and a bad instruction panics; a program runs the same compiled chain
// every time.
func TestProgramFallback(t *testing.T) {
	x, y := make([]float32, 100), make([]float32, 100)
	ptrs := []*float32{&x[0], &y[0]}
	twice := []Instr{{Op: OpExp, Dst: 1, A: 0, B: 0}, {Op: OpNeg, Dst: 1, A: 0, B: 0}}
	if m := RunProgram(twice, ptrs, len(x)); m != 0 {
		t.Errorf("a value written twice: RunProgram computed %d elements", m)
	}
	for _, bad := range []Instr{{Op: opEnd, Dst: 1}, {Op: OpExp | 1<<12, Dst: 1}, {Op: OpExp, Dst: 2}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%+v: no panic", bad)
				}
			}()
			RunProgram([]Instr{bad}, ptrs, len(x))
		}()
	}
	one := []Instr{{Op: OpExp, Dst: 1, A: 0, B: 0}}
	if JITAvailable() && (progChain(one, 2, false) != progChain(one, 2, false) || progChain(one, 2, true) == nil) {
		t.Error("a program is compiled again, or not at all")
	}
}
