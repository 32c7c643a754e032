package eval

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// refKeyCmp is the test's own total order: NaN last (all NaNs equal),
// -0 == +0, otherwise numeric order.
func refKeyCmp(a, b float64) int {
	an, bn := math.IsNaN(a), math.IsNaN(b)
	switch {
	case an && bn:
		return 0
	case an:
		return 1
	case bn:
		return -1
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func sortTestValue(r *rand.Rand, x *ir.Literal, i int) {
	dt := x.Type.DType
	switch {
	case isFloat(dt):
		v := fewValues(r)
		if r.IntN(8) == 0 {
			v = math.Copysign(0, -1)
		}
		setF(x, i, refRound(v, dt))
	case dt == ir.Bool:
		setI(x, i, int64(r.IntN(2)))
	case r.IntN(3) == 0:
		setI(x, i, genInt(r, dt))
	default:
		setI(x, i, wrapTo(dt, int64(r.IntN(5)-2)))
	}
}

// testSort sorts (keys..., payload) along each dimension and checks every
// line against ranks computed by counting (no sorting in the reference):
// element k of a line goes to position #{j : key_j < key_k or (key_j ==
// key_k and j < k)}, and the payload (the element's flat index) says which
// element landed where.
func testSort(t *testing.T) {
	r := newRand(t)
	dts := acceptedDTypes(ir.Sort, func(dt ir.DType) ([]ir.Type, ir.Attrs) {
		return []ir.Type{ir.TypeOf(dt, 2)}, ir.Attrs{"dimension": 0, "num_keys": 1}
	})
	require.Len(t, dts, len(ir.AllDTypes), "sort accepts every dtype as a key")
	for _, dt := range dts {
		for _, c := range []struct {
			shape   ir.Shape
			dim, nk int
		}{{ir.Shape{17}, 0, 1}, {ir.Shape{3, 9, 2}, 1, 1}, {ir.Shape{5, 4}, 0, 2}, {ir.Shape{2, 0, 3}, 2, 1}, {ir.Shape{4, 33}, 1, 2}} {
			keys := []*ir.Literal{lit(ir.Type{DType: dt, Shape: c.shape})}
			if c.nk == 2 { // a coarse int key first, then dt
				k0 := lit(ir.Type{DType: ir.Int32, Shape: c.shape})
				for i := 0; i < k0.Type.Size(); i++ {
					setI(k0, i, int64(r.IntN(3)))
				}
				keys = []*ir.Literal{k0, keys[0]}
			}
			key := keys[len(keys)-1]
			payload := lit(ir.Type{DType: ir.Int64, Shape: c.shape})
			for i := 0; i < key.Type.Size(); i++ {
				sortTestValue(r, key, i)
				setI(payload, i, int64(i))
			}
			args := append(append([]*ir.Literal{}, keys...), payload)
			res := runOp(t, ir.Sort, args, ir.Attrs{"dimension": c.dim, "num_keys": c.nk})
			require.Len(t, res, len(args))
			for i, l := range res {
				require.True(t, l.Type.Equal(args[i].Type), "result %d is %v, want %v", i, l.Type, args[i].Type)
			}
			cmp := func(a, b int) int {
				for _, k := range keys {
					d := 0
					if isFloat(k.Type.DType) {
						d = refKeyCmp(getF(k, a), getF(k, b))
					} else if x, y := getI(k, a), getI(k, b); x != y {
						d = -1
						if x > y {
							d = 1
						}
					}
					if d != 0 {
						return d
					}
				}
				return 0
			}
			_, groups := reduceGroups(c.shape, []int{c.dim}) // groups: flat indices of each line, in order
			for _, g := range groups {
				for k, a := range g {
					rank := 0
					for j, b := range g {
						if d := cmp(b, a); d < 0 || (d == 0 && j < k) {
							rank++
						}
					}
					dst := g[rank]
					require.Equal(t, int64(a), getI(res[len(res)-1], dst), "%v %v dim %d: element %d should land at %d", dt, c.shape, c.dim, a, dst)
					for i, kl := range keys {
						if !isFloat(kl.Type.DType) {
							require.Equal(t, getI(kl, a), getI(res[i], dst), "key %d at %d", i, dst)
							continue
						}
						want, got := getF(kl, a), getF(res[i], dst)
						require.True(t, want == got || (math.IsNaN(want) && math.IsNaN(got)), "key %d at %d: got %v, want %v", i, dst, got, want)
						if isFloat(kl.Type.DType) && want == 0 {
							require.Equal(t, math.Signbit(want), math.Signbit(got), "sign of zero kept")
						}
					}
				}
			}
		}
	}
}
