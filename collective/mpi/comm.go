package mpi

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/internal/bufs"
	table "github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// Comm is one process's rank of an MPI communicator; it implements
// [collective.Communicator]. Get one from World, and others from its Split
// (or collective.SplitGroups, collective.MeshAxes).
type Comm struct {
	l       *lib
	w       *world
	comm    uintptr // MPI_Comm
	rank    int
	size    int
	timeout time.Duration
	ordered bool
	busy    atomic.Bool
	closed  bool
	reqs    []uintptr     // the current call's requests (in the heap, as MPI writes them)
	missing func() string // during the descriptor exchange: the ranks not heard from
	mine    desc          // this rank's descriptor of the current call
	all     []desc        // every rank's, gathered
}

var _ collective.Communicator = (*Comm)(nil)

func newComm(l *lib, w *world, comm uintptr, rank, size int, timeout time.Duration, ordered bool) *Comm {
	return &Comm{l: l, w: w, comm: comm, rank: rank, size: size, timeout: timeout, ordered: ordered,
		reqs: make([]uintptr, 2*max(size, 2))}
}

// Rank is this process's rank in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of processes in the communicator.
func (c *Comm) Size() int { return c.size }

// WorldRank is this process's rank in MPI_COMM_WORLD.
func (c *Comm) WorldRank() int { return c.w.rank }

// Timeout is the bound on each collective's wait (0: none); see TimeoutEnv.
func (c *Comm) Timeout() time.Duration { return c.timeout }

// Abort marks this communicator, the communicators of its World and those
// split from them failed in this process, and sends err to every other
// process of the World, whose pending and later calls on the communicators
// of that World then fail too (each process polls for the message while it
// waits in a collective). Every later call returns an error wrapping
// collective.ErrAborted and err. The first err wins.
func (c *Comm) Abort(err error) { c.w.abort(err, true) }

// Close frees the MPI communicator (MPI_Comm_free); later calls return an
// error wrapping collective.ErrClosed. The abort channel of its World lives
// until Finalize.
func (c *Comm) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	return c.l.check("MPI_Comm_free", c.l.call(c.l.commFree, uintptr(unsafe.Pointer(&c.comm))))
}

type kind int64

const (
	kAllReduce kind = iota + 1
	kAllGather
	kReduceScatter
	kAllToAll
	kPermute
	kBroadcast
	kBarrier
	kSplit
)

var kindNames = [...]string{"", "AllReduce", "AllGather", "ReduceScatter", "AllToAll", "CollectivePermute", "Broadcast", "Barrier", "Split"}

func (k kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("collective(%d)", int64(k))
}

// maxDims is the number of dimensions a descriptor spells out (the hash
// covers the rest).
const maxDims = 8

// descErr is the room for a rank's argument error in its descriptor.
const descErr = 192

// desc is one rank's description of its call, gathered from every rank
// before the collective runs so that mismatched or invalid calls are errors
// on every rank instead of hangs or corruption. Plain words: the processes
// run the same binary.
type desc struct {
	kind, op, dt, nbytes int64
	axis, axis2, root    int64
	color, key           int64
	ndim                 int64
	shapeHash, pairsHash uint64
	shape                [maxDims]int64
	errLen               int64
	err                  [descErr]byte
}

const descSize = int(unsafe.Sizeof(desc{}))

func (d *desc) setErr(err error) {
	msg := err.Error()
	if len(msg) > descErr {
		msg = msg[:descErr]
	}
	d.errLen = int64(copy(d.err[:], msg))
}

func (d *desc) setShape(shape []int) {
	d.ndim = int64(len(shape))
	h := fnv.New64a()
	for i, v := range shape {
		if i < maxDims {
			d.shape[i] = int64(v)
		}
		var b [8]byte
		*(*int64)(unsafe.Pointer(&b)) = int64(v)
		h.Write(b[:])
	}
	d.shapeHash = h.Sum64()
}

func (d *desc) shapeString() string {
	n := min(int(d.ndim), maxDims)
	s := fmt.Sprint(d.shape[:n])
	if int(d.ndim) > maxDims {
		s = s[:len(s)-1] + " ...]"
	}
	return s
}

