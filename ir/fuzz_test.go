package ir

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParse checks that Parse never panics, that whatever it accepts is a
// valid function, and that printing it gives text that parses back to the
// same print. Seeds: testdata/fuzz/FuzzParse (printed corpus functions and
// regression inputs) and the corpus itself.
func FuzzParse(f *testing.F) {
	for _, fn := range txtCorpus(f) {
		f.Add(fn.String())
	}
	// One small function per literal, so that mutated elements often still parse.
	for _, op := range txtLiterals(f).Body.Ops {
		g := NewFunc("lit")
		c, err := g.Body.AddOp(Constant, nil, op.Attrs)
		require.NoError(f, err)
		g.Body.Results = c.Results
		f.Add(g.String())
	}
	for _, src := range []string{
		"func @f(%0: f32[2], %1: i32[]) -> (f32[2]) {\n  %2 = exp(%0) : f32[3]\n  return %2\n}",
		"func @f(%0: bool[], %1: f32[2]) -> (f32[2]) {\n  %3 = cond(%0, %1) (\n    ^(%4: f32[2]) {\n      return %4\n    },\n    ^(%5: f32[2]) {\n      %6 = neg(%5) : f32[2]\n      return %6\n    }) : f32[2]\n  return %3\n}",
	} {
		f.Add(src)
	}
	f.Add("func @f(%0: f32[2]) -> (f32[2]) {\n  %1 = constant() {value=dense<f16[], nan(0x7e01)>} : f16[]\n  return %0\n}")
	f.Add("func @f() -> () {\n  %0 = iota() {dim=0, dtype=u8, shape=[0]} : u8[0]\n  return\n}")
	f.Fuzz(func(t *testing.T, src string) {
		fn, err := Parse(src)
		if err != nil {
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "%T is not a *ParseError", err)
			return
		}
		require.NoError(t, Verify(fn), "Parse accepted an invalid function:\n%s", src)
		var buf bytes.Buffer
		require.NoError(t, Print(&buf, fn))
		s := buf.String()
		require.Equal(t, s, fn.String())
		again, err := Parse(s)
		require.NoError(t, err, "the print of a parsed function does not parse:\n%s", s)
		require.Equal(t, s, again.String())
	})
}
