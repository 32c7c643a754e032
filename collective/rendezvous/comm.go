package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/internal/bufs"
	"github.com/ferryml/ferry/ir"
)

// Comm is one process's handle on a communicator of the rendezvous: the
// job's processes (from Join) or a group split from them. It implements
// [collective.Communicator] for what a bootstrap needs — Barrier, Broadcast
// and flat AllGather of small buffers (at most MaxBytes a rank), Split,
// Abort and Close — and refuses the collectives that move array data with
// [ErrDataCollective] (see the package documentation).
type Comm struct {
	j      *job
	id     uint64
	rank   int
	procs  []int // the process of each rank
	seq    uint64
	root   bool // made by Join: closing it ends the process's part of the job
	busy   atomic.Bool
	closed atomic.Bool
}

var _ collective.Communicator = (*Comm)(nil)

// job is a process's connection to the coordinator, shared by every
// communicator of the job; its failure (abort) is the job's.
type job struct {
	conn    net.Conn
	br      *bufio.Reader
	wmu     sync.Mutex // serializes writes
	proc    int
	addr    string
	timeout time.Duration
	coord   *coordinator // process 0's coordinator, else nil

	mu         sync.Mutex
	pending    map[[2]uint64]chan *reply
	cause      error
	done       chan struct{} // closed when cause is set
	closing    bool
	readerDone chan struct{}
}

// Join makes this process one of a job of cfg.NumProcesses processes and
// returns the communicator over all of them (rank = cfg.ProcessID). Every
// process of the job calls it: process 0 starts the coordinator on
// cfg.CoordinatorAddress, the others connect to it, retrying until
// cfg.ConnectTimeout. Join returns when every process has joined, or with
// an error when the processes do not form one job ([ErrJob]: another
// process count or job name, an id out of range or claimed twice), or when
// they have not all joined within the connect timeout or ctx's deadline
// ([ErrTimeout]); a join that fails fails in every process that reached the
// coordinator. FERRY_COLLECTIVE_TIMEOUT bounds each later collective (see
// [collective.TimeoutEnv]).
func Join(ctx context.Context, cfg Config) (*Comm, error) {
	if err := cfg.Validate(); err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	timeout, err := collective.TimeoutFromEnv()
	if err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	join := cfg.ConnectTimeout
	if join == 0 {
		join = DefaultConnectTimeout
	}
	deadline := time.Now().Add(join)
	j := &job{
		proc: cfg.ProcessID, addr: cfg.CoordinatorAddress, timeout: timeout,
		pending: map[[2]uint64]chan *reply{}, done: make(chan struct{}), readerDone: make(chan struct{}),
	}
	if cfg.ProcessID == 0 {
		ln := cfg.Listener
		if ln == nil && cfg.NumProcesses > 1 {
			la, err := listenAddress(cfg.CoordinatorAddress)
			if err != nil {
				return nil, err
			}
			if ln, err = net.Listen("tcp", la); err != nil {
				return nil, fmt.Errorf("rendezvous: process 0 cannot run the coordinator on %s (%s): %v", cfg.CoordinatorAddress, AddressEnv, err)
			}
		}
		if ln != nil && j.addr == "" {
			j.addr = ln.Addr().String()
		}
		j.coord = newCoordinator(cfg, ln, timeout, join)
		srv, cli := net.Pipe()
		go j.coord.handshake(srv, "process 0 itself")
		j.conn = cli
	} else if j.conn, err = dial(ctx, cfg, join, deadline); err != nil {
		return nil, err
	}
	j.br = bufio.NewReader(j.conn)
	if err := j.hello(ctx, cfg, join); err != nil {
		j.conn.Close()
		if j.coord != nil {
			j.coord.lingerThenStop(deadline)
		}
		return nil, err
	}
	go j.read()
	procs := make([]int, cfg.NumProcesses)
	for i := range procs {
		procs[i] = i
	}
	return &Comm{j: j, id: rootComm, rank: cfg.ProcessID, procs: procs, root: true}, nil
}

