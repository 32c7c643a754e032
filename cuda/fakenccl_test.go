//go:build linux && (amd64 || arm64)

package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

// fakeNCCL is a group of device communicators over the fake driver's
// memory, like the ranks of one ncclCommInitAll: each rank is driven by its
// own goroutine (its own backend), and the k-th call of every rank (a
// GroupStart…GroupEnd of Send/Recv counting as one call) forms round k.
// A rank's call blocks until every rank has made its call of the round;
// the last to arrive performs the collective on the ranks' buffers (Go
// memory in the fake, so results are real) and wakes the others. Since the
// fake driver runs everything at issue time, the buffers hold what the
// stream order says they hold when the round runs. Every call is recorded
// (rank, function, count, type, reduction, stream) and, on the fake
// driver's stream record, as an operation of its stream reading its send
// buffer and writing its receive buffer, so that the race check covers it.
type fakeNCCL struct {
	f      *fakeCUDA
	mu     sync.Mutex
	cond   *sync.Cond
	ranks  []*fakeComm
	rounds map[int]*fakeRound
	calls  []fakeNCCLCall
	// failCall makes that function (ncclAllReduce, ...) fail to enqueue.
	failCall string
	// asyncErr is what AsyncError reports.
	asyncErr error
	aborted  error
	aborts   int
}

// fakeNCCLCall is one recorded call.
type fakeNCCLCall struct {
	rank   int
	fn     string
	count  int
	dt     ir.DType
	op     collective.Op
	peer   int
	stream uintptr
}

// fakeOpCall is one rank's part of a round.
type fakeOpCall struct {
	fn         string
	send, recv uintptr
	count      int // elements
	dt         ir.DType
	op         collective.Op
	root       int
	p2p        []fakeP2P // a group's sends and receives
}

type fakeP2P struct {
	send  bool
	peer  int
	buf   uintptr
	bytes int
}

type fakeRound struct {
	calls []*fakeOpCall
	n     int
	done  bool
	err   error
}

// fakeComm is one rank of a fakeNCCL.
type fakeComm struct {
	g    *fakeNCCL
	rank int
	// dev is the device the rank runs on (fakeMaker.InitAll), -1 when the
	// test does not say: every call's stream and buffers must then be
	// that device's.
	dev   int
	seq   int
	group *fakeOpCall // open group, or nil
}

func newFakeNCCL(f *fakeCUDA, n int) *fakeNCCL {
	g := &fakeNCCL{f: f, rounds: map[int]*fakeRound{}}
	g.cond = sync.NewCond(&g.mu)
	for r := range n {
		g.ranks = append(g.ranks, &fakeComm{g: g, rank: r, dev: -1})
	}
	return g
}

// comms returns rank r's communicators for the given axes (the same
// fakeComm for each: a one-axis mesh).
func (g *fakeNCCL) comms(r int, axes ...string) map[string]backend.DeviceCommunicator {
	m := map[string]backend.DeviceCommunicator{}
	for _, ax := range axes {
		m[ax] = g.ranks[r]
	}
	return m
}

func (c *fakeComm) Rank() int { return c.rank }
func (c *fakeComm) Size() int { return len(c.g.ranks) }

// record records a call and its stream operation.
func (c *fakeComm) record(call fakeNCCLCall, acc ...fakeAccess) error {
	g := c.g
	g.mu.Lock()
	g.calls = append(g.calls, call)
	fail := g.failCall == call.fn
	g.mu.Unlock()
	if fail {
		return fmt.Errorf("nccl: %s: unhandled system error (ncclSystemError)", call.fn)
	}
	g.f.mu.Lock()
	if g.f.streams != nil {
		g.f.streams.issue(call.stream, call.fn, acc...)
	}
	ok := c.dev < 0 || g.f.checkStream(call.fn, call.stream, c.dev)
	for _, a := range acc {
		ok = ok && (c.dev < 0 || g.f.checkPtr(call.fn, a.p, c.dev))
	}
	g.f.mu.Unlock()
	if !ok {
		return fmt.Errorf("fake nccl: rank %d on device %d: %s on another device's stream or memory", c.rank, c.dev, call.fn)
	}
	return nil
}

// fakeMaker is the backend.DeviceCommMaker of fake NCCL groups over the
// fake driver's devices: InitAll makes a group like ncclCommInitAll, rank
// i on device devices[i]; groups across processes are refused.
type fakeMaker struct {
	f      *fakeCUDA
	mu     sync.Mutex
	groups []*fakeNCCL
	inits  [][]int
}

func (m *fakeMaker) InitAll(devices []int) ([]backend.DeviceCommunicator, error) {
	g := newFakeNCCL(m.f, len(devices))
	out := make([]backend.DeviceCommunicator, len(devices))
	for i, r := range g.ranks {
		r.dev = devices[i]
		out[i] = r
	}
	m.mu.Lock()
	m.groups = append(m.groups, g)
	m.inits = append(m.inits, slices.Clone(devices))
	m.mu.Unlock()
	return out, nil
}

