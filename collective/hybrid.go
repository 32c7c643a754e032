package collective

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ferryml/ferry/ir"
)

// Hybrid is one device's rank in a world of devices spread over several
// processes: every process holds k local devices, one goroutine each, and the
// processes talk through a communicator among themselves (the Open MPI engine
// between processes launched by mpirun, or any other [Communicator]). Device d
// of process p is rank p·k+d of the world. [NewHybrid] makes a process's k
// ranks; [Communicator.Split], [SplitGroups] and [MeshAxes] make groups of
// devices that may lie in one process or span several.
//
// Hybrid has exactly [Local]'s semantics and bits: the same argument checks
// and errors, the same reduction order (rank order; f16 and bf16 accumulated
// in float32 and rounded once), so a sharded program gives the same results
// whether its devices share one process or not.
//
// # Design: one primitive, the correctness baseline
//
// Every collective is built on one primitive, an all-gather of equal-size
// blocks of every rank of the group: the process's members of the group hand
// their blocks to the process's leader (its first member) through an
// in-process rendezvous, the leader all-gathers the processes' blocks with
// the group's processes communicator (a Split of the one given to NewHybrid,
// over the processes holding members of the group), and every local member
// reads the whole gathered buffer. A call runs the primitive twice: first on
// a 24-byte header (the lengths of each rank's call description and send
// buffer), then on each rank's call description (collective, dtype, op,
// shape, axes, root, pairs, and its argument error if any) followed by its
// send buffer. Every rank then checks the descriptions as Local does (so
// mismatched or invalid calls give the same error on every rank, and the
// data is left out when the lengths differ) and computes its own result from
// the gathered buffers: AllReduce folds all n blocks in rank order,
// ReduceScatter its own block of that, AllGather reorders the blocks into the
// axis layout, AllToAll picks the blocks sent to it, CollectivePermute its
// source's buffer (zeros if none), Broadcast the root's, Barrier nothing.
// Split gathers every rank's color and key the same way, then the leaders
// split the processes communicator (every process takes part in each
// procs.Split: colors in increasing order, packed first-fit into calls in
// which each process joins at most one color) and make an in-process
// rendezvous for each color's local members.
//
// Cost: every process receives every rank's whole send buffer (n·L bytes for
// buffers of L bytes on n ranks, plus one copy in and out of the leader) and
// every rank reads all of them, where a ring all-reduce moves about 2L per
// rank: n× the data, and two latencies of the processes' all-gather plus four
// in-process barriers per call (six for Split). It is the correctness
// baseline that faster schedules must match bit for bit.
//
// # AllReduce: chunks
//
// An AllReduce whose headers (which also hold each rank's collective, op
// and dtype) show every rank's valid call of one op, dtype and length, the
// calls the check would pass, skips the second exchange: the elements are
// split into one chunk per process of the group, an AllToAll among the
// processes gives each process its chunk of every rank's send, the process's
// leader folds the chunk over all n ranks in rank order (Local's kernels,
// order and precision: each element is folded whole on one process, so the
// bits are Local's whatever the group's order of processes), and an
// AllGather among the processes gives every process every chunk's result.
// A process receives about (n/P)·L + L bytes instead of n·L, in three calls
// of the processes communicator (the header's all-gather, the AllToAll and
// the AllGather) and the same four in-process barriers. Below 64 KiB of
// sends in all, where latency rules, the sends are all-gathered whole
// instead (still without the descriptions) and every rank folds them. Every
// other call, a mismatched or invalid AllReduce included, takes the baseline
// path above.
//
// Abort and contexts: aborting any of a process's Hybrid ranks (or a context
// done while a rank waits) fails every pending and later call of every
// communicator of the world in this process with [ErrAborted], and aborts the
// processes communicator given to NewHybrid so that the other processes'
// calls fail too: a process learns of it when its leader of a group waits on
// (or next calls) the processes communicator, and then aborts its own ranks.
type Hybrid struct {
	g      *hgroup
	rank   int
	li     int // index among this process's members of the group
	acc    []byte
	busy   atomic.Bool
	closed bool
}