func (d *desc) describe() string {
	dt, op, sh := ir.DType(d.dt), collective.Op(d.op), d.shapeString()
	switch kind(d.kind) {
	case kAllReduce:
		return fmt.Sprintf("AllReduce(%v, %v%s)", op, dt, sh)
	case kAllGather:
		return fmt.Sprintf("AllGather(%v%s, axis %d)", dt, sh, d.axis)
	case kReduceScatter:
		return fmt.Sprintf("ReduceScatter(%v, %v%s, axis %d)", op, dt, sh, d.axis)
	case kAllToAll:
		return fmt.Sprintf("AllToAll(%v%s, split axis %d, concat axis %d)", dt, sh, d.axis, d.axis2)
	case kPermute:
		return fmt.Sprintf("CollectivePermute(%v%s, pairs hash %x)", dt, sh, d.pairsHash)
	case kBroadcast:
		return fmt.Sprintf("Broadcast(%v%s, root %d)", dt, sh, d.root)
	}
	return kind(d.kind).String()
}

func (d *desc) matches(e *desc) bool {
	return d.kind == e.kind && d.op == e.op && d.dt == e.dt && d.nbytes == e.nbytes &&
		d.axis == e.axis && d.axis2 == e.axis2 && d.root == e.root && d.ndim == e.ndim &&
		d.shapeHash == e.shapeHash && d.pairsHash == e.pairsHash
}

// call runs one collective: check the arguments (fill), gather every rank's
// descriptor, return the same error on every rank if one rank's arguments
// are invalid or the calls differ, else run the transfer.
func (c *Comm) call(ctx context.Context, k kind, fill func(d *desc) error, run func(d *desc) error) error {
	if !c.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("mpi: %v on rank %d: the communicator is already in a call on another goroutine", k, c.rank)
	}
	defer c.busy.Store(false)
	if c.closed {
		return fmt.Errorf("%w: %v on rank %d", collective.ErrClosed, k, c.rank)
	}
	c.w.poll() // an abort message from another process
	if err := c.w.failed(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return c.giveUp(k, err)
	}
	c.mine = desc{kind: int64(k)}
	if err := fill(&c.mine); err != nil {
		c.mine.setErr(err)
	}
	if c.all == nil {
		c.all = make([]desc, c.size)
	}
	if err := c.exchange(ctx, k); err != nil {
		c.all = nil // MPI may still write the old one
		return err
	}
	for r := range c.all {
		if d := &c.all[r]; d.errLen > 0 {
			return fmt.Errorf("%w: %v on rank %d of %d: %s", collective.ErrInvalid, k, r, c.size, d.err[:d.errLen])
		}
	}
	for r := 1; r < c.size; r++ {
		if !c.all[0].matches(&c.all[r]) {
			return fmt.Errorf("%w: rank 0 called %s, rank %d called %s", collective.ErrMismatch, c.all[0].describe(), r, c.all[r].describe())
		}
	}
	if run == nil || c.mine.nbytes == 0 && k != kSplit {
		return nil
	}
	return run(&c.mine)
}

// p2pDescMax is the largest group whose descriptors are exchanged by
// point-to-point messages; larger groups use MPI_Iallgather. (A variable for
// the tests.)
var p2pDescMax = 64

// descTag tags the descriptors' point-to-point messages.
const descTag = 5

