package passes

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// Collective is the layout of a collective step, computed once by Lower:
// what a communicator's call needs, for communicators of shaped calls (a
// dimension and a shape, as package collective's) and of flat buffers
// (NCCL's: all-gather puts rank i's block at offset i·count, reduce-scatter
// gives rank i the i-th block of the flat send buffer, point-to-point calls
// move contiguous blocks).
//
// On flat buffers, where the op's dimension is not the leading one (more
// precisely: where the dimensions before it are not all 1), the rank axis
// is moved by a transpose: all_gather gathers into staging buffer 0, laid
// out [ranks, operand...], and Post transposes the rank axis into place;
// reduce_scatter first transposes the blocks of its dimension to the front
// (Pre, into staging buffer 0); all_to_all does both around its blocks
// (Pre into staging buffer 0, the received blocks into staging buffer 1,
// Post from there).
type Collective struct {
	// Axis is the op's axis (the communicator's name), Size its ranks.
	Axis string
	Size int
	// Reduction is all_reduce's reduction ("sum", "max" or "min"), and
	// "sum" for reduce_scatter.
	Reduction string
	// DType, Count and Bytes are the operand's element type, elements and
	// bytes.
	DType ir.DType
	Count int
	Bytes int64
	// Shape is the operand's shape as a communicator of shaped calls sees
	// it: a stacked all_gather's operand has a 1 inserted at Dim.
	Shape []int
	// Dim is the gather, scatter or split dimension, Dim2 all_to_all's
	// concat dimension (-1 when unused).
	Dim, Dim2 int
	// Pairs are collective_permute's (source, target) ranks.
	Pairs [][2]int
	// Pre and Post are the transposes around a call on flat buffers (nil:
	// none); Stage the bytes of staging buffers 0 and 1 (0: unused).
	Pre, Post *Transpose
	Stage     [2]int64
}

// Transpose is a transpose of an array of Shape by Perm (result dimension i
// is operand dimension Perm[i]): the layout change around a collective on
// flat buffers.
type Transpose struct {
	Shape, Perm []int
}

// MoveAxis returns the perm (result dim i = operand dim perm[i]) of a
// transpose of rank dims that moves operand dimension from to result
// position to, keeping the others in order.
func MoveAxis(rank, from, to int) []int {
	rest := make([]int, 0, rank)
	for i := range rank {
		if i != from {
			rest = append(rest, i)
		}
	}
	return append(append(append([]int{}, rest[:to]...), from), rest[to:]...)
}

// CollectiveOf checks a collective op and computes its layout.
func CollectiveOf(op *ir.Op) (*Collective, error) {
	a := op.Attrs
	c := &Collective{Axis: a.String("axis"), Size: a.Int("size"), Dim: -1, Dim2: -1}
	if c.Axis == "" || c.Size < 1 {
		return nil, fmt.Errorf("%s: collective with axis %q of size %d", op.Describe(), c.Axis, c.Size)
	}
	if op.Code == ir.AxisIndex {
		return c, nil
	}
	if len(op.Args) != 1 || len(op.Results) != 1 {
		return nil, fmt.Errorf("%s: a collective takes one operand and has one result", op.Describe())
	}
	x := op.Args[0].Type
	c.DType, c.Count, c.Bytes = x.DType, x.Shape.Size(), x.Bytes()
	c.Shape = append([]int{}, x.Shape...)
	switch op.Code {
	case ir.AllReduce:
		c.Reduction = a.String("reduction")
		if c.Reduction != "sum" && c.Reduction != "max" && c.Reduction != "min" {
			return nil, fmt.Errorf("%s: unknown reduction %q", op.Describe(), c.Reduction)
		}
	case ir.AllGather:
		c.gather(a.Int("dimension"), a.Bool("tiled"))
	case ir.ReduceScatter:
		c.Reduction, c.Dim = "sum", a.Int("dimension")
		return c, c.scatter(op)
	case ir.AllToAll:
		c.Dim, c.Dim2 = a.Int("split_dimension"), a.Int("concat_dimension")
		return c, c.allToAll(op)
	case ir.CollectivePermute:
		p := a.Ints("pairs")
		for i := 0; i+1 < len(p); i += 2 {
			c.Pairs = append(c.Pairs, [2]int{p[i], p[i+1]})
		}
	default:
		return nil, fmt.Errorf("%s: no layout for this collective", op.Describe())
	}
	return c, nil
}

// gather lays out an all_gather along dimension d.
func (c *Collective) gather(d int, tiled bool) {
	shape := c.Shape
	c.Dim = d
	if ir.Shape(shape[:min(d, len(shape))]).Size() > 1 {
		// Gather [n, shape...] into staging 0, move the rank axis to d:
		// stacked, that is the result; tiled, the result's dimension d is
		// n·shape[d], rank-major, the same bytes.
		c.Stage[0] = int64(c.Size) * c.Bytes
		c.Post = &Transpose{Shape: append([]int{c.Size}, shape...), Perm: MoveAxis(len(shape)+1, 0, d)}
	}
	if !tiled {
		// Stacked: each member's operand is one slice of the new
		// dimension, gathered like a 1 there.
		c.Shape = append(shape[:d:d], append([]int{1}, shape[d:]...)...)
	}
}

// scatter lays out a reduce_scatter: the operand is divided along Dim into
// Size blocks (stacked, each block has size 1 there, which the result's
// type drops).
func (c *Collective) scatter(op *ir.Op) error {
	shape, d, n := c.Shape, c.Dim, c.Size
	if d < 0 || d >= len(shape) || shape[d]%n != 0 {
		return fmt.Errorf("%s: dimension %d of %v is not divisible by the axis size %d", op.Describe(), d, op.Args[0].Type, n)
	}
	if ir.Shape(shape[:d]).Size() > 1 {
		// View dimension d as [n, shape[d]/n] and move the n to the front.
		view := append(append(append([]int{}, shape[:d]...), n, shape[d]/n), shape[d+1:]...)
		c.Stage[0] = c.Bytes
		c.Pre = &Transpose{Shape: view, Perm: MoveAxis(len(view), d, 0)}
	}
	return nil
}

// allToAll lays out an all_to_all: split along Dim, blocks to every rank,
// concatenated along Dim2 in source rank order.
func (c *Collective) allToAll(op *ir.Op) error {
	shape, sd, cd, n := c.Shape, c.Dim, c.Dim2, c.Size
	if sd < 0 || sd >= len(shape) || cd < 0 || cd >= len(shape) || shape[sd]%n != 0 {
		return fmt.Errorf("%s: split_dimension %d or concat_dimension %d does not fit %v and axis size %d", op.Describe(), sd, cd, op.Args[0].Type, n)
	}
	blk := append([]int{}, shape...)
	blk[sd] /= n
	if ir.Shape(shape[:sd]).Size() > 1 {
		view := append(append(append([]int{}, shape[:sd]...), n, shape[sd]/n), shape[sd+1:]...)
		c.Stage[0] = c.Bytes
		c.Pre = &Transpose{Shape: view, Perm: MoveAxis(len(view), sd, 0)}
	}
	if ir.Shape(blk[:cd]).Size() > 1 {
		// Received blocks are [n, blk...]; the result is blk with dimension
		// cd multiplied by n, source-rank-major.
		c.Stage[1] = c.Bytes
		c.Post = &Transpose{Shape: append([]int{n}, blk...), Perm: MoveAxis(len(blk)+1, 0, cd)}
	}
	return nil
}
