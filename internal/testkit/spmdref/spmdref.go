// Package spmdref is the reference executor of partitioned programs
// (passes.Partition) for tests: the per-device program interpreted by
// internal/eval, op by op, on every device of the mesh at once (one
// goroutine each, collectives through collective.NewLocal as the runtime's,
// scan bodies iterated here), each device on its block of the global
// arguments. The partitioner's tests and the sharded differential test
// compare with it.
package spmdref

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Eval runs the partitioned program part on every device of its mesh, each
// on its block of args (the global arguments), and returns the global
// results assembled from the devices' blocks (global gives their types), or
// an error, also when devices holding the same block disagree bit for bit.
// timeout bounds the devices' waits for each other.
func Eval(part *passes.Partitioned, global []ir.Type, args []*ir.Literal, timeout time.Duration) ([]*ir.Literal, error) {
	m := part.Mesh
	devs := m.Devices()
	world, err := collective.NewLocal(len(devs))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	outs := make([][]*ir.Literal, len(devs))
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for rank, dev := range devs {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					errs[rank] = fmt.Errorf("panic: %v", p)
				}
				if errs[rank] != nil {
					world[rank].Abort(errs[rank])
				}
			}()
			comms := map[string]collective.Communicator{}
			for _, ax := range part.Axes {
				var idx []int
				for _, name := range strings.Split(ax, ",") {
					idx = append(idx, m.AxisIndex(name))
				}
				c, err := collective.MeshAxes(ctx, world[rank], m.Shape(), idx...)
				if err != nil {
					errs[rank] = err
					return
				}
				comms[ax] = c
			}
			in := make([]*ir.Literal, len(args))
			for i, l := range args {
				var err error // each device's own: the goroutines run at once
				if in[i], err = Block(l, part.Params[i], dev); err != nil {
					errs[rank] = fmt.Errorf("argument %d: %w", i, err)
					return
				}
			}
			s := &spmdDevice{ctx: ctx, comms: comms}
			outs[rank], errs[rank] = s.region(part.Func.Body, in)
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("device %d: %w", devs[rank], err)
		}
	}
	res := make([]*ir.Literal, len(global))
	for i, t := range global {
		t.Space = part.Func.Body.Results[i].Type.Space
		res[i] = ir.NewLiteral(t)
		es := t.DType.Size()
		seen := make([]bool, t.Size())
		for rank, dev := range devs {
			start, limit, err := bounds(part.Results[i], t.Shape, dev)
			if err != nil {
				return nil, err
			}
			local := outs[rank][i]
			var bad error
			ForBlock(start, limit, t.Shape, func(j, at int) {
				b := local.Data[j*es : (j+1)*es]
				if !seen[at] {
					seen[at] = true
					copy(res[i].Data[at*es:], b)
				} else if bad == nil && string(res[i].Data[at*es:(at+1)*es]) != string(b) {
					bad = fmt.Errorf("result %d element %d: device %d has %v, another device %v", i, at, dev, local.Float64At(j), res[i].Float64At(at))
				}
			})
			if bad != nil {
				return nil, bad
			}
		}
	}
	return res, nil
}

// bounds is the block of an array of the given shape that device dev
// holds under s (the whole array when s is nil).
func bounds(s *ir.NamedSharding, shape ir.Shape, dev int) (start, limit []int, err error) {
	if s == nil {
		return make([]int, len(shape)), slices.Clone([]int(shape)), nil
	}
	return s.ShardBounds(shape, dev)
}

// Block returns device dev's block of l under s (all of l when s is nil).
func Block(l *ir.Literal, s *ir.NamedSharding, dev int) (*ir.Literal, error) {
	start, limit, err := bounds(s, l.Type.Shape, dev)
	if err != nil {
		return nil, err
	}
	t := l.Type
	t.Shape = make(ir.Shape, len(start))
	for d := range start {
		t.Shape[d] = limit[d] - start[d]
	}
	out := ir.NewLiteral(t)
	es := t.DType.Size()
	ForBlock(start, limit, l.Type.Shape, func(j, at int) {
		copy(out.Data[j*es:(j+1)*es], l.Data[at*es:])
	})
	return out, nil
}

// spmdDevice interprets one device's program.
type spmdDevice struct {
	ctx   context.Context
	comms map[string]collective.Communicator
}

