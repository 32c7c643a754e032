package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"unsafe"

	"github.com/ferryml/ferry/collective/internal/bufs"
	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/ir"
)

// ntBytes is the buffer size from which AllReduce writes results with
// streaming (non-temporal) stores.
const ntBytes = 1 << 20

// tile is the number of elements a rank reduces at a time in its accumulator.
const tile = 2048

// Local is the in-process engine: the ranks are goroutines of one process
// (virtual CPU devices) and exchange data through shared memory, each rank
// reading its peers' buffers directly.
//
// Every collective costs two barrier phases (Barrier one): the ranks publish
// their arguments and buffers and wait for each other, check that the calls
// match, do their share of the work, and wait until every rank is done with
// every buffer. The work is split evenly: in AllReduce each rank reduces
// 1/Size() of the elements (in 64-byte-aligned slices) and writes the result to
// every rank's recv; in ReduceScatter each rank reduces its own block; in
// AllGather, AllToAll, CollectivePermute and Broadcast each rank copies what
// it receives. No call allocates memory proportional to the buffers: each rank
// reduces through a 16 KiB accumulator made once.
//
// Reduction order: element i of a reduction is
// ((x₀[i] op x₁[i]) op x₂[i]) … op xₙ₋₁[i], the values of ranks 0, 1, … in
// order, computed once and copied to every rank, so results are bit-identical
// on every rank and across runs. f32, f64 and the integers are reduced in their
// own type; f16 and bf16 are widened to float32, reduced in float32 in the same
// order, and rounded once (to nearest even) at the end.
type Local struct {
	g      *group
	rank   int
	calls  uint64 // this rank's call count; its parity picks the slot set
	acc    []byte // the reduction accumulator, tile elements of up to 8 bytes
	busy   atomic.Bool
	closed bool
}

// group is the state shared by the ranks of one communicator.
type group struct {
	n     int
	world *world
	bar   *barrier
	// slots[p][r] holds rank r's arguments of its calls with parity p:
	// double buffering lets a rank publish its next call while slower ranks
	// still read the previous one.
	slots [2][]slot
}

type kind uint8

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

func (k kind) String() string { return kindNames[k] }

// slot is one rank's published call.
type slot struct {
	kind        kind
	op          Op
	dt          ir.DType
	shape       []int // send's shape (copied: compared by other ranks)
	axis, axis2 int
	root        int
	pairs       []Pair // copied
	send, recv  []byte
	err         error // this rank's invalid arguments
	color, key  int   // Split
	sub         *group
	subMembers  []int // the new group's ranks, as ranks of this group
}

var _ Communicator = (*Local)(nil)

// NewLocal returns the n ranks of a new in-process communicator, to be used
// from n goroutines.
func NewLocal(n int) ([]*Local, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: NewLocal: %d ranks, want at least 1", ErrInvalid, n)
	}
	g := newGroup(n, newWorld())
	ls := make([]*Local, n)
	for r := range ls {
		ls[r] = &Local{g: g, rank: r}
	}
	return ls, nil
}

func newGroup(n int, w *world) *group {
	g := &group{n: n, world: w, bar: newBarrier(n)}
	g.slots[0], g.slots[1] = make([]slot, n), make([]slot, n)
	return g
}

// Rank is this rank's index in the group.
func (c *Local) Rank() int { return c.rank }

// Size is the number of ranks in the group.
func (c *Local) Size() int { return c.g.n }

// Abort aborts every communicator of this one's world (the ranks made by one
// NewLocal and everything split from them).
func (c *Local) Abort(err error) { c.g.world.abort(err) }

// Close marks this rank closed.
func (c *Local) Close() error {
	c.closed = true
	return nil
}

// AllReduce implements [Communicator.AllReduce].
func (c *Local) AllReduce(ctx context.Context, op Op, dt ir.DType, send, recv []byte) error {
	return c.call(ctx, kAllReduce, func(s *slot) error { return s.setAllReduce(op, dt, send, recv) })
}

