package collective

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// Communicator is one rank's handle on a group of Size() ranks that run
// collectives together. Every rank of the group calls the same collectives in
// the same order, each with its own buffers; a call returns when the collective
// is complete for the calling rank (its receive buffer holds the result and its
// send buffer may be reused).
//
// Buffers are raw memory ([]byte) holding elements of the given dtype in the
// machine's native little-endian layout, aligned for the dtype. Arrays are
// row-major. Unless a method says otherwise, send and recv of one rank must not
// overlap, and buffers of different ranks must not overlap.
//
// Results are bit-identical on every rank and deterministic: the reduction
// order, and the precision in which f16 and bf16 are accumulated, are fixed by
// the engine (and documented by it) for a given group size. A call whose arguments differ across
// ranks (another collective, dtype, op, size, shape, root or pairs) returns an
// error wrapping [ErrMismatch] on every rank and leaves the group usable; a rank
// whose own arguments are invalid makes every rank's call return an error
// wrapping [ErrInvalid].
//
// A Communicator is used by one goroutine at a time. Different ranks (and
// different communicators) are used from different goroutines or processes.
//
// The context bounds the wait for the other ranks: when it is done before the
// collective completes, the call aborts the communicator (see Abort) so that no
// other rank waits forever, and returns an error wrapping [ErrAborted] and
// ctx.Err().
type Communicator interface {
	// Rank is this rank's index in the group, in [0, Size()).
	Rank() int
	// Size is the number of ranks in the group.
	Size() int

	// AllReduce reduces send elementwise over all ranks with op and writes the
	// result to every rank's recv. send and recv have the same length and may be
	// the same slice (in place; partial overlap is an error).
	AllReduce(ctx context.Context, op Op, dt ir.DType, send, recv []byte) error

	// AllGather concatenates every rank's send, an array of the given shape,
	// along axis, in rank order: recv has shape with shape[axis] multiplied by
	// Size(). A nil shape means a flat buffer (shape [len(send)/dt.Size()], axis
	// 0): recv then holds the ranks' buffers one after the other.
	AllGather(ctx context.Context, dt ir.DType, shape []int, axis int, send, recv []byte) error

	// ReduceScatter reduces send, an array of the given shape, elementwise over
	// all ranks with op and gives rank r the r-th of Size() equal blocks along
	// axis: recv has shape with shape[axis] divided by Size(), which must divide
	// it. A nil shape means a flat buffer whose length Size() divides.
	ReduceScatter(ctx context.Context, op Op, dt ir.DType, shape []int, axis int, send, recv []byte) error

	// AllToAll splits send, an array of the given shape, into Size() equal
	// blocks along splitAxis, sends block j to rank j, and concatenates the
	// blocks received from ranks 0, 1, ... along concatAxis into recv (XLA's
	// AllToAll): recv has shape with shape[splitAxis] divided by Size() and
	// then shape[concatAxis] multiplied by it; it has send's length. A nil
	// shape means a flat buffer with both axes 0.
	AllToAll(ctx context.Context, dt ir.DType, shape []int, splitAxis, concatAxis int, send, recv []byte) error

	// CollectivePermute copies each pair's Source rank's send into its Target
	// rank's recv (XLA's CollectivePermute); a rank that is no pair's target
	// gets zeros. Sources are distinct and targets are distinct; every rank
	// passes the same pairs. send and recv have the same length.
	CollectivePermute(ctx context.Context, dt ir.DType, pairs []Pair, send, recv []byte) error

	// Broadcast copies root's buf into every other rank's buf.
	Broadcast(ctx context.Context, dt ir.DType, root int, buf []byte) error

	// Barrier returns when every rank of the group has called it.
	Barrier(ctx context.Context) error

	// Split partitions the group like MPI_Comm_split: it is called by every
	// rank, and ranks passing the same color form a new communicator, ranked by
	// key (ties by rank in this group). A rank passing color Undefined gets a
	// nil Communicator. The new communicator shares this one's abort state.
	Split(ctx context.Context, color, key int) (Communicator, error)

	// Abort marks the communicator failed: every rank's pending and later
	// calls return an error wrapping ErrAborted and err. It can be called from
	// any goroutine, at any time, more than once (the first err wins).
	Abort(err error)

	// Close releases this rank's resources; later calls on it return an error
	// wrapping ErrClosed.
	Close() error
}

// Op is a reduction operator.
type Op uint8

// Reduction operators. On bool, Sum and Max are logical or, Prod and Min
// logical and. Integer Sum and Prod wrap around (two's complement). Float Max and
// Min propagate NaN.
const (
	Sum Op = iota + 1
	Prod
	Max
	Min
)

var opNames = [...]string{"invalid", "sum", "prod", "max", "min"}

