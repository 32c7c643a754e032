package passes_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

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
		require.Equal(t, c.want, passes.MoveAxis(c.rank, c.from, c.to), "MoveAxis(%d, %d, %d)", c.rank, c.from, c.to)
	}
}

// coords and flat convert between row-major flat indexes and coordinates.
func coords(shape []int, i int) []int {
	c := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		c[d], i = i%shape[d], i/shape[d]
	}
	return c
}

func flat(shape, c []int) int {
	i := 0
	for d := range shape {
		i = i*shape[d] + c[d]
	}
	return i
}

// transpose applies t (result dim i = operand dim Perm[i]) to x.
func transpose(t *passes.Transpose, x []int) []int {
	out := make([]int, len(x))
	res := make([]int, len(t.Perm))
	for i, p := range t.Perm {
		res[i] = t.Shape[p]
	}
	for i := range out {
		rc := coords(res, i)
		oc := make([]int, len(rc))
		for k, p := range t.Perm {
			oc[p] = rc[k]
		}
		out[i] = x[flat(t.Shape, oc)]
	}
	return out
}

// layoutCase traces op (one collective over n ranks of x's type) and
// returns its plan layout.
func layoutOf(t *testing.T, code ir.Code, x ir.Type, attrs ir.Attrs) *passes.Collective {
	f := ir.NewFunc("coll")
	p := f.Body.AddParam(x)
	op, err := f.Body.AddOp(code, []*ir.Value{p}, attrs)
	require.NoError(t, err)
	c, err := passes.CollectiveOf(op)
	require.NoError(t, err)
	return c
}

func randomShape(rng *rand.Rand, n, d int) []int {
	shape := make([]int, 1+rng.IntN(3))
	for i := range shape {
		shape[i] = 1 + rng.IntN(3)
	}
	if d >= 0 {
		shape[d%len(shape)] *= n
	}
	return shape
}

// The layouts of collectives on flat buffers, run the way a communicator of
// flat buffers runs them (rank blocks at offsets, the plan's transposes
// around), give the ops' results computed from their definitions by
// coordinates: tiled all_gather (concatenation along the dimension),
// reduce_scatter (the rank's block of the sum) and all_to_all.
func TestCollectiveLayouts(t *testing.T) {
	rng := testseed.Rand(t, 41)
	for it := range 200 {
		n := 1 + rng.IntN(3)
		shape := randomShape(rng, n, rng.IntN(3))
		d := rng.IntN(len(shape))
		ranks := make([][]int, n)
		for r := range ranks {
			ranks[r] = make([]int, ir.Shape(shape).Size())
			for i := range ranks[r] {
				ranks[r][i] = rng.IntN(1000)
			}
		}
		x := ir.TypeOf(ir.Int32, shape...)
		what := fmt.Sprintf("case %d: %d ranks of %v, dimension %d", it, n, shape, d)
		checkGather(t, layoutOf(t, ir.AllGather, x, ir.Attrs{"axis": "x", "size": n, "dimension": d, "tiled": true}), ranks, shape, d, what)
		if shape[d]%n == 0 {
			checkScatter(t, layoutOf(t, ir.ReduceScatter, x, ir.Attrs{"axis": "x", "size": n, "dimension": d, "tiled": true}), ranks, shape, d, what)
			cd := rng.IntN(len(shape))
			checkAllToAll(t, layoutOf(t, ir.AllToAll, x, ir.Attrs{"axis": "x", "size": n, "split_dimension": d, "concat_dimension": cd}), ranks, shape, d, cd, what)
		}
	}
}

func checkGather(t *testing.T, c *passes.Collective, ranks [][]int, shape []int, d int, what string) {
	n := len(ranks)
	var stage []int
	for _, r := range ranks {
		stage = append(stage, r...)
	}
	got := stage
	if c.Post != nil {
		require.Equal(t, int64(n)*c.Bytes, c.Stage[0], what)
		got = transpose(c.Post, stage)
	}
	res := slices.Clone(shape)
	res[d] *= n
	for i := range got {
		rc := coords(res, i)
		r := rc[d] / shape[d]
		rc[d] %= shape[d]
		require.Equal(t, ranks[r][flat(shape, rc)], got[i], "all_gather, %s", what)
	}
}

func checkScatter(t *testing.T, c *passes.Collective, ranks [][]int, shape []int, d int, what string) {
	n := len(ranks)
	m := shape[d] / n
	res := slices.Clone(shape)
	res[d] = m
	size := ir.Shape(res).Size()
	for r := range n {
		got := make([]int, size)
		for _, x := range ranks {
			send := x
			if c.Pre != nil {
				send = transpose(c.Pre, x)
			}
			for i := range got {
				got[i] += send[r*size+i]
			}
		}
		for i := range got {
			rc := coords(res, i)
			rc[d] += r * m
			want := 0
			for _, x := range ranks {
				want += x[flat(shape, rc)]
			}
			require.Equal(t, want, got[i], "reduce_scatter, rank %d, %s", r, what)
		}
	}
}

func checkAllToAll(t *testing.T, c *passes.Collective, ranks [][]int, shape []int, sd, cd int, what string) {
	n := len(ranks)
	blk := slices.Clone(shape)
	blk[sd] /= n
	bs := ir.Shape(blk).Size()
	res := slices.Clone(blk)
	res[cd] *= n
	for r := range n {
		var recv []int
		for _, x := range ranks {
			send := x
			if c.Pre != nil {
				send = transpose(c.Pre, x)
			}
			recv = append(recv, send[r*bs:(r+1)*bs]...)
		}
		got := recv
		if c.Post != nil {
			got = transpose(c.Post, recv)
		}
		for i := range got {
			rc := coords(res, i)
			s := rc[cd] / blk[cd]
			rc[cd] %= blk[cd]
			rc[sd] += r * blk[sd]
			require.Equal(t, ranks[s][flat(shape, rc)], got[i], "all_to_all to rank %d (concat %d), %s", r, cd, what)
		}
	}
}
