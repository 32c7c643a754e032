package cuda

import "github.com/ferryml/ferry/passes"

// Stream names the streams of a device.
type Stream uint8

// Streams: kernels run on Compute; copies into device memory on H2D,
// copies out of it on D2H, collectives on Coll (collective.go), so that
// they overlap with compute.
const (
	Compute Stream = iota
	H2D
	D2H
	Coll
)

// numStreams is the number of streams of a device.
const numStreams = 4

func (s Stream) String() string { return [...]string{"compute", "h2d", "d2h", "collective"}[s] }

// streamOf returns the stream that runs the plan's queue q (the plan's
// schedule, passes.Schedule, says which queue runs each step and which
// steps of other queues it waits for: events here).
func streamOf(q passes.Queue) Stream {
	switch q {
	case passes.QueueToDevice:
		return H2D
	case passes.QueueToHost:
		return D2H
	case passes.QueueCollective:
		return Coll
	}
	return Compute
}
