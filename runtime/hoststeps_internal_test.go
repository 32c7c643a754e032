package runtime

import (
	"testing"

	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// hostStepsExe is an executable of an accelerator backend that runs some
// steps on the host.
type hostStepsExe struct {
	Executable
	steps []string
}

func (h hostStepsExe) HostSteps() []string { return h.steps }

// TestCompiledHostSteps checks that Compiled.HostSteps forwards an
// accelerator executable's list and is nil on the CPU backend.
func TestCompiledHostSteps(t *testing.T) {
	low, err := Lower(func(x *trace.Array) *trace.Array { return trace.Exp(x) }, FromSlice([]float32{1, 2}, 2))
	require.NoError(t, err)
	c, err := low.Compile()
	require.NoError(t, err)
	require.Nil(t, c.HostSteps(), "the CPU backend runs everything on its device")

	want := []string{"scan body / sort: no device kernel"}
	acc := &Compiled{entry: &entry{lowered: low, exe: hostStepsExe{Executable: c.entry.exe, steps: want}}}
	require.Equal(t, want, acc.HostSteps())
}