func (m *fakeMaker) NewGroupID() ([]byte, error) {
	return nil, errors.New("fake nccl: no groups across processes")
}

func (m *fakeMaker) InitRank(id []byte, size, rank int) (backend.DeviceCommunicator, error) {
	return nil, errors.New("fake nccl: no groups across processes")
}

// post adds c's part of its next round and waits for the round to run.
func (c *fakeComm) post(call *fakeOpCall) error {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aborted != nil {
		return fmt.Errorf("fake nccl: rank %d: communicator aborted: %w", c.rank, g.aborted)
	}
	k := c.seq
	c.seq++
	rd := g.rounds[k]
	if rd == nil {
		rd = &fakeRound{calls: make([]*fakeOpCall, len(g.ranks))}
		g.rounds[k] = rd
	}
	rd.calls[c.rank] = call
	rd.n++
	if rd.n == len(g.ranks) {
		rd.err = g.perform(rd.calls)
		rd.done = true
		g.cond.Broadcast()
	}
	for !rd.done && g.aborted == nil {
		g.cond.Wait()
	}
	if !rd.done {
		return fmt.Errorf("fake nccl: rank %d: communicator aborted: %w", c.rank, g.aborted)
	}
	return rd.err
}

func esize(dt ir.DType) int { return dt.Size() }

func (c *fakeComm) AllReduce(send, recv uintptr, count int, dt ir.DType, op collective.Op, stream uintptr) error {
	n := uintptr(count * esize(dt))
	if err := c.record(fakeNCCLCall{c.rank, "ncclAllReduce", count, dt, op, -1, stream}, fakeAccess{send, n, false}, fakeAccess{recv, n, true}); err != nil {
		return err
	}
	return c.post(&fakeOpCall{fn: "ncclAllReduce", send: send, recv: recv, count: count, dt: dt, op: op})
}

func (c *fakeComm) AllGather(send, recv uintptr, count int, dt ir.DType, stream uintptr) error {
	n := uintptr(count * esize(dt))
	if err := c.record(fakeNCCLCall{c.rank, "ncclAllGather", count, dt, 0, -1, stream}, fakeAccess{send, n, false}, fakeAccess{recv, n * uintptr(c.Size()), true}); err != nil {
		return err
	}
	return c.post(&fakeOpCall{fn: "ncclAllGather", send: send, recv: recv, count: count, dt: dt})
}

func (c *fakeComm) ReduceScatter(send, recv uintptr, count int, dt ir.DType, op collective.Op, stream uintptr) error {
	n := uintptr(count * esize(dt))
	if err := c.record(fakeNCCLCall{c.rank, "ncclReduceScatter", count, dt, op, -1, stream}, fakeAccess{send, n * uintptr(c.Size()), false}, fakeAccess{recv, n, true}); err != nil {
		return err
	}
	return c.post(&fakeOpCall{fn: "ncclReduceScatter", send: send, recv: recv, count: count, dt: dt, op: op})
}

func (c *fakeComm) Broadcast(send, recv uintptr, count int, dt ir.DType, root int, stream uintptr) error {
	n := uintptr(count * esize(dt))
	if err := c.record(fakeNCCLCall{c.rank, "ncclBroadcast", count, dt, 0, root, stream}, fakeAccess{send, n, false}, fakeAccess{recv, n, true}); err != nil {
		return err
	}
	return c.post(&fakeOpCall{fn: "ncclBroadcast", send: send, recv: recv, count: count, dt: dt, root: root})
}

func (c *fakeComm) p2p(fn string, buf uintptr, count int, dt ir.DType, peer int, stream uintptr) error {
	n := count * esize(dt)
	if err := c.record(fakeNCCLCall{c.rank, fn, count, dt, 0, peer, stream}, fakeAccess{buf, uintptr(n), fn == "ncclRecv"}); err != nil {
		return err
	}
	if c.group == nil {
		return fmt.Errorf("fake nccl: %s outside a group (the ranks would deadlock)", fn)
	}
	c.group.p2p = append(c.group.p2p, fakeP2P{send: fn == "ncclSend", peer: peer, buf: buf, bytes: n})
	return nil
}

func (c *fakeComm) Send(send uintptr, count int, dt ir.DType, peer int, stream uintptr) error {
	return c.p2p("ncclSend", send, count, dt, peer, stream)
}

func (c *fakeComm) Recv(recv uintptr, count int, dt ir.DType, peer int, stream uintptr) error {
	return c.p2p("ncclRecv", recv, count, dt, peer, stream)
}

func (c *fakeComm) GroupStart() error {
	if c.group != nil {
		return errors.New("fake nccl: nested group")
	}
	c.group = &fakeOpCall{fn: "group"}
	return nil
}

func (c *fakeComm) GroupEnd() error {
	call := c.group
	c.group = nil
	if call == nil {
		return errors.New("fake nccl: GroupEnd without GroupStart")
	}
	return c.post(call)
}

