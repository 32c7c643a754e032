package cuda

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Compile asks the pass pipeline to verify the IR after every pass exactly
// when $FERRY_VERIFY_IR is set, as the CPU backend does. A probe pass
// appended to passes.Pipeline records the options the backend passed
// (the test is not parallel, so no other test compiles meanwhile).
func TestCompileVerifyFromEnv(t *testing.T) {
	_, b := fakeBackend(t, false)
	var got []bool
	saved := passes.Pipeline
	passes.Pipeline = append(passes.Pipeline[:len(saved):len(saved)], passes.Pass{Name: "probe", Doc: "records Options.Verify", Run: func(st *passes.State) error {
		got = append(got, st.Options.Verify)
		return nil
	}})
	t.Cleanup(func() { passes.Pipeline = saved })
	f := traceFn(t, []ir.Type{f32t(4)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Tanh(x[0])}
	})
	for _, env := range []string{"", "1"} {
		t.Setenv(passes.EnvVerifyIR, env)
		if _, err := b.Compile(f, rt.CompileOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] || !got[1] {
		t.Fatalf("Options.Verify with %s unset, then set: %v; want [false true]", passes.EnvVerifyIR, got)
	}
}