var _ Communicator = (*Hybrid)(nil)

// hworld is the abort state of a process's Hybrid ranks and everything split
// from them; aborting it aborts the processes communicator too.
type hworld struct {
	w     *world
	procs Communicator
}

func (hw *hworld) abort(err error) {
	hw.w.abort(err)
	hw.procs.Abort(err)
}

// hgroup is one process's view of a group of Hybrid ranks.
type hgroup struct {
	n     int
	world *hworld
	// procs connects the processes holding members of the group, ranked in
	// the order of the processes; only the leader (local member 0) uses it.
	procs    Communicator
	ownProcs bool  // procs was made by Split: closed with the group's last local member
	procOf   []int // procOf[r]: the procs rank of the process holding rank r
	pos      []int // pos[r]: the index of rank r's block in a gathered buffer
	per      int   // blocks per process in a gathered buffer: the most members a process holds
	local    []int // the ranks held by this process, ascending (local member i is local[i])
	parent   []int // the group's ranks as ranks of the group it was split from
	bar      *barrier
	nclosed  atomic.Int32

	// The rendezvous, written between barrier phases.
	parts    []part       // the local members' blocks
	out      []byte       // the gathered buffer
	readers  atomic.Int32 // the local members yet to read out
	err      error        // the leader's error
	subs     map[int]*hgroup
	splitErr error
}

// part is a member's block: head at its start, tail at byte off.
type part struct {
	head, tail []byte
	off        int
}

// NewHybrid returns this process's local ranks of a world of devices spread
// over processes. It is called once in every process, with procs a
// communicator among the processes (rank = process index p, Size = P) and
// local = k, the process's number of devices, the same in every process; it
// returns k communicators, one per local device, each for one goroutine:
// device d's has rank p·k+d of the world of P·k ranks. procs is owned by the
// caller, who must not use it while the Hybrid ranks are in use; aborting a
// Hybrid rank aborts procs.
//
// Each group of ranks gets its own communicator split from procs, used by
// the group's first member in each process, so the devices of a process
// drive several such communicators at once from different goroutines (with
// Open MPI: MPI_THREAD_MULTIPLE).
func NewHybrid(ctx context.Context, procs Communicator, local int) ([]*Hybrid, error) {
	if procs == nil {
		return nil, fmt.Errorf("%w: NewHybrid: nil processes communicator", ErrInvalid)
	}
	np, p := procs.Size(), procs.Rank()
	// Every process learns every process's device count, so that all agree
	// on the error.
	mine, all := alignedBytes(8), alignedBytes(8*np)
	binary.LittleEndian.PutUint64(mine, uint64(int64(local)))
	if err := procs.AllGather(ctx, ir.Int64, nil, 0, mine, all); err != nil {
		return nil, fmt.Errorf("NewHybrid: exchanging the processes' device counts: %w", err)
	}
	ks := make([]int64, np)
	for q := range ks {
		ks[q] = int64(binary.LittleEndian.Uint64(all[8*q:]))
		if ks[q] < 1 || ks[q] > (1<<31)/int64(np) {
			return nil, fmt.Errorf("%w: NewHybrid: process %d has %d local devices, want 1 to %d", ErrInvalid, q, ks[q], (1<<31)/np)
		}
	}
	for q, kq := range ks {
		if kq != ks[0] {
			return nil, fmt.Errorf("%w: NewHybrid: process 0 has %d local devices but process %d has %d; every process must have the same number", ErrMismatch, ks[0], q, kq)
		}
	}
	n := np * local
	g := &hgroup{
		n: n, world: &hworld{w: newWorld(), procs: procs}, procs: procs,
		procOf: make([]int, n), pos: make([]int, n), per: local,
		bar: newBarrier(local), parts: make([]part, local),
	}
	for r := range n {
		g.procOf[r], g.pos[r] = r/local, r
	}
	hs := make([]*Hybrid, local)
	for d := range hs {
		g.local = append(g.local, p*local+d)
		hs[d] = &Hybrid{g: g, rank: p*local + d, li: d}
	}
	return hs, nil
}

