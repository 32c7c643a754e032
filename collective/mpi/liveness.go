package mpi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	table "github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// LivenessEnv names the environment variable that sets how the processes of
// a job watch each other for death, read by the first World of each process
// (process 0's setting decides for the job):
//
//   - unset: every process keeps a TCP connection to process 0 with a
//     heartbeat; a process killed or crashed is named at once (its
//     connection ends without Finalize), one that stays silent for
//     DefaultSilence (at most half of FERRY_COLLECTIVE_TIMEOUT, at least 5
//     s: a host down, a network cut) soon after.
//   - a Go duration ("20s"): the same, with that silence bound.
//   - "off": no connections; a dead process is found only by the
//     collective timeout.
const LivenessEnv = "FERRY_MPI_LIVENESS"

// DefaultSilence is the longest a process may stay silent on its liveness
// connection before it is declared lost, when LivenessEnv is unset and
// FERRY_COLLECTIVE_TIMEOUT is off or at least twice as long.
const DefaultSilence = 30 * time.Second

// minSilence is the shortest default silence bound, whatever the collective
// timeout: a loaded machine must not make a live process look dead.
const minSilence = 5 * time.Second

// ErrProcessLost is wrapped (beside collective.ErrAborted) by the errors of
// every pending and later collective of every World once a process of the
// job died or went silent on its liveness connection; the message names its
// rank in MPI_COMM_WORLD, its host and its pid (see LivenessEnv).
var ErrProcessLost = errors.New("mpi: a process of the job is gone")

// liveSettings reads LivenessEnv: whether the connections are kept, and the
// silence bound.
func liveSettings(timeout time.Duration) (on bool, silence time.Duration, err error) {
	d, set, err := table.MPILiveness.Lookup()
	switch {
	case err != nil:
		return false, 0, fmt.Errorf("mpi: %w", err)
	case !set:
		silence = DefaultSilence
		if timeout > 0 {
			silence = min(silence, max(timeout/2, minSilence))
		}
		return true, silence, nil
	case d == 0:
		return false, 0, nil
	}
	return true, d, nil
}

// monitor is this process's liveness side channel: in process 0 (the hub)
// a TCP connection from every other process; in the others the connection
// to process 0. Both ends send a heartbeat byte every silence/5 and a bye
// byte on Finalize; a connection that ends without the bye, or stays silent
// for longer than silence, loses its process: onLost is called once with an
// error wrapping ErrProcessLost. Process 0 sends its losses to the others
// on their connections.
type monitor struct {
	rank, size int
	silence    time.Duration
	onLost     func(error)

	mu     sync.Mutex
	peers  []livePeer // by rank: process 0's only, in the other processes
	closed bool
	lost   error
	ln     net.Listener
	stop   chan struct{}
}

// livePeer is a process at the other end of a liveness connection.
type livePeer struct {
	host string
	pid  int
	conn net.Conn
	bye  bool // it said goodbye (Finalize)
}

const (
	liveMagic = "ferry-mpi-liveness/1"
	beatByte  = 'h'
	byeByte   = 'b'
	// lostByte starts process 0's notice to the others that it lost a
	// process: the error's text follows, up to a newline. Sent on the
	// connection, it arrives before the end of the connection should
	// process 0 exit next.
	lostByte = 'L'
	// liveRecord is the size of process 0's broadcast record: its silence
	// bound, port, host, pid and addresses.
	liveRecord = 1024
)

func newMonitor(rank, size int, silence time.Duration, onLost func(error)) *monitor {
	return &monitor{rank: rank, size: size, silence: silence, onLost: onLost,
		peers: make([]livePeer, size), stop: make(chan struct{})}
}

// hostname is this machine's name, or "?" when it has none.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" || strings.ContainsAny(h, " \n") {
		return "?"
	}
	return h
}