// The set methods record a call's arguments in s and check them for a group
// of n ranks; Local and Hybrid share them.

func (s *slot) setAllReduce(op Op, dt ir.DType, send, recv []byte) error {
	s.op, s.dt, s.send, s.recv = op, dt, send, recv
	if err := checkReduce(op, dt); err != nil {
		return err
	}
	if err := s.checkFlat(dt, send, recv, len(send)); err != nil {
		return err
	}
	if bufs.Overlap(send, recv) && !bufs.Same(send, recv) {
		return errors.New("send and recv overlap without being the same slice")
	}
	return nil
}

// AllGather implements [Communicator.AllGather].
func (c *Local) AllGather(ctx context.Context, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	return c.call(ctx, kAllGather, func(s *slot) error { return s.setAllGather(c.g.n, dt, shape, axis, send, recv) })
}

func (s *slot) setAllGather(n int, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	s.dt, s.axis, s.send, s.recv = dt, axis, send, recv
	if err := s.checkShape(n, dt, shape, send, axis, -1); err != nil {
		return err
	}
	if want := len(send) * n; len(recv) != want {
		return fmt.Errorf("recv has %d bytes, want %d (%d ranks × %d)", len(recv), want, n, len(send))
	}
	return bufs.CheckDisjoint(send, recv)
}

// ReduceScatter implements [Communicator.ReduceScatter].
func (c *Local) ReduceScatter(ctx context.Context, op Op, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	return c.call(ctx, kReduceScatter, func(s *slot) error {
		return s.setReduceScatter(c.g.n, op, dt, shape, axis, send, recv)
	})
}

func (s *slot) setReduceScatter(n int, op Op, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	s.op, s.dt, s.axis, s.send, s.recv = op, dt, axis, send, recv
	if err := checkReduce(op, dt); err != nil {
		return err
	}
	if err := s.checkShape(n, dt, shape, send, axis, axis); err != nil {
		return err
	}
	if want := len(send) / n; len(recv) != want {
		return fmt.Errorf("recv has %d bytes, want %d (1/%d of send)", len(recv), want, n)
	}
	return bufs.CheckDisjoint(send, recv)
}

// AllToAll implements [Communicator.AllToAll].
func (c *Local) AllToAll(ctx context.Context, dt ir.DType, shape []int, splitAxis, concatAxis int, send, recv []byte) error {
	return c.call(ctx, kAllToAll, func(s *slot) error {
		return s.setAllToAll(c.g.n, dt, shape, splitAxis, concatAxis, send, recv)
	})
}

func (s *slot) setAllToAll(n int, dt ir.DType, shape []int, splitAxis, concatAxis int, send, recv []byte) error {
	s.dt, s.axis, s.axis2, s.send, s.recv = dt, splitAxis, concatAxis, send, recv
	if err := s.checkShape(n, dt, shape, send, splitAxis, splitAxis); err != nil {
		return err
	}
	if concatAxis < 0 || concatAxis >= len(s.shape) {
		return fmt.Errorf("concat axis %d is out of range for shape %v", concatAxis, s.shape)
	}
	if len(recv) != len(send) {
		return fmt.Errorf("recv has %d bytes, want send's %d", len(recv), len(send))
	}
	return bufs.CheckDisjoint(send, recv)
}

// CollectivePermute implements [Communicator.CollectivePermute].
func (c *Local) CollectivePermute(ctx context.Context, dt ir.DType, pairs []Pair, send, recv []byte) error {
	return c.call(ctx, kPermute, func(s *slot) error { return s.setPermute(c.g.n, dt, pairs, send, recv) })
}