// Rank is this rank's index in the group.
func (c *Hybrid) Rank() int { return c.rank }

// Size is the number of ranks in the group.
func (c *Hybrid) Size() int { return c.g.n }

// Abort aborts every communicator of this one's world in this process (the
// ranks made by NewHybrid and everything split from them) and the processes
// communicator given to NewHybrid, which fails the other processes' calls.
func (c *Hybrid) Abort(err error) { c.g.world.abort(err) }

// Close marks this rank closed. When every local member of a group made by
// Split has closed, the group's processes communicator is closed; the one
// given to NewHybrid is the caller's.
func (c *Hybrid) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	if g := c.g; int(g.nclosed.Add(1)) == len(g.local) && g.ownProcs {
		return g.procs.Close()
	}
	return nil
}

// AllReduce implements [Communicator.AllReduce].
func (c *Hybrid) AllReduce(ctx context.Context, op Op, dt ir.DType, send, recv []byte) error {
	return c.run(ctx, kAllReduce, func(s *slot) error { return s.setAllReduce(op, dt, send, recv) })
}

// AllGather implements [Communicator.AllGather].
func (c *Hybrid) AllGather(ctx context.Context, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	return c.run(ctx, kAllGather, func(s *slot) error { return s.setAllGather(c.g.n, dt, shape, axis, send, recv) })
}

// ReduceScatter implements [Communicator.ReduceScatter].
func (c *Hybrid) ReduceScatter(ctx context.Context, op Op, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	return c.run(ctx, kReduceScatter, func(s *slot) error {
		return s.setReduceScatter(c.g.n, op, dt, shape, axis, send, recv)
	})
}

// AllToAll implements [Communicator.AllToAll].
func (c *Hybrid) AllToAll(ctx context.Context, dt ir.DType, shape []int, splitAxis, concatAxis int, send, recv []byte) error {
	return c.run(ctx, kAllToAll, func(s *slot) error {
		return s.setAllToAll(c.g.n, dt, shape, splitAxis, concatAxis, send, recv)
	})
}

// CollectivePermute implements [Communicator.CollectivePermute].
func (c *Hybrid) CollectivePermute(ctx context.Context, dt ir.DType, pairs []Pair, send, recv []byte) error {
	return c.run(ctx, kPermute, func(s *slot) error { return s.setPermute(c.g.n, dt, pairs, send, recv) })
}

// Broadcast implements [Communicator.Broadcast].
func (c *Hybrid) Broadcast(ctx context.Context, dt ir.DType, root int, buf []byte) error {
	return c.run(ctx, kBroadcast, func(s *slot) error { return s.setBroadcast(c.g.n, dt, root, buf) })
}

// Barrier implements [Communicator.Barrier].
func (c *Hybrid) Barrier(ctx context.Context) error {
	return c.run(ctx, kBarrier, func(*slot) error { return nil })
}

// Split implements [Communicator.Split]. The new communicator shares this
// one's world: aborting either aborts both.
func (c *Hybrid) Split(ctx context.Context, color, key int) (Communicator, error) {
	var out *Hybrid
	err := c.do(ctx, kSplit, func(s *slot) error { return s.setSplit(color, key) }, func(slots []slot) (err error) {
		out, err = c.split(ctx, slots)
		return err
	})
	if err != nil || out == nil {
		return nil, err // a nil *Hybrid must not become a non-nil interface
	}
	return out, nil
}

// run runs a collective other than Split: gather, check, compute this rank's
// result.
func (c *Hybrid) run(ctx context.Context, k kind, fill func(*slot) error) error {
	return c.do(ctx, k, fill, func(slots []slot) error {
		if k == kAllReduce {
			c.allReduce(slots)
		} else {
			rankResult(k, slots, c.rank, c.accumulator)
		}
		return nil
	})
}

