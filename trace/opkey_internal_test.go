package trace

import (
	"bytes"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/ferryml/ferry/ir"
)

// opKeyCase is an op's identity as the eager cache must tell it apart.
type opKeyCase struct {
	code  ir.Code
	types []ir.Type
	attrs ir.Attrs
}

// same is the reference: equal code, attributes (as printed) and types.
func (a opKeyCase) same(b opKeyCase) bool {
	if a.code != b.code || len(a.types) != len(b.types) || fmt.Sprint(a.attrs) != fmt.Sprint(b.attrs) {
		return false
	}
	for i := range a.types {
		if !a.types[i].Equal(b.types[i]) {
			return false
		}
	}
	return true
}

// Eager cache keys are equal exactly when the ops are the same: random
// codes, operand counts, dtypes, spaces, ranks (0 to 3), dimensions (with
// large ones, whose varints take several bytes) and attributes.
func TestOpKeyDistinguishesOps(t *testing.T) {
	r := testseed.Rand(t, 3)
	codes := []ir.Code{ir.Add, ir.Mul, ir.Sub}
	dims := []int{0, 1, 2, 3, 127, 128, 300, 1 << 20}
	gen := func() opKeyCase {
		c := opKeyCase{code: codes[r.IntN(len(codes))]}
		for range r.IntN(3) {
			shape := make(ir.Shape, r.IntN(4))
			for i := range shape {
				shape[i] = dims[r.IntN(len(dims))]
			}
			c.types = append(c.types, ir.Type{DType: ir.AllDTypes[r.IntN(len(ir.AllDTypes))], Shape: shape, Space: ir.AllSpaces[r.IntN(len(ir.AllSpaces))]})
		}
		if r.IntN(3) == 0 {
			c.attrs = ir.Attrs{"axis": int64(r.IntN(3))}
		}
		return c
	}
	cases := make([]opKeyCase, 400)
	keys := make([]string, len(cases))
	for i := range cases {
		cases[i] = gen()
		keys[i] = string(appendOpKey(nil, cases[i].code, cases[i].attrs, cases[i].types))
	}
	nsame := 0
	for i := range cases {
		for j := range cases {
			want := cases[i].same(cases[j])
			if got := keys[i] == keys[j]; got != want {
				t.Fatalf("ops %+v and %+v: keys equal = %v, want %v", cases[i], cases[j], got, want)
			}
			if want && i != j {
				nsame++
			}
		}
	}
	t.Logf("%d equal pairs of different cases", nsame)
}

// TestOpKeySharding: the eager cache key tells sharded operands from
// unsharded ones and one sharding from another, so that a program built for
// one never serves the other (the cache poisoning behind TestVmapOps/while
// with seed 1795653044895154624).
func TestOpKeySharding(t *testing.T) {
	m, err := ir.NewMesh([]int{2}, []string{"x"}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := ir.NewNamedSharding(m, ir.P("x"))
	if err != nil {
		t.Fatal(err)
	}
	cols, err := ir.NewNamedSharding(m, ir.P("", "x"))
	if err != nil {
		t.Fatal(err)
	}
	plain := ir.TypeOf(ir.Float32, 4, 6)
	key := func(ty ir.Type) []byte { return appendOpKey(nil, ir.Neg, nil, []ir.Type{ty}) }
	keys := [][]byte{key(plain), key(plain.WithSharding(rows)), key(plain.WithSharding(cols))}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if bytes.Equal(keys[i], keys[j]) {
				t.Errorf("keys %d and %d are equal: %q", i, j, keys[i])
			}
		}
	}
	if !bytes.Equal(key(plain.WithSharding(rows)), keys[1]) {
		t.Error("the same sharded type gives two keys")
	}
}