// exchange gathers every rank's descriptor into c.all. Up to p2pDescMax
// ranks it posts a receive from and a send to every other rank, so that a
// rank that times out can name the ranks whose descriptors never came (those
// that have not joined the collective, or are dead); larger groups use one
// MPI_Iallgather.
func (c *Comm) exchange(ctx context.Context, k kind) error {
	mine := unsafe.Slice((*byte)(unsafe.Pointer(&c.mine)), descSize)
	all := unsafe.Slice((*byte)(unsafe.Pointer(&c.all[0])), descSize*c.size)
	if c.size > p2pDescMax {
		c.missing = func() string {
			return fmt.Sprintf("a rank did not join it (groups of over %d ranks do not tell which)", p2pDescMax)
		}
		defer func() { c.missing = nil }()
		if err := c.start(k, "MPI_Iallgather", 0, c.l.iallgather, addr(mine), uintptr(descSize), c.l.byteType,
			addr(all), uintptr(descSize), c.l.byteType, c.comm); err != nil {
			return err
		}
		return c.wait(ctx, k, c.reqs[:1], mine, all)
	}
	c.all[c.rank] = c.mine
	if c.size == 1 {
		return nil
	}
	m := 0
	from := make([]int, 0, c.size-1) // the rank of each receive request
	for r := range c.size {
		if r == c.rank {
			continue
		}
		if err := c.start(k, "MPI_Irecv", m, c.l.irecv, addr(all[r*descSize:]), uintptr(descSize), c.l.byteType, uintptr(r), descTag, c.comm); err != nil {
			return err
		}
		from = append(from, r)
		m++
	}
	for r := range c.size {
		if r == c.rank {
			continue
		}
		if err := c.start(k, "MPI_Isend", m, c.l.isend, addr(mine), uintptr(descSize), c.l.byteType, uintptr(r), descTag, c.comm); err != nil {
			return err
		}
		m++
	}
	c.missing = func() string {
		// Receive i and send len(from)+i are rank from[i]'s: a rank whose
		// descriptor never came did not join; one whose descriptor came but
		// that never took this rank's joined and then stopped (dead).
		done := func(i int) bool {
			var flag int32
			return c.l.call(c.l.test, uintptr(unsafe.Pointer(&c.reqs[i])), uintptr(unsafe.Pointer(&flag)), 0) == mpiSuccess && flag != 0
		}
		var absent, stopped []int
		for i, r := range from {
			if !done(i) {
				absent = append(absent, r)
			} else if !done(len(from) + i) {
				stopped = append(stopped, r)
			}
		}
		var why []string
		if len(absent) > 0 || len(stopped) == 0 {
			why = append(why, fmt.Sprintf("rank(s) %v of %d did not join it (still busy elsewhere, or dead)", absent, c.size))
		}
		if len(stopped) > 0 {
			why = append(why, fmt.Sprintf("rank(s) %v of %d sent their part but never took this rank's (dead?)", stopped, c.size))
		}
		return strings.Join(why, "; ")
	}
	defer func() { c.missing = nil }()
	return c.wait(ctx, k, c.reqs[:m], mine, all)
}

// start calls a non-blocking MPI function that returns a request in
// c.reqs[i]; an MPI error fails the world.
func (c *Comm) start(k kind, name string, i int, fn uintptr, args ...uintptr) error {
	args = append(args, uintptr(unsafe.Pointer(&c.reqs[i])))
	if err := c.l.check(name, c.l.call(fn, args...)); err != nil {
		return c.giveUp(k, err)
	}
	return nil
}

// wait polls reqs with MPI_Testall until they complete, the world fails, the
// context is done or the timeout passes: then the world is aborted and the
// buffers stay pinned for good (MPI may still write them). Between polls the
// goroutine yields, then sleeps with a backoff up to a millisecond.
func (c *Comm) wait(ctx context.Context, k kind, reqs []uintptr, bufs ...[]byte) error {
	var pin runtime.Pinner
	for _, b := range bufs {
		if len(b) > 0 {
			pin.Pin(unsafe.SliceData(b))
		}
	}
	pin.Pin(&reqs[0])
	start := time.Now()
	sleep := 10 * time.Microsecond
	for {
		var flag int32
		code := c.l.call(c.l.testall, uintptr(len(reqs)), uintptr(unsafe.Pointer(&reqs[0])), uintptr(unsafe.Pointer(&flag)), 0)
		if code == mpiSuccess && flag != 0 {
			pin.Unpin()
			return nil
		}
		var err error
		switch {
		case code != mpiSuccess:
			err = c.l.check("MPI_Testall", code)
		case ctx.Err() != nil:
			err = ctx.Err()
		case c.timeout > 0 && time.Since(start) > c.timeout:
			why := "every rank joined it, but the transfer did not finish"
			if c.missing != nil {
				why = c.missing()
			}
			err = fmt.Errorf("%w: %v on rank %d of %d (process %d of %d) did not complete within %v (%s): %s",
				ErrTimeout, k, c.rank, c.size, c.w.rank, c.w.size, c.timeout, TimeoutEnv, why)
		}
		if err == nil {
			c.w.poll()
			if e := c.w.failed(); e != nil {
				keep(&pin)
				return e
			}
		}
		if err != nil {
			keep(&pin)
			return c.giveUp(k, err)
		}
		if time.Since(start) < spinFor {
			runtime.Gosched()
		} else {
			time.Sleep(sleep)
			sleep = min(2*sleep, maxSleep)
		}
	}
}