// hdrSize is the size of a call's header: the lengths of its description and
// of its send buffer (8 bytes each), whether its arguments are invalid, and
// the collective, op and dtype (a byte each).
const hdrSize = 24

// sameAllReduce reports whether the gathered headers are every rank's valid
// AllReduce of one op, dtype and length: calls that check would pass and
// whose descriptions are equal, as they hold nothing else.
func sameAllReduce(hdrs []byte, pos []int) bool {
	a := hdrs[pos[0]*hdrSize:]
	for _, p := range pos {
		h := hdrs[p*hdrSize:]
		if kind(h[17]) != kAllReduce || h[16] != 0 || !bytes.Equal(h[8:16], a[8:16]) || h[18] != a[18] || h[19] != a[19] {
			return false
		}
	}
	return true
}

// do runs one call: it gathers every rank's header, then every rank's call
// description and send buffer, checks the calls as Local does, and hands the
// checked slots (each rank's send in the gathered buffer, this rank's recv its
// own) to finish.
func (c *Hybrid) do(ctx context.Context, k kind, fill func(*slot) error, finish func([]slot) error) error {
	if !c.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("collective: %v on rank %d: the communicator is already in a call on another goroutine", k, c.rank)
	}
	defer c.busy.Store(false)
	if c.closed {
		return fmt.Errorf("%w: %v on rank %d", ErrClosed, k, c.rank)
	}
	g := c.g
	if err := g.world.w.failed(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return c.giveUp(k, err)
	}
	s := slot{kind: k}
	if err := fill(&s); err != nil {
		s.err = err
	}
	desc := appendCall(nil, &s)
	data := s.send
	if s.err != nil {
		data = nil
	}
	hdr := alignedBytes(hdrSize)
	binary.LittleEndian.PutUint64(hdr, uint64(len(desc)))
	binary.LittleEndian.PutUint64(hdr[8:], uint64(len(data)))
	if s.err != nil {
		hdr[16] = 1
	}
	hdr[17], hdr[18], hdr[19] = byte(k), byte(s.op), byte(s.dt)
	hdrs, err := c.exchange(ctx, k, hdrSize, part{head: hdr})
	if err != nil {
		return err
	}
	if sameAllReduce(hdrs, g.pos) {
		return c.allReduceFast(ctx, &s)
	}
	// The data travels only when every rank's arguments are valid and its
	// send buffers have one length; otherwise the check below fails anyway.
	n := g.n
	descLen, invalid := make([]int, n), make([]bool, n)
	dataLen, withData, maxDesc := -1, true, 0
	for r := range n {
		h := hdrs[g.pos[r]*hdrSize:]
		descLen[r], invalid[r] = int(binary.LittleEndian.Uint64(h)), h[16] != 0
		l := int(binary.LittleEndian.Uint64(h[8:]))
		maxDesc = max(maxDesc, descLen[r])
		if invalid[r] || (dataLen >= 0 && l != dataLen) {
			withData = false
		}
		dataLen = l
	}
	off, size := roundUp8(maxDesc), roundUp8(maxDesc)
	if withData {
		size += roundUp8(dataLen)
	} else {
		data = nil
	}
	blocks, err := c.exchange(ctx, k, size, part{head: desc, tail: data, off: off})
	if err != nil {
		return err
	}
	slots := make([]slot, n)
	for r := range n {
		b := blocks[g.pos[r]*size:]
		if err := parseCall(b[:descLen[r]], &slots[r]); err != nil {
			return fmt.Errorf("collective: %v on rank %d: rank %d's call description does not parse: %w", k, c.rank, r, err)
		}
		if invalid[r] && slots[r].err == nil {
			slots[r].err = errors.New("invalid arguments")
		}
		if withData {
			slots[r].send = b[off : off+dataLen]
		}
	}
	slots[c.rank].recv = s.recv
	// Without the data every send is nil, so check compares no lengths; it
	// still finds the same mismatch: two valid calls of one collective, dtype
	// and shape have sends of one length.
	if err := check(slots, n); err != nil {
		return err
	}
	return finish(slots)
}

