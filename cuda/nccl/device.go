package nccl

import (
	"sync"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

// Collectives returns c as the backend.DeviceCommunicator the CUDA backend
// consumes (backend.ExecOptions.DeviceComms): the same calls, with
// collective.Op reductions mapped to NCCL's (RedOpOf), GroupStart/GroupEnd
// of c's library, AsyncError reporting a failed ncclCommGetAsyncError
// result as an *Error (Success and InProgress are no error), and an Abort
// that may be called more than once and from several goroutines.
func (c *Comm) Collectives() backend.DeviceCommunicator { return &deviceComm{c: c} }

type deviceComm struct {
	c     *Comm
	once  sync.Once
	abort error
}

func (d *deviceComm) Rank() int { return d.c.Rank() }
func (d *deviceComm) Size() int { return d.c.Size() }

func (d *deviceComm) AllReduce(send, recv uintptr, count int, dt ir.DType, op collective.Op, stream uintptr) error {
	r, err := RedOpOf(op)
	if err != nil {
		return err
	}
	return d.c.AllReduce(send, recv, count, dt, r, stream)
}

func (d *deviceComm) AllGather(send, recv uintptr, sendCount int, dt ir.DType, stream uintptr) error {
	return d.c.AllGather(send, recv, sendCount, dt, stream)
}

func (d *deviceComm) ReduceScatter(send, recv uintptr, recvCount int, dt ir.DType, op collective.Op, stream uintptr) error {
	r, err := RedOpOf(op)
	if err != nil {
		return err
	}
	return d.c.ReduceScatter(send, recv, recvCount, dt, r, stream)
}

func (d *deviceComm) Broadcast(send, recv uintptr, count int, dt ir.DType, root int, stream uintptr) error {
	return d.c.Broadcast(send, recv, count, dt, root, stream)
}

func (d *deviceComm) Send(send uintptr, count int, dt ir.DType, peer int, stream uintptr) error {
	return d.c.Send(send, count, dt, peer, stream)
}

func (d *deviceComm) Recv(recv uintptr, count int, dt ir.DType, peer int, stream uintptr) error {
	return d.c.Recv(recv, count, dt, peer, stream)
}

func (d *deviceComm) GroupStart() error { return d.c.lib.GroupStart() }
func (d *deviceComm) GroupEnd() error   { return d.c.lib.GroupEnd() }

func (d *deviceComm) AsyncError() error {
	r, err := d.c.AsyncError()
	if err != nil {
		return err
	}
	if r == Success || r == InProgress {
		return nil
	}
	return &Error{Func: "ncclCommGetAsyncError", Code: r, Msg: d.c.lib.ErrorString(r)}
}

func (d *deviceComm) Abort() error {
	d.once.Do(func() { d.abort = d.c.Abort() })
	return d.abort
}
