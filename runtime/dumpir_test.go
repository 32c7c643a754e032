package runtime_test

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// An FERRY_DUMP_IR that cannot be written (here a directory under a regular
// file) is a warning on standard error, said once, and ops and jitted calls
// go on without dumping.
func TestUnwritableDumpDirWarnsOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	dir := filepath.Join(file, "dumps")
	t.Setenv("FERRY_DUMP_IR", dir)

	r, w, err := os.Pipe()
	require.NoError(t, err)
	stderr := os.Stderr
	os.Stderr = w
	var out []byte
	func() {
		defer func() { os.Stderr = stderr; w.Close() }()
		// Shapes no other test uses, so that each op compiles here.
		x := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6, 7}, 7)
		y := trace.Add(x, x)
		require.Equal(t, []float32{2, 4, 6, 8, 10, 12, 14}, y.Float32s())
		z := trace.Mul(x, x)
		require.Equal(t, float32(49), z.Float32s()[6])
		f := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Sub(trace.Mul(a, a), a) })
		require.Equal(t, float32(42), f(x).Float32s()[6])
	}()
	out, err = io.ReadAll(r)
	require.NoError(t, err)
	msg := string(out)
	require.Equal(t, 1, strings.Count(msg, "FERRY_DUMP_IR"), "one warning, got:\n%s", msg)
	require.Contains(t, msg, "warning: FERRY_DUMP_IR="+dir)
	require.Contains(t, msg, "compiling without dumping the IR")
}