func (s *slot) setPermute(n int, dt ir.DType, pairs []Pair, send, recv []byte) error {
	s.dt, s.send, s.recv = dt, send, recv
	s.pairs = append(s.pairs[:0], pairs...)
	if err := s.checkFlat(dt, send, recv, len(send)); err != nil {
		return err
	}
	seen := make([]bool, 2*n) // sources, then targets
	for i, p := range pairs {
		if p.Source < 0 || p.Source >= n || p.Target < 0 || p.Target >= n {
			return fmt.Errorf("pair %d (%d→%d) names a rank outside [0, %d)", i, p.Source, p.Target, n)
		}
		if seen[p.Source] || seen[n+p.Target] {
			return fmt.Errorf("pair %d (%d→%d) repeats a source or a target", i, p.Source, p.Target)
		}
		seen[p.Source], seen[n+p.Target] = true, true
	}
	return bufs.CheckDisjoint(send, recv)
}

// Broadcast implements [Communicator.Broadcast].
func (c *Local) Broadcast(ctx context.Context, dt ir.DType, root int, buf []byte) error {
	return c.call(ctx, kBroadcast, func(s *slot) error { return s.setBroadcast(c.g.n, dt, root, buf) })
}

func (s *slot) setBroadcast(n int, dt ir.DType, root int, buf []byte) error {
	s.dt, s.root, s.send, s.recv = dt, root, buf, buf
	if err := s.checkFlat(dt, buf, buf, len(buf)); err != nil {
		return err
	}
	if root < 0 || root >= n {
		return fmt.Errorf("root %d is outside [0, %d)", root, n)
	}
	return nil
}

// Barrier implements [Communicator.Barrier].
func (c *Local) Barrier(ctx context.Context) error {
	return c.call(ctx, kBarrier, func(*slot) error { return nil })
}

// Split implements [Communicator.Split]. The new communicator shares this
// one's world: aborting either aborts both.
func (c *Local) Split(ctx context.Context, color, key int) (Communicator, error) {
	var out *Local
	err := c.call(ctx, kSplit, func(s *slot) error { return s.setSplit(color, key) }, &out)
	if err != nil || out == nil {
		return nil, err // a nil *Local must not become a non-nil interface
	}
	return out, nil
}

func (s *slot) setSplit(color, key int) error {
	s.color, s.key, s.sub, s.subMembers = color, key, nil, nil
	if color < 0 && color != Undefined {
		return fmt.Errorf("color %d is negative (Undefined is %d)", color, Undefined)
	}
	return nil
}

// call runs one collective: publish the slot filled by fill, wait for every
// rank, check the calls agree, do this rank's work, wait for every rank again.
func (c *Local) call(ctx context.Context, k kind, fill func(*slot) error, split ...**Local) error {
	if !c.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("collective: %v on rank %d: the communicator is already in a call on another goroutine", k, c.rank)
	}
	defer c.busy.Store(false)
	if c.closed {
		return fmt.Errorf("%w: %v on rank %d", ErrClosed, k, c.rank)
	}
	g := c.g
	if err := g.world.failed(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return c.giveUp(k, err)
	}
	slots := g.slots[c.calls&1]
	c.calls++
	s := &slots[c.rank]
	*s = slot{kind: k, shape: s.shape[:0], pairs: s.pairs[:0]}
	if err := fill(s); err != nil {
		s.err = err
	}
	if err := c.wait(ctx, k); err != nil {
		return err
	}
	if err := check(slots, g.n); err != nil {
		return err
	}
	switch k {
	case kBarrier:
		return nil
	case kAllReduce:
		c.allReduce(slots)
	case kReduceScatter, kAllGather, kAllToAll, kPermute, kBroadcast:
		rankResult(k, slots, c.rank, c.accumulator)
	case kSplit:
		c.split(slots)
	}
	if err := c.wait(ctx, k); err != nil {
		return err
	}
	if k == kSplit {
		*split[0] = c.joinSplit(slots)
	}
	return nil
}

func (c *Local) wait(ctx context.Context, k kind) error {
	err := c.g.bar.wait(ctx, c.g.world)
	if e, ok := err.(errGaveUp); ok {
		return c.giveUp(k, e.err)
	}
	return err
}