func (s *spmdDevice) region(r *ir.Region, args []*ir.Literal) ([]*ir.Literal, error) {
	env := map[*ir.Value]*ir.Literal{}
	for i, p := range r.Params {
		env[p] = args[i]
	}
	for _, op := range r.Ops {
		in := make([]*ir.Literal, len(op.Args))
		for i, v := range op.Args {
			in[i] = env[v]
		}
		var out []*ir.Literal
		var err error
		switch {
		case op.Code.IsCollective():
			out, err = s.collective(op, in)
		case op.Code == ir.Scan:
			out, err = s.scan(op, in)
		default:
			out, err = eval.EvalOp(op, in)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op.Describe(), err)
		}
		for i, v := range op.Results {
			env[v] = out[i]
		}
	}
	out := make([]*ir.Literal, len(r.Results))
	for i, v := range r.Results {
		out[i] = env[v]
	}
	return out, nil
}

func (s *spmdDevice) scan(op *ir.Op, in []*ir.Literal) ([]*ir.Literal, error) {
	nc, nk, n := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry"), op.Attrs.Int("length")
	body := op.Regions[0]
	carry := slices.Clone(in[nc : nc+nk])
	ys := make([]*ir.Literal, len(op.Results)-nk)
	for j := range ys {
		ys[j] = ir.NewLiteral(op.Results[nk+j].Type)
	}
	for it := range n {
		i := it
		if op.Attrs.Bool("reverse") {
			i = n - 1 - it
		}
		args := append(slices.Clone(in[:nc]), carry...)
		for k, x := range in[nc+nk:] {
			l := ir.NewLiteral(body.Params[nc+nk+k].Type)
			sz := len(l.Data)
			copy(l.Data, x.Data[i*sz:(i+1)*sz])
			args = append(args, l)
		}
		res, err := s.region(body, args)
		if err != nil {
			return nil, err
		}
		carry = res[:nk]
		for j, y := range res[nk:] {
			sz := len(y.Data)
			copy(ys[j].Data[i*sz:(i+1)*sz], y.Data)
		}
	}
	return append(carry, ys...), nil
}

var reductions = map[string]collective.Op{"sum": collective.Sum, "prod": collective.Prod, "max": collective.Max, "min": collective.Min}

func (s *spmdDevice) collective(op *ir.Op, in []*ir.Literal) ([]*ir.Literal, error) {
	c := s.comms[op.Attrs.String("axis")]
	if c == nil {
		return nil, fmt.Errorf("no communicator for axis %q", op.Attrs.String("axis"))
	}
	if c.Size() != op.Attrs.Int("size") {
		return nil, fmt.Errorf("group of %d for size %d", c.Size(), op.Attrs.Int("size"))
	}
	out := ir.NewLiteral(op.Results[0].Type)
	var err error
	switch op.Code {
	case ir.AxisIndex:
		out.SetFloat64At(0, float64(c.Rank()))
	case ir.AllReduce:
		o, ok := reductions[op.Attrs.String("reduction")]
		if !ok {
			return nil, fmt.Errorf("reduction %q", op.Attrs.String("reduction"))
		}
		err = c.AllReduce(s.ctx, o, out.Type.DType, in[0].Data, out.Data)
	case ir.AllGather:
		shape, d := []int(in[0].Type.Shape), op.Attrs.Int("dimension")
		if !op.Attrs.Bool("tiled") {
			shape = slices.Insert(slices.Clone(shape), d, 1)
		}
		err = c.AllGather(s.ctx, out.Type.DType, shape, d, in[0].Data, out.Data)
	case ir.ReduceScatter:
		shape, d := []int(in[0].Type.Shape), op.Attrs.Int("dimension")
		if !op.Attrs.Bool("tiled") {
			return nil, fmt.Errorf("the reference interpreter has no stacked reduce_scatter")
		}
		err = c.ReduceScatter(s.ctx, collective.Sum, out.Type.DType, shape, d, in[0].Data, out.Data)
	default:
		return nil, fmt.Errorf("the reference interpreter has no %v", op.Code)
	}
	return []*ir.Literal{out}, err
}

// ForBlock calls fn(j, at) for every element of the block [start, limit) of
// an array of the given shape: j its index in the block, at in the array.
func ForBlock(start, limit []int, shape ir.Shape, fn func(j, at int)) {
	n := 1
	for d := range start {
		n *= limit[d] - start[d]
	}
	strides := shape.Strides()
	for j := range n {
		rem, at := j, 0
		for d := len(start) - 1; d >= 0; d-- {
			w := limit[d] - start[d]
			at += (start[d] + rem%w) * strides[d]
			rem /= w
		}
		fn(j, at)
	}
}
