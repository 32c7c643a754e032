package vmath

import (
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// TestOpsTable checks that every opcode has a complete row in ops, whose
// name is that of the package function the tests know for it (kernel1,
// kernel2) and whose arity is that function's, and that chains accept
// exactly the opcodes of the table.
func TestOpsTable(t *testing.T) {
	if ops[0].name != "" || ops[0].body != nil || validOp(0) || validOp(opEnd) || !validOp(OpAdd) || !validOp(opEnd-1) {
		t.Fatal("opcodes are not 1..opEnd-1")
	}
	for op := OpAdd; op < opEnd; op++ {
		d := &ops[op]
		if d.name == "" || d.body == nil || (d.arity == 1) != (d.go1 != nil) || (d.arity == 2) != (d.go2 != nil) || d.arity < 1 || d.arity > 2 {
			t.Errorf("opcode %d: incomplete row %+v", op, *d)
			continue
		}
		var f any = kernel1[op]
		if d.arity == 2 {
			f = kernel2[op]
		}
		if reflect.ValueOf(f).IsNil() {
			t.Errorf("opcode %d (%s): no package function of arity %d", op, d.name, d.arity)
			continue
		}
		fn := runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()
		if !strings.EqualFold(fn[strings.LastIndex(fn, ".")+1:], d.name) {
			t.Errorf("opcode %d: row %q, function %s", op, d.name, fn)
		}
		for _, im := range available() {
			if (d.arity == 1) != (im.f1[op] != nil) || (d.arity == 2) != (im.f2[op] != nil) {
				t.Errorf("opcode %d (%s): %s has no kernel of arity %d", op, d.name, im.name, d.arity)
			}
		}
	}
	for _, cd := range []int32{0, opEnd, 0xff} {
		if _, err := checkChain([]Instr{{Op: cd, Dst: 1}}, 2, nil); err == nil {
			t.Errorf("opcode %d accepted", cd)
		}
	}
	if _, err := checkChain([]Instr{{Op: opEnd - 1, Dst: 1}}, 2, nil); err != nil {
		t.Errorf("opcode %d refused: %v", opEnd-1, err)
	}
}