// exchange all-gathers the group's blocks of size bytes: every local member
// passes its block, and gets the gathered buffer, in which rank r's block
// starts at byte g.pos[r]*size. The buffer is new and is not written again.
func (c *Hybrid) exchange(ctx context.Context, k kind, size int, b part) ([]byte, error) {
	return c.rendezvous(ctx, k, b, func() ([]byte, error) { return c.gather(ctx, k, size) })
}

// rendezvous publishes this local member's part, lets the leader compute a
// buffer from every local member's part with lead (the parts stay readable
// until lead returns), and gives every member that buffer, which is not
// written again.
func (c *Hybrid) rendezvous(ctx context.Context, k kind, b part, lead func() ([]byte, error)) ([]byte, error) {
	g := c.g
	g.parts[c.li] = b
	if err := c.wait(ctx, k); err != nil {
		return nil, err
	}
	if c.li == 0 {
		g.out, g.err = lead()
		g.readers.Store(int32(len(g.local)))
	}
	if err := c.wait(ctx, k); err != nil {
		return nil, err
	}
	out, err := g.out, g.err
	if g.readers.Add(-1) == 0 {
		g.out = nil // the last reader: the buffer lives only as long as the calls use it
	}
	return out, err
}

// gather is the leader's part of exchange: pack the local members' blocks and
// all-gather them with the other processes.
func (c *Hybrid) gather(ctx context.Context, k kind, size int) ([]byte, error) {
	g := c.g
	send := alignedBytes(g.per * size)
	for i, p := range g.parts {
		b := send[i*size : (i+1)*size]
		copy(b, p.head)
		copy(b[p.off:], p.tail)
		g.parts[i] = part{}
	}
	out := alignedBytes(g.procs.Size() * len(send))
	if err := g.procs.AllGather(ctx, ir.Uint8, nil, 0, send, out); err != nil {
		return nil, c.procsFailed(ctx, k, err)
	}
	return out, nil
}

// procsFailed aborts the world after the processes communicator failed in the
// leader's hands, and returns the world's error.
func (c *Hybrid) procsFailed(ctx context.Context, k kind, err error) error {
	if ctx.Err() != nil {
		err = fmt.Errorf("rank %d gave up in %v while its process waited for the others: %w", c.rank, k, err)
	} else {
		err = fmt.Errorf("rank %d: %v between processes failed: %w", c.rank, k, err)
	}
	c.g.world.abort(err)
	return c.g.world.w.failed()
}

func (c *Hybrid) wait(ctx context.Context, k kind) error {
	err := c.g.bar.wait(ctx, c.g.world.w)
	if e, ok := err.(errGaveUp); ok {
		return c.giveUp(k, e.err)
	}
	return err
}

// giveUp aborts the world because this rank stops waiting.
func (c *Hybrid) giveUp(k kind, err error) error {
	c.g.world.abort(fmt.Errorf("rank %d gave up in %v: %w", c.rank, k, err))
	return c.g.world.w.failed()
}

func (c *Hybrid) accumulator() []byte {
	if c.acc == nil {
		c.acc = newAccumulator()
	}
	return c.acc
}

// allReduce folds every rank's send in rank order into this rank's recv.
func (c *Hybrid) allReduce(slots []slot) {
	s := &slots[c.rank]
	foldInto(s.recv[:len(s.send)], s.dt, s.op, c.accumulator(), slots)
}

// allReduceFast is the data phase of an AllReduce that every rank of the
// group called alike (so that the checks pass): the processes split the
// elements into one chunk each, and each process folds its chunk over every
// rank in rank order and shares the result (see reduceChunk).
func (c *Hybrid) allReduceFast(ctx context.Context, s *slot) error {
	if len(s.send) == 0 {
		return nil
	}
	if c.g.n*len(s.send) <= gatherAllReduce {
		return c.allReduceGathered(ctx, s)
	}
	out, err := c.rendezvous(ctx, kAllReduce, part{head: s.send}, func() ([]byte, error) {
		return c.reduceChunks(ctx, s.op, s.dt, len(s.send))
	})
	if err != nil {
		return err
	}
	copy(s.recv, out)
	return nil
}