// dial connects to the coordinator, retrying until the deadline.
func dial(ctx context.Context, cfg Config, join time.Duration, deadline time.Time) (net.Conn, error) {
	wait := 20 * time.Millisecond
	var d net.Dialer
	for {
		actx, cancel := context.WithDeadline(ctx, minTime(deadline, time.Now().Add(10*time.Second)))
		conn, err := d.DialContext(actx, "tcp", cfg.CoordinatorAddress)
		cancel()
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rendezvous: process %d connecting to the coordinator at %s: %w (last attempt: %v)", cfg.ProcessID, cfg.CoordinatorAddress, ctx.Err(), err)
		}
		if time.Now().Add(wait).After(deadline) {
			return nil, fmt.Errorf("%w: process %d could not connect to the coordinator at %s within %v (is process 0 running, and is %s its address?): %v",
				ErrTimeout, cfg.ProcessID, cfg.CoordinatorAddress, join, AddressEnv, err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		wait = min(2*wait, time.Second)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// hello introduces this process and waits until the coordinator has
// admitted every process (or refused the job). The coordinator gives up at
// its own connect timeout, which began before this process connected, so
// its answer comes first; this process's wait is the backstop.
func (j *job) hello(ctx context.Context, cfg Config, join time.Duration) error {
	stop := context.AfterFunc(ctx, func() { _ = j.conn.SetDeadline(time.Now()) })
	defer stop()
	_ = j.conn.SetDeadline(time.Now().Add(join + 2*time.Second))
	defer j.conn.SetDeadline(time.Time{})
	h := hello{version: version, count: cfg.NumProcesses, id: cfg.ProcessID, job: cfg.Job}
	err := writeFrame(j.conn, mHello, h.encode())
	var t msgType
	var body []byte
	if err == nil {
		t, body, err = readFrame(j.br)
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("rendezvous: process %d joining the job at %s: %w", j.proc, j.addr, ctx.Err())
	case isTimeout(err):
		return fmt.Errorf("%w: process %d reached the coordinator at %s but the job did not start within %v", ErrTimeout, j.proc, j.addr, join)
	case err != nil:
		return fmt.Errorf("%w: process %d: the coordinator at %s hung up during the join (%v): is it a Ferry coordinator of the same version?", ErrJob, j.proc, j.addr, err)
	case t == mWelcome:
		return nil
	case t == mRefused:
		code, msg, err := decodeCoded(body)
		if err != nil {
			msg = "(an answer that does not parse)"
		}
		return fmt.Errorf("process %d: the job did not start: %w", j.proc, codedError(code, msg))
	}
	return fmt.Errorf("%w: process %d: the coordinator at %s answered the join with message %d", ErrJob, j.proc, j.addr, t)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// codedError is the error of a refused or abort message: its text, wrapping
// the code's sentinel.
func codedError(code byte, msg string) error {
	switch code {
	case codeJob:
		return fmt.Errorf("%w: %s", ErrJob, msg)
	case codeTimeout:
		return fmt.Errorf("%w: %s", ErrTimeout, msg)
	case codeLost:
		return fmt.Errorf("%w: %s", ErrProcessLost, msg)
	}
	return errors.New(msg)
}

// read delivers the coordinator's messages until the connection ends.
func (j *job) read() {
	defer close(j.readerDone)
	for {
		t, body, err := readFrame(j.br)
		if err != nil {
			j.mu.Lock()
			closing := j.closing
			j.mu.Unlock()
			if !closing {
				j.abort(codeLost, fmt.Sprintf("process %d lost the coordinator (process 0 at %s): %v; process 0 died or ended the job", j.proc, j.addr, err), false)
			}
			return
		}
		switch t {
		case mReply:
			r, err := decodeReply(body)
			if err != nil {
				j.abort(codeOther, fmt.Sprintf("process %d: a reply from the coordinator does not parse: %v", j.proc, err), false)
				continue
			}
			j.mu.Lock()
			ch := j.pending[[2]uint64{r.comm, r.seq}]
			delete(j.pending, [2]uint64{r.comm, r.seq})
			j.mu.Unlock()
			if ch != nil {
				ch <- r
			}
		case mAbort:
			code, msg, err := decodeCoded(body)
			if err != nil {
				msg = "the coordinator aborted the job"
			}
			j.abort(code, msg, false)
		default:
			j.abort(codeOther, fmt.Sprintf("process %d: unexpected message %d from the coordinator", j.proc, t), false)
		}
	}
}

// abort fails the job in this process; with tell, the coordinator passes the
// reason on to every other process.
func (j *job) abort(code byte, msg string, tell bool) {
	j.mu.Lock()
	if j.cause != nil {
		j.mu.Unlock()
		return
	}
	j.cause = codedError(code, msg)
	close(j.done)
	j.mu.Unlock()
	if tell {
		_ = j.write(mAbort, coded(code, msg))
	}
}

// failed returns the job's failure, nil while it runs.
func (j *job) failed() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.cause
}

// write sends one message to the coordinator.
func (j *job) write(t msgType, body []byte) error {
	j.wmu.Lock()
	defer j.wmu.Unlock()
	if j.timeout > 0 {
		_ = j.conn.SetWriteDeadline(time.Now().Add(max(j.timeout, 10*time.Second)))
	}
	return writeFrame(j.conn, t, body)
}

// close ends this process's part of the job: it says bye, and process 0
// keeps the coordinator running until every other process has left too.
func (j *job) close() error {
	j.mu.Lock()
	j.closing = true
	failed := j.cause != nil
	j.mu.Unlock()
	if err := j.write(mBye, nil); err == nil {
		// The coordinator hangs up once it has read the bye.
		select {
		case <-j.readerDone:
		case <-time.After(10 * time.Second):
		}
	}
	j.conn.Close()
	<-j.readerDone
	// Calls still waiting on communicators split from this one end now.
	j.abort(codeOther, fmt.Sprintf("process %d closed its communicator of the job", j.proc), false)
	if j.coord != nil {
		if !failed {
			var limit <-chan time.Time
			if j.timeout > 0 {
				t := time.NewTimer(j.timeout)
				defer t.Stop()
				limit = t.C
			}
			select {
			case <-j.coord.allLeft:
			case <-limit:
			}
		}
		j.coord.stop()
	}
	return nil
}

// Rank is this process's rank in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of processes of the communicator.
func (c *Comm) Size() int { return len(c.procs) }

// Process returns the job's process id of rank r (for Join's communicator,
// r itself).
func (c *Comm) Process(r int) int { return c.procs[r] }

// Timeout is the bound on each collective's wait (0: none), read from
// FERRY_COLLECTIVE_TIMEOUT by Join.
func (c *Comm) Timeout() time.Duration { return c.j.timeout }

// Barrier implements [collective.Communicator.Barrier].
func (c *Comm) Barrier(ctx context.Context) error {
	_, err := c.call(ctx, kBarrier, &call{})
	return err
}

// Broadcast implements [collective.Communicator.Broadcast] for buffers of
// at most MaxBytes (larger ones: [ErrDataCollective]).
func (c *Comm) Broadcast(ctx context.Context, dt ir.DType, root int, buf []byte) error {
	if len(buf) > MaxBytes {
		return c.noData("Broadcast", fmt.Sprintf("a buffer of %d bytes (at most %d)", len(buf), MaxBytes))
	}
	cl := &call{dt: dt, root: root, n: len(buf)}
	switch err := checkBuf("buf", dt, buf); {
	case err != nil:
		cl.err = err.Error()
	case root < 0 || root >= c.Size():
		cl.err = fmt.Sprintf("root %d is out of range for %d ranks", root, c.Size())
	case root == c.rank:
		cl.data = buf
	}
	r, err := c.call(ctx, kBroadcast, cl)
	if err != nil {
		return err
	}
	if root != c.rank {
		copy(buf, r.data)
	}
	return nil
}

// AllGather implements [collective.Communicator.AllGather] for flat buffers
// (a nil shape) of at most MaxBytes per rank (others: [ErrDataCollective]).
func (c *Comm) AllGather(ctx context.Context, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	switch {
	case shape != nil:
		return c.noData("AllGather", fmt.Sprintf("an array of shape %v (only flat buffers, a nil shape)", shape))
	case len(send) > MaxBytes:
		return c.noData("AllGather", fmt.Sprintf("%d bytes a rank (at most %d)", len(send), MaxBytes))
	}
	cl := &call{dt: dt, n: len(send), data: send}
	err := checkBuf("send", dt, send)
	if err == nil {
		err = checkBuf("recv", dt, recv)
	}
	if err == nil && len(recv) != c.Size()*len(send) {
		err = fmt.Errorf("recv has %d bytes, want %d (%d ranks × %d)", len(recv), c.Size()*len(send), c.Size(), len(send))
	}
	if err == nil {
		err = bufs.CheckDisjoint(send, recv)
	}
	if err != nil {
		cl.err, cl.data = err.Error(), nil
	}
	r, err := c.call(ctx, kAllGather, cl)
	if err != nil {
		return err
	}
	copy(recv, r.data)
	return nil
}

// checkBuf checks dt and that b holds whole elements of it. The bytes are
// only copied, so unlike other engines the rendezvous needs no alignment.
func checkBuf(name string, dt ir.DType, b []byte) error {
	if !dt.Valid() {
		return fmt.Errorf("invalid dtype %v", dt)
	}
	if len(b)%dt.Size() != 0 {
		return fmt.Errorf("%s has %d bytes, not a whole number of %v elements", name, len(b), dt)
	}
	return nil
}

// Split implements [collective.Communicator.Split]; the coordinator forms
// the groups. The new communicator shares the job's abort state.
func (c *Comm) Split(ctx context.Context, color, key int) (collective.Communicator, error) {
	cl := &call{color: color, key: key}
	if color < collective.Undefined {
		cl.err = fmt.Sprintf("color %d is negative (want a color ≥ 0, or collective.Undefined)", color)
	}
	r, err := c.call(ctx, kSplit, cl)
	if err != nil {
		return nil, err
	}
	if r.newComm == 0 {
		return nil, nil
	}
	return &Comm{j: c.j, id: r.newComm, rank: r.newRank, procs: r.members}, nil
}

// AllReduce returns an error wrapping [ErrDataCollective] and
// [collective.ErrInvalid] at once, on every rank, without communicating.
func (c *Comm) AllReduce(ctx context.Context, op collective.Op, dt ir.DType, send, recv []byte) error {
	return c.noData("AllReduce", "")
}

// ReduceScatter returns an error wrapping [ErrDataCollective] and
// [collective.ErrInvalid] at once, on every rank, without communicating.
func (c *Comm) ReduceScatter(ctx context.Context, op collective.Op, dt ir.DType, shape []int, axis int, send, recv []byte) error {
	return c.noData("ReduceScatter", "")
}

// AllToAll returns an error wrapping [ErrDataCollective] and
// [collective.ErrInvalid] at once, on every rank, without communicating.
func (c *Comm) AllToAll(ctx context.Context, dt ir.DType, shape []int, splitAxis, concatAxis int, send, recv []byte) error {
	return c.noData("AllToAll", "")
}

// CollectivePermute returns an error wrapping [ErrDataCollective] and
// [collective.ErrInvalid] at once, on every rank, without communicating.
func (c *Comm) CollectivePermute(ctx context.Context, dt ir.DType, pairs []collective.Pair, send, recv []byte) error {
	return c.noData("CollectivePermute", "")
}

// noData is the error of a collective the rendezvous does not carry.
func (c *Comm) noData(name, what string) error {
	if what != "" {
		what = " of " + what
	}
	return fmt.Errorf("%w: %w: %s%s on process %d (rank %d of %d)", collective.ErrInvalid, ErrDataCollective, name, what, c.j.proc, c.rank, c.Size())
}

// Abort fails the job: every pending and later call of every communicator
// of the job, in every process, returns an error wrapping
// [collective.ErrAborted] and naming this process and err.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = errors.New("Abort called")
	}
	c.j.abort(codeOther, fmt.Sprintf("process %d aborted the job: %v", c.j.proc, err), true)
}

// Close releases the communicator. Closing the communicator Join returned
// ends this process's part of the job (every communicator of the job in
// this process is closed with it); in process 0, which runs the
// coordinator, it then waits until every other process has closed too (or
// died, or FERRY_COLLECTIVE_TIMEOUT passed).
func (c *Comm) Close() error {
	if !c.closed.CompareAndSwap(false, true) || !c.root {
		return nil
	}
	return c.j.close()
}

// call runs one collective through the coordinator and returns this rank's
// reply.
func (c *Comm) call(ctx context.Context, k kind, cl *call) (*reply, error) {
	if !c.busy.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("rendezvous: %v on process %d: the communicator is already in a call on another goroutine", k, c.j.proc)
	}
	defer c.busy.Store(false)
	j := c.j
	j.mu.Lock()
	closing, cause := j.closing, j.cause
	j.mu.Unlock()
	switch {
	case c.closed.Load() || closing:
		return nil, fmt.Errorf("%w: rendezvous: %v on process %d", collective.ErrClosed, k, j.proc)
	case cause != nil:
		return nil, c.aborted(k, cause)
	case ctx.Err() != nil:
		return nil, c.giveUp(k, ctx.Err())
	}
	c.seq++
	cl.comm, cl.seq, cl.rank, cl.kind = c.id, c.seq, c.rank, k
	key := [2]uint64{c.id, c.seq}
	ch := make(chan *reply, 1)
	j.mu.Lock()
	j.pending[key] = ch
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		delete(j.pending, key)
		j.mu.Unlock()
	}()
	if err := j.write(mCall, cl.encode()); err != nil {
		j.abort(codeLost, fmt.Sprintf("process %d could not reach the coordinator (process 0 at %s): %v", j.proc, j.addr, err), false)
		return nil, c.aborted(k, j.failed())
	}
	// The coordinator times the collective out itself, naming who is
	// missing; this bound only catches a coordinator that stopped answering.
	var expire <-chan time.Time
	if j.timeout > 0 {
		t := time.NewTimer(j.timeout + j.timeout/4 + 2*time.Second)
		defer t.Stop()
		expire = t.C
	}
	select {
	case r := <-ch:
		switch r.status {
		case statusMismatch:
			return nil, fmt.Errorf("%w: rendezvous: %v on process %d (rank %d of %d): %s", collective.ErrMismatch, k, j.proc, c.rank, c.Size(), r.msg)
		case statusInvalid:
			return nil, fmt.Errorf("%w: rendezvous: %v on process %d (rank %d of %d): %s", collective.ErrInvalid, k, j.proc, c.rank, c.Size(), r.msg)
		}
		return r, nil
	case <-j.done:
		return nil, c.aborted(k, j.failed())
	case <-ctx.Done():
		return nil, c.giveUp(k, ctx.Err())
	case <-expire:
		j.abort(codeTimeout, fmt.Sprintf("process %d waited in %v for %v (%s) without an answer from the coordinator (process 0 at %s): process 0 is hung or the network is down",
			j.proc, k, j.timeout+j.timeout/4+2*time.Second, collective.TimeoutEnv, j.addr), true)
		return nil, c.aborted(k, j.failed())
	}
}

// aborted is the error of a call on a failed job.
func (c *Comm) aborted(k kind, cause error) error {
	return fmt.Errorf("%w: rendezvous: %v on process %d (rank %d of %d) failed: %w", collective.ErrAborted, k, c.j.proc, c.rank, c.Size(), cause)
}

// giveUp fails the job because this process stopped waiting.
func (c *Comm) giveUp(k kind, err error) error {
	c.j.abort(codeOther, fmt.Sprintf("process %d gave up in %v: %v", c.j.proc, k, err), true)
	return fmt.Errorf("%w: rendezvous: process %d gave up in %v (rank %d of %d): %w", collective.ErrAborted, c.j.proc, k, c.rank, c.Size(), err)
}