// listenHub starts process 0's end: it listens on every interface and
// returns the record the other processes dial with.
func listenHub(size int, silence time.Duration, onLost func(error)) (*monitor, string, error) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return nil, "", fmt.Errorf("mpi: liveness: listening: %w", err)
	}
	m := newMonitor(0, size, silence, onLost)
	m.ln = ln
	m.peers[0] = livePeer{host: hostname(), pid: os.Getpid()}
	port := ln.Addr().(*net.TCPAddr).Port
	rec := fmt.Sprintf("%s %d %d %s %d", liveMagic, int64(silence), port, m.peers[0].host, m.peers[0].pid)
	for _, ip := range hostIPs() {
		if len(rec)+1+len(ip) >= liveRecord {
			break
		}
		rec += " " + ip
	}
	go m.accept()
	go m.beat()
	return m, rec, nil
}

// hostIPs lists this machine's addresses other processes may dial: IPv4
// first, without loopback and link-local ones.
func hostIPs() []string {
	addrs, _ := net.InterfaceAddrs()
	var v4, v6 []string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.IsLoopback() || n.IP.IsLinkLocalUnicast() || n.IP.IsMulticast() {
			continue
		}
		if n.IP.To4() != nil {
			v4 = append(v4, n.IP.String())
		} else {
			v6 = append(v6, n.IP.String())
		}
	}
	return append(v4, v6...)
}

// accept admits the other processes' connections: each says hello with its
// rank, pid and host, and is answered "ok" once it is watched.
func (m *monitor) accept() {
	for {
		conn, err := m.ln.Accept()
		if err != nil {
			return // closed
		}
		go func() {
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			line, err := br.ReadString('\n')
			f := strings.Fields(line)
			var r, size, pid int
			if err == nil && len(f) == 5 && f[0] == liveMagic {
				r, err = strconv.Atoi(f[1])
				if err == nil {
					size, err = strconv.Atoi(f[2])
				}
				if err == nil {
					pid, err = strconv.Atoi(f[3])
				}
			} else if err == nil {
				err = errors.New("not a liveness hello")
			}
			m.mu.Lock()
			ok := err == nil && size == m.size && r > 0 && r < m.size && m.peers[r].conn == nil && !m.closed
			if ok {
				m.peers[r] = livePeer{host: f[4], pid: pid, conn: conn}
			}
			m.mu.Unlock()
			if !ok {
				conn.Close() // not one of the job's processes
				return
			}
			_ = conn.SetWriteDeadline(time.Now().Add(m.silence))
			if _, err := conn.Write([]byte("ok\n")); err != nil {
				m.lose(r, fmt.Sprintf("died: its liveness connection failed during the handshake (%v)", err))
				return
			}
			m.watch(r, conn, br)
		}()
	}
}

