package eval

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
)

func testCheckpointName(t *testing.T) {
	r := newRand(t)
	for _, dt := range ir.AllDTypes {
		for _, shape := range elemShapes {
			for _, sp := range ir.AllSpaces {
				v := randLit(r, dt, shape, nil)
				v.Type.Space = sp
				res := runOp(t, ir.CheckpointName, []*ir.Literal{v}, ir.Attrs{"name": "x"})[0]
				require.Equal(t, v.Type, res.Type)
				require.Equal(t, v.Data, res.Data)
			}
		}
	}
}

func testOptimizationBarrier(t *testing.T) {
	r := newRand(t)
	for _, shape := range elemShapes {
		a := randLit(r, ir.Float32, shape, nil)
		b := randLit(r, ir.Int32, shape, nil)
		b.Type.Space = ir.PinnedHost
		res := runOp(t, ir.OptimizationBarrier, []*ir.Literal{a, b}, nil)
		require.Len(t, res, 2)
		require.Equal(t, a.Type, res[0].Type)
		require.Equal(t, b.Type, res[1].Type)
		require.Equal(t, a.Data, res[0].Data)
		require.Equal(t, b.Data, res[1].Data)
	}
}