func (c *fakeComm) AsyncError() error {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	return c.g.asyncErr
}

func (c *fakeComm) Abort() error {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.aborts++
	if g.aborted == nil {
		g.aborted = fmt.Errorf("rank %d aborted", c.rank)
		g.cond.Broadcast()
	}
	return nil
}

// perform runs one round (called with g.mu held).
func (g *fakeNCCL) perform(calls []*fakeOpCall) error {
	c0 := calls[0]
	for r, c := range calls {
		if c.fn != c0.fn || (c.fn != "group" && (c.count != c0.count || c.dt != c0.dt || c.op != c0.op || c.root != c0.root)) {
			return fmt.Errorf("fake nccl: rank %d called %s(%d %v) where rank 0 called %s(%d %v)", r, c.fn, c.count, c.dt, c0.fn, c0.count, c0.dt)
		}
	}
	n := len(calls)
	es := esize(c0.dt)
	nb := c0.count * es
	switch c0.fn {
	case "ncclAllReduce", "ncclReduceScatter":
		total := c0.count
		if c0.fn == "ncclReduceScatter" {
			total *= n
		}
		acc := make([]float64, total)
		for r, c := range calls {
			for i := range total {
				v, err := loadElem(c.send, c.dt, i)
				if err != nil {
					return err
				}
				switch {
				case r == 0:
					acc[i] = v
				case c.op == collective.Sum:
					acc[i] += v
				case c.op == collective.Max:
					acc[i] = math.Max(acc[i], v)
				case c.op == collective.Min:
					acc[i] = math.Min(acc[i], v)
				default:
					return fmt.Errorf("fake nccl: reduction %v", c.op)
				}
			}
		}
		for r, c := range calls {
			lo := 0
			if c0.fn == "ncclReduceScatter" {
				lo = r * c0.count
			}
			for i := range c0.count {
				storeElem(c.recv, c.dt, i, acc[lo+i])
			}
		}
	case "ncclAllGather":
		var all []byte
		for _, c := range calls {
			all = append(all, bytesAt(c.send, nb)...)
		}
		for _, c := range calls {
			copy(bytesAt(c.recv, n*nb), all)
		}
	case "ncclBroadcast":
		src := slices.Clone(bytesAt(calls[c0.root].send, nb))
		for _, c := range calls {
			copy(bytesAt(c.recv, nb), src)
		}
	case "group":
		// Match rank r's k-th send to s with rank s's k-th receive from r.
		type key struct{ from, to int }
		sends := map[key][]fakeP2P{}
		for r, c := range calls {
			for _, p := range c.p2p {
				if p.send {
					sends[key{r, p.peer}] = append(sends[key{r, p.peer}], p)
				}
			}
		}
		var moves [][2][]byte
		for r, c := range calls {
			for _, p := range c.p2p {
				if p.send {
					continue
				}
				k := key{p.peer, r}
				if len(sends[k]) == 0 {
					return fmt.Errorf("fake nccl: rank %d receives from %d, which sends nothing to it", r, p.peer)
				}
				s := sends[k][0]
				sends[k] = sends[k][1:]
				if s.bytes != p.bytes {
					return fmt.Errorf("fake nccl: rank %d sends %d bytes to %d, which receives %d", p.peer, s.bytes, r, p.bytes)
				}
				moves = append(moves, [2][]byte{bytesAt(p.buf, p.bytes), slices.Clone(bytesAt(s.buf, s.bytes))})
			}
		}
		for k, v := range sends {
			if len(v) > 0 {
				return fmt.Errorf("fake nccl: rank %d sends to %d, which does not receive", k.from, k.to)
			}
		}
		for _, m := range moves {
			copy(m[0], m[1])
		}
	default:
		return fmt.Errorf("fake nccl: %s", c0.fn)
	}
	return nil
}

func loadElem(p uintptr, dt ir.DType, i int) (float64, error) {
	switch dt {
	case ir.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(bytesAt(p+uintptr(4*i), 4)))), nil
	case ir.Int32:
		return float64(int32(binary.LittleEndian.Uint32(bytesAt(p+uintptr(4*i), 4)))), nil
	case ir.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(bytesAt(p+uintptr(8*i), 8))), nil
	}
	return 0, fmt.Errorf("fake nccl: reductions of %v", dt)
}

func storeElem(p uintptr, dt ir.DType, i int, v float64) {
	switch dt {
	case ir.Float32:
		binary.LittleEndian.PutUint32(bytesAt(p+uintptr(4*i), 4), math.Float32bits(float32(v)))
	case ir.Int32:
		binary.LittleEndian.PutUint32(bytesAt(p+uintptr(4*i), 4), uint32(int32(v)))
	case ir.Float64:
		binary.LittleEndian.PutUint64(bytesAt(p+uintptr(8*i), 8), math.Float64bits(v))
	}
}
