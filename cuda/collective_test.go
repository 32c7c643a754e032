package cuda

import (
	"strings"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
)

// TestCompileRefusesCollectives: a per-device program with collectives is
// refused with an error naming the op and its axis, whether the axis is
// bound (the CUDA backend has no collective engine) or not (no meaning);
// no driver is needed to get there.
func TestCompileRefusesCollectives(t *testing.T) {
	f, err := ir.Parse(`func @psum(%0: f32[8]) -> (f32[8]) {
  %1 = all_reduce(%0) {axis="x", reduction="sum", size=4} : f32[8] loc("step.go:7")
  return %1
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		bound []string
		want  string
	}{
		{[]string{"x"}, "does not run collectives"},
		{nil, `unbound axis name "x"`},
	} {
		_, err := (&Backend{}).Compile(f, backend.CompileOptions{BoundAxes: tc.bound})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "step.go:7") {
			t.Errorf("Compile with BoundAxes %v: got %v, want an error containing %q and the op's location", tc.bound, err, tc.want)
		}
	}
}
