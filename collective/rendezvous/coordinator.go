package rendezvous

import (
	"bufio"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ferryml/ferry/collective"
)

// rootComm is the id of the communicator over every process of the job;
// Split numbers the others from 1 up.
const rootComm = 1

// coordinator runs in process 0: it accepts the processes, checks that they
// form one job, and completes every collective when each member of its
// communicator has called it, answering each member. Its state is guarded by
// mu; each process's answers are written by that process's outbox.
type coordinator struct {
	n       int
	job     string
	addr    string
	timeout time.Duration // a collective's bound (FERRY_COLLECTIVE_TIMEOUT); 0: none
	join    time.Duration // the connect timeout
	ln      net.Listener  // nil in a job of one

	mu        sync.Mutex
	peers     []*peer // by process id; nil until it joined
	joined    int
	started   bool
	startErr  bool // the join failed
	joinCode  byte // why, for the processes that arrive later
	joinWhy   string
	joinTimer *time.Timer
	groups    map[uint64]*group
	nextID    uint64
	failed    bool
	failCode  byte
	failMsg   string
	active    int           // joined processes that have neither said bye nor gone
	allLeft   chan struct{} // closed when active falls to 0 after the start
	stopped   bool
}

// peer is a joined process.
type peer struct {
	id     int
	remote string
	conn   net.Conn
	br     *bufio.Reader
	out    *outbox
	left   bool // it said bye
	gone   bool // its connection ended
}

// group is a communicator: the process of each rank, and its collectives in
// flight by sequence number.
type group struct {
	members []int
	rounds  map[uint64]*round
}

// round is one collective of a group: the calls that arrived, by rank.
type round struct {
	calls []*call
	count int
	timer *time.Timer
}

func newCoordinator(cfg Config, ln net.Listener, timeout, join time.Duration) *coordinator {
	s := &coordinator{
		n: cfg.NumProcesses, job: cfg.Job, addr: cfg.CoordinatorAddress, timeout: timeout, join: join, ln: ln,
		peers: make([]*peer, cfg.NumProcesses), groups: map[uint64]*group{}, nextID: rootComm + 1,
		allLeft: make(chan struct{}),
	}
	all := make([]int, s.n)
	for i := range all {
		all[i] = i
	}
	s.groups[rootComm] = &group{members: all, rounds: map[uint64]*round{}}
	s.joinTimer = time.AfterFunc(join, s.joinExpired)
	if ln != nil {
		if s.addr == "" {
			s.addr = ln.Addr().String()
		}
		go s.accept()
	}
	return s
}

func (s *coordinator) accept() {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return // the listener was closed
		}
		go s.handshake(conn, conn.RemoteAddr().String())
	}
}

// handshake reads a process's hello and admits it, or refuses it.
func (s *coordinator) handshake(conn net.Conn, remote string) {
	_ = conn.SetReadDeadline(time.Now().Add(s.join))
	br := bufio.NewReader(conn)
	t, body, err := readFrame(br)
	var h *hello
	if err == nil && t == mHello {
		h, err = decodeHello(body)
	}
	if err != nil || t != mHello {
		conn.Close() // not a Ferry process, or it went away: not part of the job
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	if code, why := s.admit(conn, br, h, remote); why != "" {
		refuse(conn, code, why) // outside the lock: the write may be slow
	}
}

// admit adds a process to the job, starting the job when it is the last;
// or it returns why the process is refused.
func (s *coordinator) admit(conn net.Conn, br *bufio.Reader, h *hello, remote string) (code byte, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.startErr:
		return s.joinCode, s.joinWhy
	case s.started || s.stopped:
		return codeJob, fmt.Sprintf("process %d (from %s) arrived after the job's %d processes had joined", h.id, remote, s.n)
	}
	if why := s.check(h, remote); why != "" {
		s.failJoin(codeJob, why)
		return codeJob, why
	}
	p := &peer{id: h.id, remote: remote, conn: conn, br: br, out: newOutbox(conn)}
	s.peers[h.id] = p
	s.joined++
	if s.joined < s.n {
		return 0, ""
	}
	s.started, s.active = true, s.n
	s.joinTimer.Stop()
	for _, p := range s.peers {
		p.out.send(mWelcome, nil)
		go s.serve(p)
	}
	return 0, ""
}

