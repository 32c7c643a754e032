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

// TestMoveAxis checks the transposes that move the rank axis.
func TestMoveAxis(t *testing.T) {
	for _, c := range []struct {
		rank, from, to int
		want           []int
	}{
		{3, 0, 1, []int{1, 0, 2}},
		{3, 0, 2, []int{1, 2, 0}},
		{4, 2, 0, []int{2, 0, 1, 3}},
		{2, 0, 0, []int{0, 1}},
	} {
		got := moveAxis(c.rank, c.from, c.to)
		if !equalInts(got, c.want) {
			t.Errorf("moveAxis(%d, %d, %d) = %v, want %v", c.rank, c.from, c.to, got, c.want)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
