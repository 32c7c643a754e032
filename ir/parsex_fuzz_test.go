package ir_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
)

// FuzzParseDType: ParseDType never panics, accepts exactly the short and
// long names, and what it accepts prints back to the short name.
func FuzzParseDType(f *testing.F) {
	for _, s := range []string{"f32", "float32", "bf16", "bfloat16", "i32", "int64", "u8", "bool", "", "F32", "f 32", "f32\x00", "invalid"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ir.ParseDType(s)
		if err != nil {
			require.Equal(t, ir.InvalidDType, d)
			require.Contains(t, err.Error(), "unknown dtype")
			return
		}
		require.True(t, d.Valid(), "%q", s)
		again, err := ir.ParseDType(d.String())
		require.NoError(t, err)
		require.Equal(t, d, again)
	})
}

// FuzzParseMemorySpace: ParseMemorySpace never panics and accepts exactly
// the spaces' names.
func FuzzParseMemorySpace(f *testing.F) {
	for _, s := range []string{"device", "pinned_host", "", "Device", "host", "pinned_host "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ir.ParseMemorySpace(s)
		if err != nil {
			require.Contains(t, err.Error(), "unknown memory space")
			return
		}
		require.Equal(t, s, m.String())
	})
}

// FuzzParseType: ParseType never panics; a type it accepts can exist
// (ir.CheckShape), and prints as text that parses to the same type.
func FuzzParseType(f *testing.F) {
	for _, s := range []string{"f32[2,3]", "i32[]", "bf16[0,5]", "f32[4]{pinned_host}", "u8[9223372036854775807]", "f32[4611686018427387905,4]",
		"f64[3037000500,3037000500]", "f32[-1]", "f32[", "x[1]", "bool[1,1,1,1,1,1,1,1]", "f32[2]<mesh[x=2], [x]>", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		typ, err := ir.ParseType(s)
		if err != nil {
			return
		}
		require.NoError(t, ir.CheckShape(typ.Shape, typ.DType), "ParseType(%q) accepted %v", s, typ)
		again, err := ir.ParseType(typ.String())
		require.NoError(t, err, "%q printed as %q", s, typ.String())
		require.True(t, typ.Equal(again), "%v printed and parsed as %v", typ, again)
	})
}

// FuzzParseSharding: ParseSharding never panics, and a sharding it accepts
// prints as text that parses to an equal sharding.
func FuzzParseSharding(f *testing.F) {
	for _, s := range []string{"<mesh[x=2,y=4], [x, None]>", "<mesh[data=8], [data]>", "<mesh[x=2,y=2], [(x,y)]>", "<mesh[x=0], [x]>",
		"<mesh[x=9223372036854775807,y=2], [x]>", "<mesh[x=2], [y]>", "<mesh[], []>", "<", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sh, err := ir.ParseSharding(s)
		if err != nil {
			return
		}
		require.NotNil(t, sh)
		again, err := ir.ParseSharding(sh.String())
		require.NoError(t, err, "%q printed as %q", s, sh.String())
		require.True(t, sh.Equal(again), "%v printed and parsed as %v", sh, again)
		require.False(t, strings.Contains(sh.String(), "\x00") && !strings.Contains(s, "\x00"))
	})
}