// giveUp aborts the world because this rank stops waiting (or MPI failed).
func (c *Comm) giveUp(k kind, err error) error {
	c.w.abort(fmt.Errorf("rank %d of %d gave up in %v: %w", c.rank, c.size, k, err), true)
	return c.w.failed()
}

// moveType is the MPI type used to move dt's elements (an unsigned integer of
// its size).
func (c *Comm) moveType(dt ir.DType) uintptr { return c.l.moveTypes[dt.Size()] }

// native returns MPI's type and op for reducing dt with op, if MPI reduces it
// like Local: not f16, bf16 or bool (MPI lacks them), not float Max and Min
// (MPI's do not propagate NaN), and not in ordered mode.
func (c *Comm) native(op collective.Op, dt ir.DType) (typ, mop uintptr, ok bool) {
	typ = c.l.types[dt]
	if c.ordered || typ == 0 || dt.IsFloat() && (op == collective.Max || op == collective.Min) {
		return 0, 0, false
	}
	return typ, c.l.ops[op], true
}

// count is n bytes of dt as an MPI count.
func count(n int, dt ir.DType) uintptr { return uintptr(n / dt.Size()) }

// AllReduce implements [collective.Communicator.AllReduce]. Sums and products
// of f32, f64 and the integers use MPI_Iallreduce, whose reduction order is
// Open MPI's (the same on every rank; not Local's rank order unless
// FERRY_MPI_REDUCE=ordered); f16, bf16, bool and float Max and Min are
// reduced in rank order exactly as Local does (see orderedAllReduce).
func (c *Comm) AllReduce(ctx context.Context, op collective.Op, dt ir.DType, send, recv []byte) error {
	return c.call(ctx, kAllReduce, func(d *desc) error {
		d.op, d.dt, d.nbytes = int64(op), int64(dt), int64(len(send))
		if err := checkReduce(op, dt); err != nil {
			return err
		}
		if err := checkFlat(d, dt, send, recv); err != nil {
			return err
		}
		if bufs.Overlap(send, recv) && !bufs.Same(send, recv) {
			return errors.New("send and recv overlap without being the same slice")
		}
		return nil
	}, func(*desc) error {
		n := count(len(send), dt)
		if typ, mop, ok := c.native(op, dt); ok {
			sp := addr(send)
			if bufs.Same(send, recv) {
				sp = mpiInPlace
			}
			if err := c.start(kAllReduce, "MPI_Iallreduce", 0, c.l.iallreduce, sp, addr(recv), n, typ, mop, c.comm); err != nil {
				return err
			}
			return c.wait(ctx, kAllReduce, c.reqs[:1], send, recv)
		}
		return c.orderedAllReduce(ctx, op, dt, send, recv)
	})
}

// orderedAllReduce reduces in rank order with collective.Reduce, as a
// reduce-scatter and an all-gather: the elements are cut into Size() nearly
// equal blocks, MPI_Ialltoallv brings every rank's copy of block r to rank
// r, which reduces it (in rank order) into its block of recv, and
// MPI_Iallgatherv (in place) copies the reduced blocks to every rank. Each
// rank reduces 1/Size() of the elements and holds one extra copy of its
// block.
func (c *Comm) orderedAllReduce(ctx context.Context, op collective.Op, dt ir.DType, send, recv []byte) error {
	n, esz, mt := c.size, dt.Size(), c.moveType(dt)
	elems := len(send) / esz
	// counts[j], displs[j]: block j's length and start, in elements (C ints).
	arrays := alloc(4 * 4 * n)
	ints := unsafe.Slice((*int32)(unsafe.Pointer(&arrays[0])), 4*n)
	counts, displs, mine, mineAt := ints[:n], ints[n:2*n], ints[2*n:3*n], ints[3*n:]
	for j := range n {
		lo, hi := j*elems/n, (j+1)*elems/n
		counts[j], displs[j] = int32(hi-lo), int32(lo)
	}
	m := int(counts[c.rank]) // this rank's block
	for j := range n {
		mine[j], mineAt[j] = int32(m), int32(j*m)
	}
	parts := alloc(n * m * esz)
	if err := c.start(kAllReduce, "MPI_Ialltoallv", 0, c.l.ialltoallv, addr(send), addr(arrays[4*0*n:]), addr(arrays[4*n:]), mt,
		addr(parts), addr(arrays[4*2*n:]), addr(arrays[4*3*n:]), mt, c.comm); err != nil {
		return err
	}
	if err := c.wait(ctx, kAllReduce, c.reqs[:1], send, parts, arrays); err != nil {
		return err
	}
	at := int(displs[c.rank]) * esz
	if err := collective.Reduce(op, dt, recv[at:at+m*esz], blocks(parts, n)...); err != nil {
		return err
	}
	if err := c.start(kAllReduce, "MPI_Iallgatherv", 0, c.l.iallgatherv, mpiInPlace, 0, mt,
		addr(recv), addr(arrays[:4*n]), addr(arrays[4*n:]), mt, c.comm); err != nil {
		return err
	}
	return c.wait(ctx, kAllReduce, c.reqs[:1], recv, arrays)
}

