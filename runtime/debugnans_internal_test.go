package runtime

import (
	"errors"
	"github.com/ferryml/ferry/backend"
	"math"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// nanExecutable stands for a backend whose compiled code returns NaN where the
// program computes none.
type nanExecutable struct{ typ ir.Type }

func (x nanExecutable) Execute(args []trace.Buffer, _ ExecOptions) ([]trace.Buffer, error) {
	l := ir.NewLiteral(x.typ)
	for i := 0; i < x.typ.Shape.Size(); i++ {
		l.SetFloat64At(i, 1)
	}
	l.SetFloat64At(1, math.NaN())
	b, err := backend.Lookup("cpu").FromLiteral(l)
	return []trace.Buffer{b}, err
}

func (nanExecutable) Program() *passes.Program { return nil }

// TestDebugNansCompiledOnly: a NaN in a jitted result that the op-by-op re-run
// does not make is reported as the compiled code's, at the result.
func TestDebugNansCompiledOnly(t *testing.T) {
	defer SetDebugNans(SetDebugNans(true))
	x := FromSlice([]float32{1, 2, 3})
	l, err := Lower(func(x *trace.Array) *trace.Array { return trace.Mul(x, x) }, x)
	if err != nil {
		t.Fatal(err)
	}
	e := &entry{lowered: l, exe: nanExecutable{typ: x.Type()}, outDefs: l.outDefs}
	_, err = e.run([]*trace.Array{x}, "")
	var ne *NaNError
	if !errors.As(err, &ne) {
		t.Fatalf("got %v, want a *NaNError", err)
	}
	if ne.Op != "" || ne.Result != 0 || ne.Index != 1 || ne.Value != "NaN" {
		t.Fatalf("got %+v", ne)
	}
	if !strings.Contains(err.Error(), "but running it op by op did not") {
		t.Fatalf("message %q", err)
	}
	SetDebugNans(false)
	outs, err := e.run([]*trace.Array{x}, "")
	if err != nil || !math.IsNaN(float64(outs[0].(*trace.Array).Float32s()[1])) {
		t.Fatalf("checks off: %v, %v", outs, err)
	}
}