// giveUp aborts the world because this rank stops waiting.
func (c *Local) giveUp(k kind, err error) error {
	c.g.world.abort(fmt.Errorf("rank %d gave up in %v: %w", c.rank, k, err))
	return c.g.world.failed()
}

// check returns the same error on every rank when a rank's arguments are
// invalid or the calls differ.
func check(slots []slot, n int) error {
	for r := range slots {
		if s := &slots[r]; s.err != nil {
			return fmt.Errorf("%w: %v on rank %d of %d: %w", ErrInvalid, s.kind, r, n, s.err)
		}
	}
	a := &slots[0]
	for r := 1; r < n; r++ {
		b := &slots[r]
		if a.kind != b.kind || a.op != b.op || a.dt != b.dt || a.axis != b.axis || a.axis2 != b.axis2 ||
			a.root != b.root || len(a.send) != len(b.send) || !slices.Equal(a.shape, b.shape) ||
			!slices.Equal(a.pairs, b.pairs) {
			return fmt.Errorf("%w: rank 0 called %s, rank %d called %s", ErrMismatch, a.describe(), r, b.describe())
		}
	}
	return nil
}

func (s *slot) describe() string {
	switch s.kind {
	case kAllReduce:
		return fmt.Sprintf("AllReduce(%v, %v%v)", s.op, s.dt, s.shape)
	case kAllGather:
		return fmt.Sprintf("AllGather(%v%v, axis %d)", s.dt, s.shape, s.axis)
	case kReduceScatter:
		return fmt.Sprintf("ReduceScatter(%v, %v%v, axis %d)", s.op, s.dt, s.shape, s.axis)
	case kAllToAll:
		return fmt.Sprintf("AllToAll(%v%v, split axis %d, concat axis %d)", s.dt, s.shape, s.axis, s.axis2)
	case kPermute:
		return fmt.Sprintf("CollectivePermute(%v%v, pairs %v)", s.dt, s.shape, s.pairs)
	case kBroadcast:
		return fmt.Sprintf("Broadcast(%v%v, root %d)", s.dt, s.shape, s.root)
	}
	return s.kind.String()
}

func checkReduce(op Op, dt ir.DType) error {
	if !op.Valid() {
		return fmt.Errorf("%v is not a reduction operator", op)
	}
	if _, ok := kernelFor(dt, op); !ok {
		return fmt.Errorf("cannot reduce dtype %v", dt)
	}
	return nil
}

// checkFlat checks a one-dimensional call whose send has n bytes and records
// its shape.
func (s *slot) checkFlat(dt ir.DType, send, recv []byte, n int) error {
	if err := bufs.CheckBuf("send", dt, send); err != nil {
		return err
	}
	if err := bufs.CheckBuf("recv", dt, recv); err != nil {
		return err
	}
	if len(recv) != len(send) {
		return fmt.Errorf("recv has %d bytes, want send's %d", len(recv), len(send))
	}
	s.shape = append(s.shape, n/dt.Size())
	return nil
}

// checkShape records shape (nil: flat) as send's shape and checks it against
// send, axis against the rank, and, when divAxis >= 0, that the group size n
// divides shape[divAxis].
func (s *slot) checkShape(n int, dt ir.DType, shape []int, send []byte, axis, divAxis int) error {
	if err := bufs.CheckBuf("send", dt, send); err != nil {
		return err
	}
	if err := bufs.CheckBuf("recv", dt, s.recv); err != nil {
		return err
	}
	if shape == nil {
		s.shape = append(s.shape, len(send)/dt.Size())
	} else {
		s.shape = append(s.shape, shape...)
	}
	elems := 1
	for _, d := range s.shape {
		if d < 0 {
			return fmt.Errorf("shape %v has a negative dimension", s.shape)
		}
		if d > 0 && elems > (1<<62)/d {
			return fmt.Errorf("shape %v is too large", s.shape)
		}
		elems *= d
	}
	if elems*dt.Size() != len(send) {
		return fmt.Errorf("send has %d bytes but shape %v%v has %d", len(send), dt, s.shape, elems*dt.Size())
	}
	if axis < 0 || axis >= len(s.shape) {
		return fmt.Errorf("axis %d is out of range for shape %v", axis, s.shape)
	}
	if divAxis >= 0 && s.shape[divAxis]%n != 0 {
		return fmt.Errorf("dimension %d of shape %v (axis %d) is not divisible by the %d ranks", s.shape[divAxis], s.shape, divAxis, n)
	}
	return nil
}