// gatherAllReduce is the most bytes (ranks × bytes per rank) that
// allReduceFast all-gathers whole, where the latency of the chunks' two calls
// of the processes communicator would cost more than the data they save.
const gatherAllReduce = 64 << 10

// allReduceGathered is allReduceFast on small buffers: one all-gather of the
// ranks' sends (no descriptions), then every rank folds them in rank order.
func (c *Hybrid) allReduceGathered(ctx context.Context, s *slot) error {
	g := c.g
	size := roundUp8(len(s.send))
	blocks, err := c.exchange(ctx, kAllReduce, size, part{head: s.send})
	if err != nil {
		return err
	}
	slots := make([]slot, g.n)
	for r := range slots {
		slots[r].send = blocks[g.pos[r]*size:]
	}
	foldInto(s.recv[:len(s.send)], s.dt, s.op, c.accumulator(), slots)
	return nil
}

// reduceChunks is the leader's part of allReduceFast, on sends of size bytes
// held in g.parts. The elements are split into one chunk per process (a
// multiple of 8 elements, so chunks stay aligned): an AllToAll among the
// processes gives each process its chunk of every rank's send, the process
// folds it in rank order (the order and precision of Local: every element is
// folded whole on one process), and an AllGather gives every process every
// chunk's result. Each process receives about (n/P)·L + L bytes instead of
// the n·L of the all-gather design. It returns the result (at least size
// bytes; the rest is padding).
func (c *Hybrid) reduceChunks(ctx context.Context, op Op, dt ir.DType, size int) ([]byte, error) {
	g := c.g
	np, q := g.procs.Size(), g.procs.Rank()
	esz := dt.Size()
	n := size / esz
	ce := roundUp8((n + np - 1) / np) // elements per chunk
	cb := ce * esz
	lo := min(n, q*ce)
	nq := min(n, lo+ce) - lo // the elements of this process's chunk
	chunks := make([]slot, g.n)
	// The AllToAll's send and recv and this process's result chunk, from
	// scratch memory: every byte read is written first (padding, and the
	// slots of members a process lacks, hold junk no fold reads).
	a2a := np * g.per * cb
	buf := getScratch(2*a2a + cb)
	// Back to the pool only when the processes' calls completed: one that
	// failed may leave a transfer into the buffer in flight (the Open MPI
	// engine keeps such buffers pinned for good).
	ok := false
	defer func() {
		if ok {
			putScratch(buf)
		}
	}()
	mine := buf.b[2*a2a:]
	if np == 1 {
		for i, r := range g.local {
			chunks[r].send = g.parts[i].head
		}
	} else {
		// Block d of the AllToAll goes to process d: chunk d of the
		// process's members' sends, member i (rank local[i], the i-th of the
		// process's members in rank order) at slot i.
		send, recv := buf.b[:a2a], buf.b[a2a:2*a2a]
		for i := range g.local {
			for d := range np {
				a := min(n, d*ce)
				copy(send[(d*g.per+i)*cb:], g.parts[i].head[a*esz:min(n, a+ce)*esz])
			}
		}
		if err := g.procs.AllToAll(ctx, ir.Uint8, nil, 0, 0, send, recv); err != nil {
			return nil, c.procsFailed(ctx, kAllReduce, err)
		}
		for r := range chunks {
			chunks[r].send = recv[g.pos[r]*cb:]
		}
	}
	for i := range g.parts {
		g.parts[i] = part{}
	}
	foldInto(mine[:nq*esz], dt, op, c.accumulator(), chunks)
	out := alignedBytes(np * cb)
	if np == 1 {
		copy(out, mine)
	} else if err := g.procs.AllGather(ctx, ir.Uint8, nil, 0, mine, out); err != nil {
		return nil, c.procsFailed(ctx, kAllReduce, err)
	}
	ok = true
	return out, nil
}

