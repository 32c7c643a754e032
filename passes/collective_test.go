package passes

import (
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
)

// TestCompileUnboundCollective: a program holding a collective over an axis
// the executor does not bind is refused before any pass runs, naming the
// axis and the op's location (in a scan body too); one whose axes are bound
// (BoundAxes, as a ShardMap's per-device programs will be) compiles.
func TestCompileUnboundCollective(t *testing.T) {
	f := ir.NewFunc("psum")
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 4))
	body := f.NewRegion()
	c := body.AddParam(ir.TypeOf(ir.Float32, 4))
	op, err := body.AddOp(ir.AllReduce, []*ir.Value{c}, ir.Attrs{"axis": "data", "size": 2, "reduction": "sum"})
	if err != nil {
		t.Fatal(err)
	}
	op.Loc = "train.go:9"
	body.Results = op.Results
	scan, err := f.Body.AddOp(ir.Scan, []*ir.Value{x}, ir.Attrs{"num_consts": 0, "num_carry": 1, "length": 3}, body)
	if err != nil {
		t.Fatal(err)
	}
	f.Body.Results = scan.Results
	_, err = Compile(f, Options{})
	if err == nil || !strings.Contains(err.Error(), `unbound axis name "data"`) || !strings.Contains(err.Error(), "train.go:9") {
		t.Fatalf("Compile: got %v, want the unbound axis named with the op's location", err)
	}
	if _, err := Compile(f, Options{BoundAxes: []string{"data"}}); err != nil {
		t.Fatalf("Compile with the axis bound: %v", err)
	}
}