// refuse tells a process it is not admitted, and hangs up.
func refuse(conn net.Conn, code byte, why string) {
	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = writeFrame(conn, mRefused, coded(code, why))
	conn.Close()
}

// check returns why a hello does not belong to this job ("" if it does).
func (s *coordinator) check(h *hello, remote string) string {
	switch {
	case h.version != version:
		return fmt.Sprintf("process %d (from %s) speaks rendezvous protocol version %d, the coordinator version %d: build every process from the same Ferry", h.id, remote, h.version, version)
	case h.count != s.n:
		return fmt.Sprintf("process %d (from %s) was started for a job of %d processes but the coordinator's job has %d: set %s the same in every process", h.id, remote, h.count, s.n, NumProcessesEnv)
	case h.job != s.job:
		return fmt.Sprintf("process %d (from %s) belongs to job %q but the coordinator's job is %q", h.id, remote, h.job, s.job)
	case h.id < 0 || h.id >= s.n:
		return fmt.Sprintf("process id %d (from %s) is out of range for a job of %d processes (%s)", h.id, remote, s.n, ProcessIDEnv)
	case s.peers[h.id] != nil:
		return fmt.Sprintf("process id %d was claimed twice, by %s and by %s: give every process its own %s", h.id, s.peers[h.id].remote, remote, ProcessIDEnv)
	}
	return ""
}

// joinExpired fails the join if some process has not arrived in time.
func (s *coordinator) joinExpired() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.startErr {
		return
	}
	var missing []int
	for q, p := range s.peers {
		if p == nil {
			missing = append(missing, q)
		}
	}
	s.failJoin(codeTimeout, fmt.Sprintf("process(es) %v of %d did not reach the coordinator at %s within %v", missing, s.n, s.addr, s.join))
}

// failJoin refuses every process that joined: the job does not start. The
// listener stays open (see lingerThenStop) to tell the processes that
// arrive later why.
func (s *coordinator) failJoin(code byte, why string) {
	s.startErr, s.joinCode, s.joinWhy = true, code, why
	s.joinTimer.Stop()
	for _, p := range s.peers {
		if p != nil {
			p.out.send(mRefused, coded(code, why))
			p.out.close()
		}
	}
}

// lingerThenStop stops the coordinator of a job that did not start at the
// join's deadline: until then, processes still arriving learn why the job
// did not start instead of finding nobody listening.
func (s *coordinator) lingerThenStop(deadline time.Time) {
	time.AfterFunc(time.Until(deadline), s.stop)
}

// serve reads a joined process's messages until it says bye or its
// connection ends.
func (s *coordinator) serve(p *peer) {
	for {
		t, body, err := readFrame(p.br)
		if err != nil {
			s.lost(p, err)
			return
		}
		switch t {
		case mCall:
			c, err := decodeCall(body)
			if err != nil {
				s.lost(p, fmt.Errorf("a call that does not parse: %v", err))
				return
			}
			s.onCall(p, c)
		case mAbort:
			code, msg, err := decodeCoded(body)
			if err != nil {
				msg = fmt.Sprintf("process %d aborted the job", p.id)
			}
			s.mu.Lock()
			s.fail(code, msg)
			s.mu.Unlock()
		case mBye:
			s.bye(p)
			return
		default:
			s.lost(p, fmt.Errorf("unexpected message %d", t))
			return
		}
	}
}

// lost handles a process whose connection ended without bye: it died.
func (s *coordinator) lost(p *peer, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !p.left && !p.gone {
		s.fail(codeLost, fmt.Sprintf("process %d is gone: its connection to the coordinator ended without Close (%v); it died or exited early", p.id, err))
	}
	s.depart(p)
	p.gone = true
	p.out.close()
}

// bye handles a process that closed its part of the job.
func (s *coordinator) bye(p *peer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.depart(p)
	p.left = true
	p.out.close()
	// A collective that still waits for it never completes.
	for _, g := range s.groups {
		r := slices.Index(g.members, p.id)
		if r < 0 {
			continue
		}
		for _, rd := range g.rounds {
			if rd.calls[r] == nil {
				k, _ := rd.missing(g)
				s.fail(codeLost, fmt.Sprintf("process %d closed its communicator while the others waited for it in %v on the communicator of processes %v", p.id, k, g.members))
				return
			}
		}
	}
}