// accumulator returns this rank's accumulator, made on first use.
func (c *Local) accumulator() []byte {
	if c.acc == nil {
		c.acc = newAccumulator()
	}
	return c.acc
}

// newAccumulator returns a reduction accumulator of tile elements of up to 8
// bytes, 8-byte aligned for every accumulator type.
func newAccumulator() []byte {
	w := make([]uint64, tile)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 8*tile)
}

// foldRange reduces elements [a, b) of every slot's send with k, in rank
// order (element i is ((x₀[i] op x₁[i]) op x₂[i]) …), into acc and returns the
// part of acc holding them; a ≤ b ≤ a+tile.
func foldRange(k kernel, acc []byte, slots []slot, a, b, esz int) []byte {
	x := acc[:(b-a)*k.accSize]
	if len(slots) == 1 {
		k.load(x, slots[0].send[a*esz:b*esz])
	} else {
		k.fold2(x, slots[0].send[a*esz:b*esz], slots[1].send[a*esz:b*esz])
	}
	for j := 2; j < len(slots); j++ {
		k.fold(x, slots[j].send[a*esz:b*esz])
	}
	return x
}

// foldInto reduces the first len(dst) bytes of every slot's send with (dt,
// op), in rank order, into dst, a tile at a time through acc.
func foldInto(dst []byte, dt ir.DType, op Op, acc []byte, slots []slot) {
	esz := dt.Size()
	k, _ := kernelFor(dt, op)
	n := len(dst) / esz
	for a := 0; a < n; a += tile {
		b := min(a+tile, n)
		k.store(dst[a*esz:b*esz], foldRange(k, acc, slots, a, b, esz))
	}
}

// allReduce reduces this rank's slice of the elements and writes it to every
// rank's recv.
func (c *Local) allReduce(slots []slot) {
	s := &slots[c.rank]
	esz := s.dt.Size()
	k, _ := kernelFor(s.dt, s.op)
	n := len(s.send) / esz
	// Slices are whole 64-byte lines, so ranks never write the same line.
	line := max(1, 64/esz)
	lines := (n + line - 1) / line
	lo := min(n, c.rank*lines/c.g.n*line)
	hi := min(n, (c.rank+1)*lines/c.g.n*line)
	acc := c.accumulator()
	// Large results go to memory with streaming stores: every rank's recv is
	// written once and not read before the call returns, so reading its lines
	// into the cache first would only cost bandwidth.
	store, nt := k.store, k.accSize == esz && len(s.send) >= ntBytes
	if nt {
		store = vmath.StoreNT
	}
	for a := lo; a < hi; a += tile {
		b := min(a+tile, hi)
		x := foldRange(k, acc, slots, a, b, esz)
		for j := range c.g.n {
			store(slots[j].recv[a*esz:b*esz], x)
		}
	}
	if nt {
		vmath.Fence() // the streaming stores land before the barrier
	}
}

// The functions below compute rank's result into slots[rank].recv from every
// rank's send, the slots of a checked call; Local and Hybrid share them.

