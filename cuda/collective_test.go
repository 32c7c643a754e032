package cuda

import (
	"strings"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
)

// TestCompileRefusesUnboundCollectives: a collective whose axis is not
// among CompileOptions.BoundAxes is refused with an error naming the op, its
// axis and its location, before any driver call. (With the axis bound the
// program compiles: see TestCollectivesOnDevice.)
func TestCompileRefusesUnboundCollectives(t *testing.T) {
	f, err := ir.Parse(`func @psum(%0: f32[8]) -> (f32[8]) {
  %1 = all_reduce(%0) {axis="x", reduction="sum", size=4} : f32[8] loc("step.go:7")
  return %1
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, bound := range [][]string{nil, {"y"}} {
		_, err := (&Backend{}).Compile(f, backend.CompileOptions{BoundAxes: bound})
		if err == nil || !strings.Contains(err.Error(), `unbound axis name "x"`) || !strings.Contains(err.Error(), "step.go:7") {
			t.Errorf("Compile with BoundAxes %v: got %v, want an unbound axis error with the op's location", bound, err)
		}
	}
}