// String returns sum, prod, max or min.
func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Valid reports whether o is one of the reduction operators.
func (o Op) Valid() bool { return o >= Sum && o <= Min }

// Pair is one transfer of a CollectivePermute: Source's send goes to Target's recv.
type Pair struct{ Source, Target int }

// Undefined is the Split color of a rank that joins no new communicator.
const Undefined = -1

// Errors wrapped by the errors of collectives; test with errors.Is.
var (
	// ErrMismatch: the ranks called different collectives or passed
	// different arguments.
	ErrMismatch = errors.New("collective: mismatched calls across ranks")
	// ErrInvalid: a rank passed invalid arguments (bad dtype, op, shape,
	// axis, buffer length or alignment).
	ErrInvalid = errors.New("collective: invalid arguments")
	// ErrAborted: the communicator was aborted (by Abort or by a rank whose
	// context was done while waiting).
	ErrAborted = errors.New("collective: communicator aborted")
	// ErrClosed: the rank's communicator was closed.
	ErrClosed = errors.New("collective: communicator closed")
)

// SplitGroups splits c into the given groups of ranks, like XLA's
// replica_groups: every rank passes the same groups, each a list of distinct
// ranks of c, no rank in two groups; the rank's new communicator holds its
// group's ranks, ranked in the listed order. A rank in no group gets nil.
func SplitGroups(ctx context.Context, c Communicator, groups [][]int) (Communicator, error) {
	n := c.Size()
	seen := make([]bool, n)
	color, key, size := Undefined, 0, 0
	var bad error
	for g, grp := range groups {
		for i, r := range grp {
			switch {
			case r < 0 || r >= n:
				bad = fmt.Errorf("%w: SplitGroups: group %d lists rank %d, want one in [0, %d)", ErrInvalid, g, r, n)
			case seen[r]:
				bad = fmt.Errorf("%w: SplitGroups: rank %d is listed twice (group %d)", ErrInvalid, r, g)
			default:
				seen[r] = true
				if r == c.Rank() {
					color, key, size = g, i, len(grp)
				}
			}
		}
	}
	if bad != nil {
		// Still take part in the split so that no other rank waits forever.
		sub, err := c.Split(ctx, Undefined, 0)
		if sub != nil {
			sub.Close()
		}
		if err != nil {
			return nil, errors.Join(bad, err)
		}
		return nil, bad
	}
	sub, err := c.Split(ctx, color, key)
	if err != nil {
		return nil, err
	}
	if sub != nil && sub.Size() != size {
		return nil, fmt.Errorf("%w: SplitGroups: rank %d's group has %d ranks but %d ranks joined it (the ranks passed different groups)", ErrMismatch, c.Rank(), size, sub.Size())
	}
	return sub, nil
}

// MeshAxes returns the communicator over one sub-mesh of c: the ranks of c are
// laid out row-major over a mesh of the given shape (the product of mesh is
// c.Size()), and the ranks that differ from this one only along the listed axes
// (sharing every other coordinate) form the new communicator, ranked row-major
// over the axes in the listed order. MeshAxes(ctx, c, []int{2, 4}, 1) gives the
// 4-rank rows of a 2×4 mesh; MeshAxes(ctx, c, []int{2, 4}, 0) its 2-rank
// columns. Every rank of c calls it with the same arguments.
func MeshAxes(ctx context.Context, c Communicator, mesh []int, axes ...int) (Communicator, error) {
	total := 1
	for _, d := range mesh {
		if d <= 0 {
			total = -1
			break
		}
		total *= d
	}
	var bad error
	in := make([]bool, len(mesh))
	switch {
	case total != c.Size():
		bad = fmt.Errorf("%w: MeshAxes: mesh %v does not hold the communicator's %d ranks", ErrInvalid, mesh, c.Size())
	default:
		for _, a := range axes {
			if a < 0 || a >= len(mesh) || in[a] {
				bad = fmt.Errorf("%w: MeshAxes: axes %v of mesh %v: axis %d is out of range or repeated", ErrInvalid, axes, mesh, a)
				break
			}
			in[a] = true
		}
	}
	if bad != nil {
		sub, err := c.Split(ctx, Undefined, 0)
		if sub != nil {
			sub.Close()
		}
		return nil, errors.Join(bad, err)
	}
	// Coordinates of this rank, row-major.
	coord := make([]int, len(mesh))
	for i, r := len(mesh)-1, c.Rank(); i >= 0; i-- {
		coord[i] = r % mesh[i]
		r /= mesh[i]
	}
	color, key := 0, 0
	for i, d := range mesh {
		if !in[i] {
			color = color*d + coord[i]
		}
	}
	for _, a := range axes {
		key = key*mesh[a] + coord[a]
	}
	return c.Split(ctx, color, key)
}