// dialHub starts the end of process rank (not 0): it dials process 0 at one
// of the addresses of rec (the loopback first when both run on this host)
// within wait, says hello and waits for the answer.
func dialHub(rec string, rank, size int, wait time.Duration, onLost func(error)) (*monitor, error) {
	f := strings.Fields(rec)
	if len(f) < 5 || f[0] != liveMagic {
		return nil, fmt.Errorf("mpi: liveness: process 0 sent %q, not a liveness record", rec)
	}
	silence, err1 := strconv.ParseInt(f[1], 10, 64)
	port, err2 := strconv.Atoi(f[2])
	pid, err3 := strconv.Atoi(f[4])
	if err := errors.Join(err1, err2, err3); err != nil || silence <= 0 {
		return nil, fmt.Errorf("mpi: liveness: process 0 sent %q, not a liveness record", rec)
	}
	host, me := f[3], hostname()
	ips := f[5:]
	if host == me {
		ips = append([]string{"127.0.0.1", "::1"}, ips...)
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("mpi: liveness: process 0 (host %s) has no address to dial", host)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	type dialed struct {
		conn net.Conn
		err  error
	}
	res := make(chan dialed, len(ips))
	for _, ip := range ips {
		go func() {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			res <- dialed{c, err}
		}()
	}
	var conn net.Conn
	var errs []error
	for range ips {
		d := <-res
		if d.err != nil {
			errs = append(errs, d.err)
			continue
		}
		if conn == nil {
			conn = d.conn
			cancel()
		} else {
			d.conn.Close()
		}
	}
	if conn == nil {
		return nil, fmt.Errorf("mpi: liveness: process %d cannot reach process 0 (host %s, port %d): %w", rank, host, port, errors.Join(errs...))
	}
	_ = conn.SetDeadline(time.Now().Add(wait))
	br := bufio.NewReader(conn)
	_, err := fmt.Fprintf(conn, "%s %d %d %d %s\n", liveMagic, rank, size, os.Getpid(), me)
	var ok string
	if err == nil {
		ok, err = br.ReadString('\n')
	}
	if err == nil && ok != "ok\n" {
		err = errors.New("refused")
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("mpi: liveness: process %d: the handshake with process 0 (host %s, port %d) failed: %w", rank, host, port, err)
	}
	_ = conn.SetDeadline(time.Time{})
	m := newMonitor(rank, size, time.Duration(silence), onLost)
	m.peers[0] = livePeer{host: host, pid: pid, conn: conn}
	go m.watch(0, conn, br)
	go m.beat()
	return m, nil
}

// watch reads process r's heartbeats until its bye, the end of the
// connection, or a silence longer than m.silence (the last two lose it).
// From process 0 it also reads the notices of the processes it lost.
func (m *monitor) watch(r int, conn net.Conn, br *bufio.Reader) {
	for {
		_ = conn.SetReadDeadline(time.Now().Add(m.silence))
		b, err := br.ReadByte()
		if err == nil && b == byeByte {
			m.mu.Lock()
			m.peers[r].bye = true
			m.mu.Unlock()
			return
		}
		if err == nil && b == lostByte {
			var msg string
			if msg, err = br.ReadString('\n'); err == nil {
				m.report(&remoteAbort{msg: strings.TrimSuffix(msg, "\n"), lost: true})
			}
		}
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			m.lose(r, fmt.Sprintf("is silent: no heartbeat on its liveness connection for %v (its host down, the network cut, or the process stopped)", m.silence))
		} else {
			m.lose(r, fmt.Sprintf("died: its liveness connection to process %d ended without Finalize (%v)", m.rank, err))
		}
		return
	}
}

// lose declares process r lost, unless it said goodbye or this process is
// closing; the first loss is kept and given to onLost.
func (m *monitor) lose(r int, why string) {
	m.mu.Lock()
	p := m.peers[r]
	if m.closed || p.bye || m.lost != nil {
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	m.report(fmt.Errorf("%w: process %d of %d (host %s, pid %d) %s", ErrProcessLost, r, m.size, p.host, p.pid, why))
}

// report keeps err as the first loss (unless this process is closing or
// has one), passes it on to the other processes when this is process 0,
// then gives it to onLost.
func (m *monitor) report(err error) {
	m.mu.Lock()
	if m.closed || m.lost != nil {
		m.mu.Unlock()
		return
	}
	m.lost = err
	var cs []net.Conn
	if m.rank == 0 {
		for _, p := range m.peers {
			if p.conn != nil && !p.bye {
				cs = append(cs, p.conn)
			}
		}
	}
	m.mu.Unlock()
	notice := append([]byte{lostByte}, strings.ReplaceAll(err.Error(), "\n", " ")+"\n"...)
	for _, c := range cs {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(notice)
	}
	if m.onLost != nil {
		m.onLost(err)
	}
}

// err is the first loss, or nil.
func (m *monitor) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost
}

// conns are the open liveness connections.
func (m *monitor) conns() []net.Conn {
	m.mu.Lock()
	defer m.mu.Unlock()
	var cs []net.Conn
	for _, p := range m.peers {
		if p.conn != nil && !p.bye {
			cs = append(cs, p.conn)
		}
	}
	return cs
}

// beat sends a heartbeat on every connection every silence/5.
func (m *monitor) beat() {
	t := time.NewTicker(m.silence / 5)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		for _, c := range m.conns() {
			_ = c.SetWriteDeadline(time.Now().Add(m.silence))
			_, _ = c.Write([]byte{beatByte})
		}
	}
}

// close says goodbye on every connection and closes them (Finalize).
func (m *monitor) close() {
	cs := m.conns()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	if m.ln != nil {
		m.ln.Close()
	}
	for _, c := range cs {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write([]byte{byeByte})
		c.Close()
	}
}

