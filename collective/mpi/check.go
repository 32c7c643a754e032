package mpi

import (
	"fmt"
	"math"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/internal/bufs"
	"github.com/ferryml/ferry/ir"
)

// The argument checks of collective.Local, so that both engines accept and
// refuse the same calls.

func checkReduce(op collective.Op, dt ir.DType) error {
	if !op.Valid() {
		return fmt.Errorf("%v is not a reduction operator", op)
	}
	if !collective.Reducible(op, dt) {
		return fmt.Errorf("cannot reduce dtype %v", dt)
	}
	return nil
}

// checkBuf is bufs.CheckBuf with few enough elements for MPI's int counts.
func checkBuf(name string, dt ir.DType, b []byte) error {
	if err := bufs.CheckBuf(name, dt, b); err != nil {
		return err
	}
	if len(b)/dt.Size() > math.MaxInt32 {
		return fmt.Errorf("%s has %d elements, more than MPI's int counts hold (%d)", name, len(b)/dt.Size(), math.MaxInt32)
	}
	return nil
}

// checkFlat checks a one-dimensional call and records its shape.
func checkFlat(d *desc, dt ir.DType, send, recv []byte) error {
	if err := checkBuf("send", dt, send); err != nil {
		return err
	}
	if err := checkBuf("recv", dt, recv); err != nil {
		return err
	}
	if len(recv) != len(send) {
		return fmt.Errorf("recv has %d bytes, want send's %d", len(recv), len(send))
	}
	d.setShape([]int{len(send) / dt.Size()})
	return nil
}

// checkShape records shape (nil: flat) as send's shape and checks it against
// send, axis against the rank, and, when divAxis >= 0, that the group size
// divides shape[divAxis]. It returns the shape.
func (c *Comm) checkShape(d *desc, dt ir.DType, shape []int, send, recv []byte, axis, divAxis int) ([]int, error) {
	if err := checkBuf("send", dt, send); err != nil {
		return nil, err
	}
	if err := checkBuf("recv", dt, recv); err != nil {
		return nil, err
	}
	var sh []int
	if shape == nil {
		sh = []int{len(send) / dt.Size()}
	} else {
		sh = append(sh, shape...)
	}
	d.setShape(sh)
	elems := 1
	for _, n := range sh {
		if n < 0 {
			return nil, fmt.Errorf("shape %v has a negative dimension", sh)
		}
		if n > 0 && elems > (1<<62)/n {
			return nil, fmt.Errorf("shape %v is too large", sh)
		}
		elems *= n
	}
	if elems*dt.Size() != len(send) {
		return nil, fmt.Errorf("send has %d bytes but shape %v%v has %d", len(send), dt, sh, elems*dt.Size())
	}
	if axis < 0 || axis >= len(sh) {
		return nil, fmt.Errorf("axis %d is out of range for shape %v", axis, sh)
	}
	if divAxis >= 0 && sh[divAxis]%c.size != 0 {
		return nil, fmt.Errorf("dimension %d of shape %v (axis %d) is not divisible by the %d ranks", sh[divAxis], sh, divAxis, c.size)
	}
	return sh, nil
}
