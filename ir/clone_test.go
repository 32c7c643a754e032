package ir

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCloneCorpus checks that a clone of every corpus function prints the same,
// verifies, shares no value, op, region, int list or literal with the original,
// and that changing the clone leaves the original as it was.
func TestCloneCorpus(t *testing.T) {
	for name, f := range txtCorpus(t) {
		t.Run(name, func(t *testing.T) {
			before := f.String()
			g := Clone(f)
			require.NoError(t, Verify(g))
			require.Equal(t, before, g.String())
			require.Equal(t, f.NextID(), g.NextID())
			txtEqualRegion(t, f.Body, g.Body)

			orig := map[any]bool{}
			var collect func(r *Region)
			collect = func(r *Region) {
				orig[r] = true
				for _, p := range r.Params {
					orig[p] = true
				}
				for _, op := range r.Ops {
					orig[op] = true
					for _, v := range op.Results {
						orig[v] = true
					}
					for _, v := range op.Attrs {
						if l, ok := v.(*Literal); ok {
							orig[l] = true
						}
					}
					for _, sub := range op.Regions {
						collect(sub)
					}
				}
			}
			collect(f.Body)
			g.Body.Walk(func(op *Op) {
				require.False(t, orig[op], "op shared")
				for _, v := range op.Results {
					require.False(t, orig[v], "value shared")
					require.Same(t, op, v.Op)
				}
				for _, a := range op.Args {
					require.False(t, orig[a], "operand shared")
				}
				for _, r := range op.Regions {
					require.False(t, orig[r], "region shared")
				}
				for k, v := range op.Attrs {
					if l, ok := v.(*Literal); ok {
						require.False(t, orig[l], "literal shared")
						if len(l.Data) > 0 {
							l.Data[0] ^= 0xff
						}
					}
					if is, ok := v.([]int); ok && len(is) > 0 {
						is[0] += 1000
					}
					op.Attrs[k] = v
				}
			})
			// Mutating the clone's attributes and structure leaves f untouched.
			g.Body.Ops = nil
			g.Body.Results = nil
			require.Equal(t, before, f.String())
		})
	}
}

func TestCloneNil(t *testing.T) {
	require.Nil(t, Clone(nil))
	g := Clone(&Func{Name: "x"})
	require.Nil(t, g.Body)
	require.Nil(t, CloneAttrs(nil))
}

// TestCloneNewValues checks that new values in the clone get fresh IDs that
// do not collide with the cloned ones.
func TestCloneNewValues(t *testing.T) {
	f := txtElementwise(t)
	g := Clone(f)
	op, err := g.Body.AddOp(Exp, vs(g.Body.Params[0]), nil)
	require.NoError(t, err)
	require.Equal(t, f.NextID(), op.Result().ID)
	g.Body.Results = append(g.Body.Results, op.Result())
	require.NoError(t, Verify(g))
	require.NoError(t, Verify(f))
}