// depart counts a process out of the active ones.
func (s *coordinator) depart(p *peer) {
	if p.left || p.gone {
		return
	}
	if s.active--; s.active == 0 {
		close(s.allLeft)
	}
}

// fail marks the job failed and tells every process still connected.
func (s *coordinator) fail(code byte, msg string) {
	if s.failed {
		return
	}
	s.failed, s.failCode, s.failMsg = true, code, msg
	for _, g := range s.groups {
		for _, rd := range g.rounds {
			if rd.timer != nil {
				rd.timer.Stop()
			}
		}
	}
	for _, p := range s.peers {
		if p != nil && !p.left && !p.gone {
			p.out.send(mAbort, coded(code, msg))
		}
	}
}

// onCall records one rank's collective, and completes the collective when
// it was the last.
func (s *coordinator) onCall(p *peer, c *call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed {
		p.out.send(mAbort, coded(s.failCode, s.failMsg))
		return
	}
	g := s.groups[c.comm]
	if g == nil || c.rank < 0 || c.rank >= len(g.members) || g.members[c.rank] != p.id {
		s.fail(codeOther, fmt.Sprintf("process %d sent %v as rank %d of communicator %d, which it does not hold (a bug: processes of different builds?)", p.id, c.kind, c.rank, c.comm))
		return
	}
	rd := g.rounds[c.seq]
	if rd == nil {
		rd = &round{calls: make([]*call, len(g.members))}
		g.rounds[c.seq] = rd
		if s.timeout > 0 {
			id, seq := c.comm, c.seq
			rd.timer = time.AfterFunc(s.timeout, func() { s.expire(id, seq) })
		}
	}
	if rd.calls[c.rank] != nil {
		s.fail(codeOther, fmt.Sprintf("process %d sent call %d of communicator %d twice (a bug)", p.id, c.seq, c.comm))
		return
	}
	rd.calls[c.rank] = c
	rd.count++
	for r, q := range g.members {
		if rd.calls[r] == nil && s.peers[q].left {
			s.fail(codeLost, fmt.Sprintf("process %d has closed its communicator, so %v on the communicator of processes %v can never complete", q, c.kind, g.members))
			return
		}
	}
	if rd.count < len(g.members) {
		return
	}
	delete(g.rounds, c.seq)
	if rd.timer != nil {
		rd.timer.Stop()
	}
	for r, rep := range s.result(g, rd.calls) {
		rep.comm, rep.seq = c.comm, c.seq
		s.peers[g.members[r]].out.send(mReply, rep.encode())
	}
}

// missing returns the collective of a round in flight and the processes
// that have not called it.
func (rd *round) missing(g *group) (k kind, procs []int) {
	for r, c := range rd.calls {
		if c == nil {
			procs = append(procs, g.members[r])
		} else {
			k = c.kind
		}
	}
	return k, procs
}

// expire fails the job when a collective is still incomplete after the
// timeout.
func (s *coordinator) expire(id, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[id]
	rd := g.rounds[seq]
	if rd == nil || s.failed {
		return
	}
	k, missing := rd.missing(g)
	s.fail(codeTimeout, fmt.Sprintf("%v on the communicator of processes %v timed out after %v (%s of process 0): process(es) %v did not join it; they are busy elsewhere, hung or dead",
		k, g.members, s.timeout, collective.TimeoutEnv, missing))
}