// blocks cuts b into n equal blocks.
func blocks(b []byte, n int) [][]byte {
	s := len(b) / n
	out := make([][]byte, n)
	for i := range out {
		out[i] = b[i*s : (i+1)*s : (i+1)*s]
	}
	return out
}

// AllGather implements [collective.Communicator.AllGather] with
// MPI_Iallgather, gathering into recv directly when the blocks along axis
// are contiguous (axis 0, or leading dimensions of 1) and through a buffer
// reordered locally otherwise.
func (c *Comm) AllGather(ctx context.Context, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	var sh []int
	return c.call(ctx, kAllGather, func(d *desc) error {
		d.dt, d.axis, d.nbytes = int64(dt), int64(axis), int64(len(send))
		var err error
		if sh, err = c.checkShape(d, dt, shape, send, recv, axis, -1); err != nil {
			return err
		}
		if want := len(send) * c.size; len(recv) != want {
			return fmt.Errorf("recv has %d bytes, want %d (%d ranks × %d)", len(recv), want, c.size, len(send))
		}
		return bufs.CheckDisjoint(send, recv)
	}, func(*desc) error {
		out := slices.Clone(sh)
		out[axis] *= c.size
		dst := recv
		direct := contiguous(out, axis, c.size, dt.Size())
		if !direct {
			dst = alloc(len(recv))
		}
		n, mt := count(len(send), dt), c.moveType(dt)
		if err := c.start(kAllGather, "MPI_Iallgather", 0, c.l.iallgather, addr(send), n, mt, addr(dst), n, mt, c.comm); err != nil {
			return err
		}
		if err := c.wait(ctx, kAllGather, c.reqs[:1], send, dst); err != nil {
			return err
		}
		if !direct {
			fromBlocks(recv, dst, out, axis, c.size, dt.Size())
		}
		return nil
	})
}

// ReduceScatter implements [collective.Communicator.ReduceScatter]: the
// blocks along axis are made contiguous locally, then
// MPI_Ireduce_scatter_block reduces them where MPI reduces the dtype like
// Local (see AllReduce); otherwise MPI_Ialltoall brings every rank's copy of
// this rank's block here and they are reduced in rank order like Local.
func (c *Comm) ReduceScatter(ctx context.Context, op collective.Op, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	var sh []int
	return c.call(ctx, kReduceScatter, func(d *desc) error {
		d.op, d.dt, d.axis, d.nbytes = int64(op), int64(dt), int64(axis), int64(len(send))
		if err := checkReduce(op, dt); err != nil {
			return err
		}
		var err error
		if sh, err = c.checkShape(d, dt, shape, send, recv, axis, axis); err != nil {
			return err
		}
		if want := len(send) / c.size; len(recv) != want {
			return fmt.Errorf("recv has %d bytes, want %d (1/%d of send)", len(recv), want, c.size)
		}
		return bufs.CheckDisjoint(send, recv)
	}, func(*desc) error {
		src := send
		if !contiguous(sh, axis, c.size, dt.Size()) {
			src = alloc(len(send))
			toBlocks(src, send, sh, axis, c.size, dt.Size())
		}
		n := count(len(recv), dt)
		if typ, mop, ok := c.native(op, dt); ok {
			if err := c.start(kReduceScatter, "MPI_Ireduce_scatter_block", 0, c.l.ireduceScatterBlock, addr(src), addr(recv), n, typ, mop, c.comm); err != nil {
				return err
			}
			return c.wait(ctx, kReduceScatter, c.reqs[:1], src, recv)
		}
		mine := alloc(len(send))
		mt := c.moveType(dt)
		if err := c.start(kReduceScatter, "MPI_Ialltoall", 0, c.l.ialltoall, addr(src), n, mt, addr(mine), n, mt, c.comm); err != nil {
			return err
		}
		if err := c.wait(ctx, kReduceScatter, c.reqs[:1], src, mine); err != nil {
			return err
		}
		return collective.Reduce(op, dt, recv, blocks(mine, c.size)...)
	})
}

