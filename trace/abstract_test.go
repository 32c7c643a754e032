package trace_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// TestAbstractKeepsSharding: an abstract array's type is the given one,
// sharding included, and a copy of it.
func TestAbstractKeepsSharding(t *testing.T) {
	mesh, err := ir.NewMesh([]int{2}, []string{"x"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := ir.NewNamedSharding(mesh, ir.P("x"))
	if err != nil {
		t.Fatal(err)
	}
	typ := ir.TypeOf(ir.Float32, 4, 3).WithSharding(s)
	a := trace.Abstract(typ)
	if got := a.Type(); !got.Equal(typ) {
		t.Fatalf("Abstract(%v).Type() = %v", typ, got)
	}
	a.Type().Shape[0] = 9
	if a.Type().Shape[0] != 4 {
		t.Fatal("Type shares the array's shape")
	}
}