// reduceScatter reduces rank's block into its recv through the accumulator acc.
func reduceScatter(slots []slot, rank int, acc []byte) {
	n := len(slots)
	s := &slots[rank]
	esz := s.dt.Size()
	k, _ := kernelFor(s.dt, s.op)
	sp := bufs.BlockSpan(s.shape, s.axis, n, rank, esz)
	out := 0 // bytes of recv written
	total := sp.Run * sp.Count
	for out < total {
		m := min(total-out, tile*esz) // bytes of this tile
		x := acc[:m/esz*k.accSize]
		bufs.Segments(sp, out, out+m, func(src, at, nb int) {
			xa := x[at/esz*k.accSize : (at+nb)/esz*k.accSize]
			if n == 1 {
				k.load(xa, slots[0].send[src:src+nb])
			} else {
				k.fold2(xa, slots[0].send[src:src+nb], slots[1].send[src:src+nb])
			}
			for j := 2; j < n; j++ {
				k.fold(xa, slots[j].send[src:src+nb])
			}
		})
		k.store(s.recv[out:out+m], x)
		out += m
	}
}

func allGather(slots []slot, rank int) {
	n := len(slots)
	s := &slots[rank]
	esz := s.dt.Size()
	var buf [8]int
	out := append(buf[:0], s.shape...) // the output shape
	out[s.axis] *= n
	for i := range n {
		j := (rank + i) % n
		bufs.Copy(s.recv, bufs.BlockSpan(out, s.axis, n, j, esz), slots[j].send, bufs.Whole(slots[j].send))
	}
}

func allToAll(slots []slot, rank int) {
	n := len(slots)
	s := &slots[rank]
	esz := s.dt.Size()
	var buf [8]int
	out := append(buf[:0], s.shape...) // the output shape
	out[s.axis] /= n
	out[s.axis2] *= n
	for i := range n {
		j := (rank + i) % n
		bufs.Copy(s.recv, bufs.BlockSpan(out, s.axis2, n, j, esz),
			slots[j].send, bufs.BlockSpan(s.shape, s.axis, n, rank, esz))
	}
}

func permute(slots []slot, rank int) {
	s := &slots[rank]
	for _, p := range s.pairs {
		if p.Target == rank {
			copy(s.recv, slots[p.Source].send)
			return
		}
	}
	clear(s.recv)
}

func broadcast(slots []slot, rank int) {
	if s := &slots[rank]; rank != s.root {
		copy(s.recv, slots[s.root].send)
	}
}

// split: the first rank (in key order) of each color makes the new group and
// publishes it in its slot.
func (c *Local) split(slots []slot) {
	s := &slots[c.rank]
	if s.color == Undefined {
		return
	}
	var ranks []int
	for r := range slots {
		if slots[r].color == s.color {
			ranks = append(ranks, r)
		}
	}
	sort.SliceStable(ranks, func(a, b int) bool { return slots[ranks[a]].key < slots[ranks[b]].key })
	if ranks[0] != c.rank {
		return
	}
	s.sub = newGroup(len(ranks), c.g.world)
	s.subMembers = ranks
}

// joinSplit finds this rank's communicator among the groups made by split.
func (c *Local) joinSplit(slots []slot) *Local {
	s := &slots[c.rank]
	if s.color == Undefined {
		return nil
	}
	for r := range slots {
		l := &slots[r]
		if l.sub == nil || l.color != s.color {
			continue
		}
		return &Local{g: l.sub, rank: slices.Index(l.subMembers, c.rank)}
	}
	panic("collective: split lost its group") // unreachable: the leader always publishes
}

// rankResult writes rank's result of the gathered call slots of kind k (a
// reduce-scatter, all-gather, all-to-all, permute or broadcast) into its
// slot's recv; acc gives a reduce-scatter its accumulator. Every engine
// that gathers the slots computes results with it.
func rankResult(k kind, slots []slot, rank int, acc func() []byte) {
	switch k {
	case kReduceScatter:
		reduceScatter(slots, rank, acc())
	case kAllGather:
		allGather(slots, rank)
	case kAllToAll:
		allToAll(slots, rank)
	case kPermute:
		permute(slots, rank)
	case kBroadcast:
		broadcast(slots, rank)
	}
}
