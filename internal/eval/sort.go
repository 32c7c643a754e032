package eval

import (
	"fmt"
	"slices"

	"github.com/ferryml/ferry/ir"
)

// sortKey compares elements of one key operand by flat index.
type sortKey struct {
	f []float64 // float keys: total order, -0 == +0, NaN last
	i []int64   // integer and bool keys
}

func (k *sortKey) cmp(a, b int) int {
	if k.f != nil {
		x, y := k.f[a], k.f[b]
		xn, yn := x != x, y != y
		switch {
		case xn || yn:
			if xn && yn {
				return 0
			}
			if xn {
				return 1
			}
			return -1
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0 // equal, including -0 and +0
	}
	x, y := k.i[a], k.i[b]
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

func sortKeyOf(l *ir.Literal) (*sortKey, error) {
	n := l.Type.Shape.Size()
	switch dt := l.Type.DType; dt {
	case ir.Float16, ir.BFloat16, ir.Float32, ir.Float64:
		f := make([]float64, n)
		for j := range f {
			f[j] = l.Float64At(j)
		}
		return &sortKey{f: f}, nil
	case ir.Bool, ir.Uint8:
		v := make([]int64, n)
		for j, b := range l.Data[:n] {
			v[j] = int64(b)
		}
		return &sortKey{i: v}, nil
	case ir.Int32:
		v := make([]int64, n)
		for j, x := range viewAs[int32](l.Data) {
			v[j] = int64(x)
		}
		return &sortKey{i: v}, nil
	case ir.Uint32:
		v := make([]int64, n)
		for j, x := range viewAs[uint32](l.Data) {
			v[j] = int64(x)
		}
		return &sortKey{i: v}, nil
	case ir.Int64:
		return &sortKey{i: slices.Clone(viewAs[int64](l.Data))}, nil
	default:
		return nil, fmt.Errorf("sort: no order for %v keys", dt)
	}
}

// sortOp sorts every operand along dim by the first numKeys operands
// (lexicographically), stably. The results may alias the operands: the
// permutation is computed from copies of the keys and every operand is read
// into a scratch row before its result row is written.
func sortOp(x []*ir.Literal, dim, numKeys int, outs []*ir.Literal) error {
	shape := x[0].Type.Shape
	n := shape[dim]
	outer, inner := 1, 1
	for _, d := range shape[:dim] {
		outer *= d
	}
	for _, d := range shape[dim+1:] {
		inner *= d
	}
	if outer*n*inner == 0 {
		return nil
	}
	keys := make([]*sortKey, numKeys)
	for i := range keys {
		k, err := sortKeyOf(x[i])
		if err != nil {
			return err
		}
		keys[i] = k
	}
	srcs := make([][]byte, len(x))
	for i, l := range x {
		srcs[i] = l.Data
	}
	// Operands that share memory with any result are read from a copy.
	for i := range x {
		for _, o := range outs {
			if Overlaps(srcs[i], o.Data) {
				srcs[i] = slices.Clone(srcs[i])
				break
			}
		}
	}
	perm := make([]int, n)
	for o := range outer {
		for in := range inner {
			base := o*n*inner + in
			for k := range perm {
				perm[k] = base + k*inner
			}
			slices.SortStableFunc(perm, func(a, b int) int {
				for _, k := range keys {
					if c := k.cmp(a, b); c != 0 {
						return c
					}
				}
				return 0
			})
			for i, src := range srcs {
				es := x[i].Type.DType.Size()
				dst := outs[i].Data
				for k, p := range perm {
					d := (base + k*inner) * es
					copy(dst[d:d+es], src[p*es:p*es+es])
				}
			}
		}
	}
	return nil
}
