package optim

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// builder makes the leaves of a new optimizer state in one memory space and
// remembers the concrete ones, to delete them if building fails.
type builder struct {
	space    ir.MemorySpace
	abstract bool // the params are abstract: so is the state
	made     []*trace.Array
}

// build checks params and space, then runs fill, which makes a state with b.
// A panic inside (out of memory, a bad tree) becomes the returned error, and
// the leaves made so far are deleted, so that a failed Init holds no memory.
func build(name string, params any, space ir.MemorySpace, fill func(b *builder)) (err error) {
	if space != ir.Device && space != ir.PinnedHost {
		return fmt.Errorf("optim.%s.Init: invalid memory space %v (want device or pinned_host)", name, space)
	}
	p, err := flatten("optim."+name+".Init: params", params)
	if err != nil {
		return err
	}
	b := &builder{space: space}
	for _, x := range p.leaves {
		b.abstract = b.abstract || x.IsAbstract()
	}
	defer func() {
		if err != nil {
			for _, x := range b.made {
				_ = x.Delete()
			}
			err = fmt.Errorf("optim.%s.Init: %w", name, err)
		}
	}()
	defer trace.Recover(&err)
	fill(b)
	return nil
}

// zeros returns zeros of x's dtype and shape in b's space: made there
// directly from a host literal when concrete (never passing through device
// memory), an abstract array for abstract params, and, while tracing, zeros
// recorded into the trace and put in the space with trace.DevicePut.
func (b *builder) zeros(x *trace.Array) *trace.Array {
	t := x.Type().WithSpace(b.space)
	switch {
	case b.abstract:
		return trace.Abstract(t)
	case trace.Current() != nil:
		return trace.DevicePut(trace.Zeros(t.Shape, t.DType), b.space)
	case b.space == ir.Device:
		return b.keep(trace.Zeros(t.Shape, t.DType))
	}
	return b.literal(t)
}

// count returns the initial step count, an i32 scalar 0 in b's space. While
// tracing, it is a constant of the trace put in the space with
// trace.DevicePut.
func (b *builder) count() *trace.Array {
	t := ir.Type{DType: ir.Int32, Shape: ir.Shape{}, Space: b.space}
	switch {
	case b.abstract:
		return trace.Abstract(t)
	case trace.Current() != nil:
		return trace.DevicePut(trace.ScalarAs(0, ir.Int32), b.space)
	}
	return b.literal(t)
}

// literal makes a concrete zero array of type t, in t's memory space.
func (b *builder) literal(t ir.Type) *trace.Array {
	z, err := trace.NewFromLiteral(ir.NewLiteral(t))
	if err != nil {
		panic(trace.WrapError("optim", err))
	}
	return b.keep(z)
}

func (b *builder) keep(x *trace.Array) *trace.Array {
	b.made = append(b.made, x)
	return x
}

// zerosLike returns zeros in b's space with the structure, type, dtypes and
// shapes of params.
func zerosLike[P any](b *builder, params P) P {
	z, err := trace.MapAs(params, b.zeros)
	if err != nil {
		panic(trace.WrapError("optim", err))
	}
	return z
}

// discard deletes the concrete leaves of a state that is not returned.
func discard(state any) {
	leaves, _, _ := trace.Flatten(state)
	for _, x := range leaves {
		if !x.IsTraced() && !x.IsAbstract() {
			_ = x.Delete()
		}
	}
}