// result computes every rank's reply to a complete collective.
func (s *coordinator) result(g *group, calls []*call) []*reply {
	n := len(calls)
	out := make([]*reply, n)
	all := func(status byte, msg string) []*reply {
		for r := range out {
			out[r] = &reply{status: status, msg: msg}
		}
		return out
	}
	c0 := calls[0]
	for r, c := range calls {
		if c.kind != c0.kind {
			return all(statusMismatch, fmt.Sprintf("process %d (rank %d) called %v but process %d (rank 0) called %v", g.members[r], r, c.kind, g.members[0], c0.kind))
		}
	}
	for r, c := range calls {
		if c.err != "" {
			return all(statusInvalid, fmt.Sprintf("process %d (rank %d): %s", g.members[r], r, c.err))
		}
	}
	for r, c := range calls {
		if c.dt != c0.dt || c.n != c0.n || c.root != c0.root {
			return all(statusMismatch, fmt.Sprintf("process %d (rank %d) called %s but process %d (rank 0) called %s", g.members[r], r, describe(c), g.members[0], describe(c0)))
		}
	}
	switch c0.kind {
	case kBroadcast:
		data := calls[c0.root].data
		for r := range out {
			out[r] = &reply{data: data}
		}
	case kAllGather:
		data := make([]byte, 0, n*c0.n)
		for _, c := range calls {
			data = append(data, c.data...)
		}
		for r := range out {
			out[r] = &reply{data: data}
		}
	case kSplit:
		s.split(g, calls, out)
	default:
		all(statusOK, "")
	}
	return out
}

// describe names a call and the arguments that must agree.
func describe(c *call) string {
	switch c.kind {
	case kBroadcast:
		return fmt.Sprintf("Broadcast(%v, root %d, %d bytes)", c.dt, c.root, c.n)
	case kAllGather:
		return fmt.Sprintf("AllGather(%v, %d bytes)", c.dt, c.n)
	}
	return c.kind.String()
}

// split makes the new communicators: the ranks of each color ordered by key,
// then by rank.
func (s *coordinator) split(g *group, calls []*call, out []*reply) {
	byColor := map[int][]int{}
	for r, c := range calls {
		if c.color != collective.Undefined {
			byColor[c.color] = append(byColor[c.color], r)
		}
	}
	colors := make([]int, 0, len(byColor))
	for col := range byColor {
		colors = append(colors, col)
	}
	slices.Sort(colors) // new ids in a deterministic order
	for r := range out {
		out[r] = &reply{}
	}
	for _, col := range colors {
		ranks := byColor[col]
		sort.SliceStable(ranks, func(a, b int) bool { return calls[ranks[a]].key < calls[ranks[b]].key })
		members := make([]int, len(ranks))
		for i, r := range ranks {
			members[i] = g.members[r]
		}
		id := s.nextID
		s.nextID++
		s.groups[id] = &group{members: members, rounds: map[uint64]*round{}}
		for i, r := range ranks {
			out[r] = &reply{newComm: id, newRank: i, members: members}
		}
	}
}

// stop closes the listener and every connection, after the answers queued
// for them are written.
func (s *coordinator) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.stopped = true
	s.joinTimer.Stop()
	if s.ln != nil {
		s.ln.Close()
	}
	for _, p := range s.peers {
		if p != nil {
			p.out.close()
		}
	}
}

// outbox writes a connection's messages in order from its own goroutine, so
// that a process slow to read delays no other.
type outbox struct {
	conn    net.Conn
	mu      sync.Mutex
	q       [][]byte
	closing bool
	wake    chan struct{}
}

func newOutbox(conn net.Conn) *outbox {
	o := &outbox{conn: conn, wake: make(chan struct{}, 1)}
	go o.run()
	return o
}

// send queues a message (dropped once the outbox is closing).
func (o *outbox) send(t msgType, body []byte) {
	o.mu.Lock()
	if !o.closing {
		o.q = append(o.q, frame(t, body))
	}
	o.mu.Unlock()
	o.signal()
}

// close writes what is queued, then closes the connection.
func (o *outbox) close() {
	o.mu.Lock()
	o.closing = true
	o.mu.Unlock()
	o.signal()
}

func (o *outbox) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *outbox) run() {
	broken := false
	for {
		o.mu.Lock()
		q, closing := o.q, o.closing
		o.q = nil
		o.mu.Unlock()
		for _, f := range q {
			if !broken {
				if _, err := o.conn.Write(f); err != nil {
					broken = true // the reader of this connection reports it
				}
			}
		}
		if closing && len(q) == 0 {
			o.conn.Close()
			return
		}
		if len(q) == 0 {
			<-o.wake
		}
	}
}