// AllToAll implements [collective.Communicator.AllToAll] with MPI_Ialltoall
// on the blocks along splitAxis made contiguous, placing the received blocks
// along concatAxis (in place when they are contiguous in recv).
func (c *Comm) AllToAll(ctx context.Context, dt ir.DType, shape []int, splitAxis, concatAxis int, send, recv []byte) error {
	var sh []int
	return c.call(ctx, kAllToAll, func(d *desc) error {
		d.dt, d.axis, d.axis2, d.nbytes = int64(dt), int64(splitAxis), int64(concatAxis), int64(len(send))
		var err error
		if sh, err = c.checkShape(d, dt, shape, send, recv, splitAxis, splitAxis); err != nil {
			return err
		}
		if concatAxis < 0 || concatAxis >= len(sh) {
			return fmt.Errorf("concat axis %d is out of range for shape %v", concatAxis, sh)
		}
		if len(recv) != len(send) {
			return fmt.Errorf("recv has %d bytes, want send's %d", len(recv), len(send))
		}
		return bufs.CheckDisjoint(send, recv)
	}, func(*desc) error {
		esz := dt.Size()
		src := send
		if !contiguous(sh, splitAxis, c.size, esz) {
			src = alloc(len(send))
			toBlocks(src, send, sh, splitAxis, c.size, esz)
		}
		out := slices.Clone(sh)
		out[splitAxis] /= c.size
		out[concatAxis] *= c.size
		dst := recv
		direct := contiguous(out, concatAxis, c.size, esz)
		if !direct {
			dst = alloc(len(recv))
		}
		n, mt := count(len(send)/c.size, dt), c.moveType(dt)
		if err := c.start(kAllToAll, "MPI_Ialltoall", 0, c.l.ialltoall, addr(src), n, mt, addr(dst), n, mt, c.comm); err != nil {
			return err
		}
		if err := c.wait(ctx, kAllToAll, c.reqs[:1], src, dst); err != nil {
			return err
		}
		if !direct {
			fromBlocks(recv, dst, out, concatAxis, c.size, esz)
		}
		return nil
	})
}

// Polling: a waiting rank calls MPI_Testall and yields (runtime.Gosched)
// for spinFor, then sleeps between polls, the sleep doubling up to maxSleep.
// Open MPI's non-blocking collectives advance only inside MPI calls, so each
// round of a collective's algorithm waits for a poll on every rank: spinning
// keeps small collectives fast; sleeping keeps long waits from burning a core
// that the process's other goroutines (and co-located ranks) need.
var (
	spinFor  = table.MPISpin.Get()
	maxSleep = table.MPIMaxSleep.Get()
)

// permuteTag tags CollectivePermute's messages.
const permuteTag = 11

// CollectivePermute implements [collective.Communicator.CollectivePermute]
// with MPI_Isend and MPI_Irecv; a rank that is no pair's target gets zeros.
func (c *Comm) CollectivePermute(ctx context.Context, dt ir.DType, pairs []collective.Pair, send, recv []byte) error {
	return c.call(ctx, kPermute, func(d *desc) error {
		d.dt, d.nbytes = int64(dt), int64(len(send))
		h := fnv.New64a()
		for _, p := range pairs {
			fmt.Fprintf(h, "%d>%d,", p.Source, p.Target)
		}
		d.pairsHash = h.Sum64()
		if err := checkFlat(d, dt, send, recv); err != nil {
			return err
		}
		seen := make([]bool, 2*c.size)
		for i, p := range pairs {
			if p.Source < 0 || p.Source >= c.size || p.Target < 0 || p.Target >= c.size {
				return fmt.Errorf("pair %d (%d→%d) names a rank outside [0, %d)", i, p.Source, p.Target, c.size)
			}
			if seen[p.Source] || seen[c.size+p.Target] {
				return fmt.Errorf("pair %d (%d→%d) repeats a source or a target", i, p.Source, p.Target)
			}
			seen[p.Source], seen[c.size+p.Target] = true, true
		}
		return bufs.CheckDisjoint(send, recv)
	}, func(*desc) error {
		n, mt := count(len(send), dt), c.moveType(dt)
		m := 0 // requests started
		received := false
		for _, p := range pairs {
			switch {
			case p.Source == c.rank && p.Target == c.rank:
				copy(recv, send)
				received = true
			case p.Source == c.rank:
				m++
				if err := c.start(kPermute, "MPI_Isend", m-1, c.l.isend, addr(send), n, mt, uintptr(p.Target), permuteTag, c.comm); err != nil {
					return err
				}
			case p.Target == c.rank:
				m++
				received = true
				if err := c.start(kPermute, "MPI_Irecv", m-1, c.l.irecv, addr(recv), n, mt, uintptr(p.Source), permuteTag, c.comm); err != nil {
					return err
				}
			}
		}
		if !received {
			clear(recv)
		}
		if m == 0 {
			return nil
		}
		return c.wait(ctx, kPermute, c.reqs[:m], send, recv)
	})
}