// scratch holds reusable 8-byte-aligned buffers of the AllReduce chunks, so
// that the hot path neither allocates nor zeroes them; a sync.Pool, so the
// garbage collector still frees what is not in use.
var scratch sync.Pool

type scratchBuf struct {
	w []uint64
	b []byte
}

// getScratch returns an aligned buffer of n bytes, not zeroed.
func getScratch(n int) *scratchBuf {
	s, _ := scratch.Get().(*scratchBuf)
	if s == nil || 8*len(s.w) < n {
		s = &scratchBuf{w: make([]uint64, (n+7)/8+1)}
	}
	s.b = unsafe.Slice((*byte)(unsafe.Pointer(&s.w[0])), n)
	return s
}

func putScratch(s *scratchBuf) {
	s.b = nil
	scratch.Put(s)
}

// split makes this rank's new communicator: the process's leader splits the
// processes communicator and makes the new groups, the members join theirs.
func (c *Hybrid) split(ctx context.Context, slots []slot) (*Hybrid, error) {
	g := c.g
	if err := c.wait(ctx, kSplit); err != nil {
		return nil, err
	}
	if c.li == 0 {
		g.subs, g.splitErr = c.makeGroups(ctx, slots)
	}
	if err := c.wait(ctx, kSplit); err != nil {
		return nil, err
	}
	if g.splitErr != nil {
		return nil, g.splitErr
	}
	color := slots[c.rank].color
	if color == Undefined {
		return nil, nil
	}
	sub := g.subs[color]
	rank := slices.Index(sub.parent, c.rank)
	return &Hybrid{g: sub, rank: rank, li: slices.Index(sub.local, rank)}, nil
}

// makeGroups is the leader's part of Split: the new groups (each color's
// ranks ordered by key, then rank), one processes communicator per group
// from as few procs.Split calls as the colors' process sets allow, and this
// process's view of each group it holds members of.
func (c *Hybrid) makeGroups(ctx context.Context, slots []slot) (map[int]*hgroup, error) {
	g := c.g
	members := map[int][]int{}
	for r := range slots {
		if col := slots[r].color; col != Undefined {
			members[col] = append(members[col], r)
		}
	}
	colors := make([]int, 0, len(members))
	for col, rs := range members {
		colors = append(colors, col)
		sort.SliceStable(rs, func(a, b int) bool { return slots[rs[a]].key < slots[rs[b]].key })
	}
	slices.Sort(colors)
	// Each color's processes (procs ranks, ascending), and the rounds of
	// procs.Split: a color goes to the first round none of its processes is
	// in yet.
	procsOf := map[int][]int{}
	var rounds [][]int
	var used [][]bool
	for _, col := range colors {
		var ps []int
		for _, r := range members[col] {
			ps = append(ps, g.procOf[r])
		}
		slices.Sort(ps)
		ps = slices.Compact(ps)
		procsOf[col] = ps
		i := 0
		for ; i < len(rounds); i++ {
			if !slices.ContainsFunc(ps, func(p int) bool { return used[i][p] }) {
				break
			}
		}
		if i == len(rounds) {
			rounds, used = append(rounds, nil), append(used, make([]bool, g.procs.Size()))
		}
		rounds[i] = append(rounds[i], col)
		for _, p := range ps {
			used[i][p] = true
		}
	}
	me := g.procs.Rank()
	subs := map[int]*hgroup{}
	for _, round := range rounds {
		// The processes' color is the color's index in colors: a small
		// number whatever the ranks' colors (MPI's are C ints).
		mine, pcolor := Undefined, Undefined
		for _, col := range round {
			if slices.Contains(procsOf[col], me) {
				mine, pcolor = col, slices.Index(colors, col)
			}
		}
		pc, err := g.procs.Split(ctx, pcolor, me)
		if err != nil {
			return nil, c.procsFailed(ctx, kSplit, err)
		}
		if mine == Undefined {
			if pc != nil {
				pc.Close()
			}
			continue
		}
		if want := slices.Index(procsOf[mine], me); pc == nil || pc.Size() != len(procsOf[mine]) || pc.Rank() != want {
			return nil, c.procsFailed(ctx, kSplit, fmt.Errorf("splitting the processes communicator for color %d gave %v, want rank %d of %d", mine, describeComm(pc), want, len(procsOf[mine])))
		}
		subs[mine] = g.subgroup(members[mine], procsOf[mine], pc, me)
	}
	return subs, nil
}

