package passes

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

// randomDot makes a dot_general of random dimension numbers: batch,
// free and contracting dimensions of random sizes (1 included), each
// operand's axes in a random order.
func randomDot(t *testing.T, r *rand.Rand) *ir.Op {
	sizes := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = 1 + r.IntN(4)
		}
		return s
	}
	batch, contract := sizes(r.IntN(3)), sizes(r.IntN(3))
	operand := func(free []int) (ir.Shape, []int, []int) {
		kinds := make([]int, 0, len(batch)+len(free)+len(contract)) // index into batch (0..), free (100..), contract (200..)
		for i := range batch {
			kinds = append(kinds, i)
		}
		for i := range free {
			kinds = append(kinds, 100+i)
		}
		for i := range contract {
			kinds = append(kinds, 200+i)
		}
		r.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		shape := make(ir.Shape, len(kinds))
		bd, cd := make([]int, len(batch)), make([]int, len(contract))
		for ax, k := range kinds {
			switch {
			case k < 100:
				shape[ax], bd[k] = batch[k], ax
			case k < 200:
				shape[ax] = free[k-100]
			default:
				shape[ax], cd[k-200] = contract[k-200], ax
			}
		}
		return shape, bd, cd
	}
	ls, lb, lc := operand(sizes(r.IntN(3)))
	rs, rb, rc := operand(sizes(r.IntN(3)))
	f := ir.NewFunc("f")
	l := f.Body.AddParam(ir.TypeOf(ir.Float32, ls...))
	rv := f.Body.AddParam(ir.TypeOf(ir.Float32, rs...))
	op, err := f.Body.AddOp(ir.DotGeneral, []*ir.Value{l, rv}, ir.Attrs{"lhs_batch": lb, "rhs_batch": rb, "lhs_contract": lc, "rhs_contract": rc})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// offsetsOf lists, row-major over batch, rows and columns (each over its
// axes in order), the element offsets in a row-major array of shape.
func offsetsOf(shape ir.Shape, batch, rows, cols []int) [][][]int {
	st := shape.Strides()
	along := func(axes []int) []int {
		out := []int{0}
		for _, ax := range axes {
			var next []int
			for _, o := range out {
				for i := range shape[ax] {
					next = append(next, o+i*st[ax])
				}
			}
			out = next
		}
		return out
	}
	bs, rs, cs := along(batch), along(rows), along(cols)
	out := make([][][]int, len(bs))
	for b, bo := range bs {
		out[b] = make([][]int, len(rs))
		for i, ro := range rs {
			for _, co := range cs {
				out[b][i] = append(out[b][i], bo+ro+co)
			}
		}
	}
	return out
}

// fits says whether every offset is b·bs + i·ld + j (or, transposed,
// b·bs + j·ld + i).
func fits(off [][][]int, trans bool, ld, bs int) bool {
	for b := range off {
		for i := range off[b] {
			for j, o := range off[b][i] {
				want := b*bs + i*ld + j
				if trans {
					want = b*bs + j*ld + i
				}
				if o != want {
					return false
				}
			}
		}
	}
	return true
}

// A plain layout addresses every element of the operand's matrices where
// its row-major array holds it; an operand the layout calls not plain fits
// no batch stride, leading dimension and orientation.
func TestMatrixLayout(t *testing.T) {
	r := testseed.Rand(t, 11)
	plain, other := 0, 0
	for range 3000 {
		op := randomDot(t, r)
		m := MatmulOf(op)
		ls, rs := op.Args[0].Type.Shape, op.Args[1].Type.Shape
		for _, c := range []struct {
			name             string
			l                MatrixLayout
			shape            ir.Shape
			batch, rows, col []int
		}{
			{"lhs", m.Lhs, ls, m.LhsBatch, FreeAxes(len(ls), m.LhsBatch, m.LhsContract), m.LhsContract},
			{"rhs", m.Rhs, rs, m.RhsBatch, m.RhsContract, FreeAxes(len(rs), m.RhsBatch, m.RhsContract)},
		} {
			off := offsetsOf(c.shape, c.batch, c.rows, c.col)
			what := fmt.Sprintf("%s of %s (%v: batch %v, rows %v, columns %v): %+v", c.name, op.Describe(), c.shape, c.batch, c.rows, c.col, c.l)
			if c.l.Plain {
				plain++
				if !fits(off, c.l.Trans, c.l.LD, c.l.BatchStride) {
					t.Fatalf("%s does not address its elements", what)
				}
				nr, nc := len(off[0]), len(off[0][0])
				if min := max(1, nc); !c.l.Trans && c.l.LD < min || c.l.Trans && c.l.LD < max(1, nr) {
					t.Fatalf("%s: leading dimension below the matrix's", what)
				}
				continue
			}
			other++
			size := c.shape.Size()
			for bs := 0; bs <= size; bs++ {
				for ld := 1; ld <= size; ld++ {
					if fits(off, false, ld, bs) || fits(off, true, ld, bs) {
						t.Fatalf("%s: not plain, but fits batch stride %d, leading dimension %d", what, bs, ld)
					}
				}
			}
		}
	}
	if plain < 1000 || other < 200 {
		t.Fatalf("%d plain and %d other operands: the generator does not cover both", plain, other)
	}
}