// Broadcast implements [collective.Communicator.Broadcast] with MPI_Ibcast.
func (c *Comm) Broadcast(ctx context.Context, dt ir.DType, root int, buf []byte) error {
	return c.call(ctx, kBroadcast, func(d *desc) error {
		d.dt, d.root, d.nbytes = int64(dt), int64(root), int64(len(buf))
		if err := checkFlat(d, dt, buf, buf); err != nil {
			return err
		}
		if root < 0 || root >= c.size {
			return fmt.Errorf("root %d is outside [0, %d)", root, c.size)
		}
		return nil
	}, func(*desc) error {
		if err := c.start(kBroadcast, "MPI_Ibcast", 0, c.l.ibcast, addr(buf), count(len(buf), dt), c.moveType(dt), uintptr(root), c.comm); err != nil {
			return err
		}
		return c.wait(ctx, kBroadcast, c.reqs[:1], buf)
	})
}

// Barrier implements [collective.Communicator.Barrier]: the exchange of call
// descriptors every collective begins with (an MPI_Iallgather) completes on
// a rank only once every rank has joined it, which is a barrier.
func (c *Comm) Barrier(ctx context.Context) error {
	return c.call(ctx, kBarrier, func(*desc) error { return nil }, nil)
}

// Split implements [collective.Communicator.Split] with MPI_Comm_split, after
// the descriptor exchange has checked that every rank called Split (that
// exchange is bounded by the timeout; MPI_Comm_split itself blocks, but every
// rank has then entered it). The new communicator shares this one's abort
// state and settings.
func (c *Comm) Split(ctx context.Context, color, key int) (collective.Communicator, error) {
	var out *Comm
	err := c.call(ctx, kSplit, func(d *desc) error {
		d.color, d.key = int64(color), int64(key)
		if color < 0 && color != collective.Undefined || color > math.MaxInt32 {
			return fmt.Errorf("color %d is out of range (non-negative C int, or Undefined)", color)
		}
		if key < math.MinInt32 || key > math.MaxInt32 {
			return fmt.Errorf("key %d does not fit a C int", key)
		}
		return nil
	}, func(*desc) error {
		mc := int64(color)
		if color == collective.Undefined {
			mc = mpiUndefined
		}
		h := new(uintptr)
		if err := c.l.check("MPI_Comm_split", c.l.call(c.l.commSplit, c.comm, uintptr(mc), uintptr(int64(key)), uintptr(unsafe.Pointer(h)))); err != nil {
			return c.giveUp(kSplit, err)
		}
		if color == collective.Undefined {
			return nil
		}
		var rank, size int32
		for _, err := range []error{
			c.l.check("MPI_Comm_set_errhandler", c.l.call(c.l.commSetErrhandler, *h, c.l.errorsReturn)),
			c.l.check("MPI_Comm_rank", c.l.call(c.l.commRank, *h, uintptr(unsafe.Pointer(&rank)))),
			c.l.check("MPI_Comm_size", c.l.call(c.l.commSize, *h, uintptr(unsafe.Pointer(&size)))),
		} {
			if err != nil {
				return c.giveUp(kSplit, err)
			}
		}
		out = newComm(c.l, c.w, *h, int(rank), int(size), c.timeout, c.ordered)
		return nil
	})
	if err != nil || out == nil {
		return nil, err // a nil *Comm must not become a non-nil interface
	}
	return out, nil
}