// The process's monitor, started by its first World.
var (
	liveMu      sync.Mutex
	liveStarted bool
	live        *monitor
	liveErr     error
)

// startLiveness starts the process's monitor over c, a communicator over
// every process, the first time World is called: process 0 listens and
// broadcasts its record, the others dial it, and an all-gather tells every
// process whether every connection was made (else every process returns
// the same error, naming the processes that failed). Later calls return the
// first one's error.
func startLiveness(c *Comm) error {
	liveMu.Lock()
	defer liveMu.Unlock()
	if liveStarted {
		return liveErr
	}
	liveStarted = true
	liveErr = setUpLiveness(c)
	return liveErr
}

func setUpLiveness(c *Comm) error {
	if c.size == 1 {
		return nil
	}
	ctx := context.Background()
	buf := alloc(liveRecord)
	var m *monitor
	var mine error
	if c.rank == 0 {
		on, silence, err := liveSettings(c.timeout)
		switch {
		case err != nil:
			mine = err
			copy(buf, "error")
		case !on:
			copy(buf, "off")
		default:
			var rec string
			if m, rec, mine = listenHub(c.size, silence, processLost); mine == nil {
				copy(buf, rec)
			} else {
				copy(buf, "error")
			}
		}
	}
	if err := c.Broadcast(ctx, ir.Uint8, 0, buf); err != nil {
		return fmt.Errorf("mpi: World: sharing the liveness address: %w", err)
	}
	rec := string(buf[:max(0, strings.IndexByte(string(buf), 0))])
	if rec == "off" {
		return nil
	}
	if c.rank != 0 && rec != "error" {
		wait := 10 * time.Second
		if c.timeout > 0 {
			wait = min(wait, max(c.timeout/2, time.Second))
		}
		m, mine = dialHub(rec, c.rank, c.size, wait, processLost)
	} else if c.rank != 0 {
		mine = errors.New("process 0 could not listen")
	}
	flags := alloc(4 * c.size)
	flag := alloc(4)
	if mine == nil {
		flag[0] = 1
	}
	if err := c.AllGather(ctx, ir.Int32, []int{1}, 0, flag, flags); err != nil {
		if m != nil {
			m.close()
		}
		return fmt.Errorf("mpi: World: agreeing on the liveness connections: %w", err)
	}
	var failed []int
	for r := range c.size {
		if flags[4*r] == 0 {
			failed = append(failed, r)
		}
	}
	if len(failed) > 0 {
		if m != nil {
			m.close()
		}
		err := fmt.Errorf("mpi: World: process(es) %v of %d could not open the liveness connection to process 0 (each process keeps one so that a dead process is named at once); open the way to process 0 over TCP, or set %s=off", failed, c.size, LivenessEnv)
		if mine != nil {
			err = fmt.Errorf("%w: here: %w", err, mine)
		}
		return err
	}
	live = m
	return nil
}

// processLost fails every World of this process (telling the other
// processes) when the monitor loses a process.
func processLost(err error) {
	worldsMu.Lock()
	ws := slices.Clone(worlds)
	worldsMu.Unlock()
	for _, w := range ws {
		w.abort(err, true)
	}
}

// liveLoss is the process's first loss, or nil.
func liveLoss() error {
	liveMu.Lock()
	m := live
	liveMu.Unlock()
	if m == nil {
		return nil
	}
	return m.err()
}

// closeLiveness says goodbye to the other processes (Finalize).
func closeLiveness() {
	liveMu.Lock()
	m := live
	live = nil
	liveMu.Unlock()
	if m != nil {
		m.close()
	}
}

// remoteAbort is an abort message from another process; lost tells that it
// reports a lost process (ErrProcessLost).
type remoteAbort struct {
	msg  string
	lost bool
}

func (e *remoteAbort) Error() string { return e.msg }

func (e *remoteAbort) Is(target error) bool { return e.lost && target == ErrProcessLost }

// lostMark starts the abort messages that report a lost process.
const lostMark = '\x01'