func describeComm(c Communicator) string {
	if c == nil {
		return "no communicator"
	}
	return fmt.Sprintf("rank %d of %d", c.Rank(), c.Size())
}

// subgroup is this process's view of the new group of the given ranks of g
// (in new rank order), held by the processes ps (procs ranks of g, ascending)
// and connected by pc; me is this process's procs rank in g.
func (g *hgroup) subgroup(ranks, ps []int, pc Communicator, me int) *hgroup {
	n := len(ranks)
	sg := &hgroup{n: n, world: g.world, procs: pc, ownProcs: true, procOf: make([]int, n), pos: make([]int, n), parent: ranks}
	count := make([]int, len(ps))
	idx := make([]int, n) // index among the members held by the same process
	for i, r := range ranks {
		p := slices.Index(ps, g.procOf[r])
		sg.procOf[i], idx[i] = p, count[p]
		count[p]++
		if g.procOf[r] == me {
			sg.local = append(sg.local, i)
		}
	}
	sg.per = slices.Max(count)
	for i := range ranks {
		sg.pos[i] = sg.procOf[i]*sg.per + idx[i]
	}
	sg.bar, sg.parts = newBarrier(len(sg.local)), make([]part, len(sg.local))
	return sg
}

// appendCall appends the description of a call: what check compares and
// describe prints, the Split color and key, and the argument error.
func appendCall(b []byte, s *slot) []byte {
	b = append(b, byte(s.kind), byte(s.op), byte(s.dt))
	for _, v := range []int{s.axis, s.axis2, s.root, s.color, s.key, len(s.shape)} {
		b = binary.AppendVarint(b, int64(v))
	}
	for _, d := range s.shape {
		b = binary.AppendVarint(b, int64(d))
	}
	b = binary.AppendVarint(b, int64(len(s.pairs)))
	for _, p := range s.pairs {
		b = binary.AppendVarint(b, int64(p.Source))
		b = binary.AppendVarint(b, int64(p.Target))
	}
	if s.err != nil {
		b = append(b, s.err.Error()...)
	}
	return b
}

// parseCall reads a description written by appendCall into s.
func parseCall(b []byte, s *slot) error {
	if len(b) < 3 {
		return errors.New("too short")
	}
	s.kind, s.op, s.dt = kind(b[0]), Op(b[1]), ir.DType(b[2])
	if s.kind < kAllReduce || s.kind > kSplit {
		return fmt.Errorf("unknown collective %d", b[0])
	}
	b = b[3:]
	next := func() int {
		v, k := binary.Varint(b)
		if k <= 0 {
			b = nil
			return -1
		}
		b = b[k:]
		return int(v)
	}
	s.axis, s.axis2, s.root, s.color, s.key = next(), next(), next(), next(), next()
	nd := next()
	if nd < 0 || nd > len(b) {
		return errors.New("bad shape")
	}
	s.shape = make([]int, nd)
	for i := range s.shape {
		s.shape[i] = next()
	}
	np := next()
	if np < 0 || np > len(b) {
		return errors.New("bad pairs")
	}
	if np > 0 {
		s.pairs = make([]Pair, np)
		for i := range s.pairs {
			s.pairs[i] = Pair{next(), next()}
		}
	}
	if b == nil {
		return errors.New("truncated")
	}
	if len(b) > 0 {
		s.err = errors.New(string(b))
	}
	return nil
}

func roundUp8(n int) int { return (n + 7) &^ 7 }

// alignedBytes returns n zero bytes aligned to 8, for every dtype.
func alignedBytes(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}
