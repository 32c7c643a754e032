package mpi

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// The liveness connections without MPI: process 0's end and the others' in
// one test process over the loopback. Each test waits for a report on a
// channel; the guard of a minute only keeps a broken monitor from hanging
// the test.

const guard = time.Minute

// reports returns an onLost that passes each loss to the channel.
func reports() (func(error), chan error) {
	ch := make(chan error, 8)
	return func(err error) { ch <- err }, ch
}

func next(t *testing.T, ch chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(guard):
		t.Fatalf("%s was never reported", what)
		return nil
	}
}

// startJob starts process 0's end and n-1 others, each reporting losses on
// its own channel.
func startJob(t *testing.T, n int, silence time.Duration) ([]*monitor, []chan error) {
	t.Helper()
	ms := make([]*monitor, n)
	chs := make([]chan error, n)
	var on func(error)
	on, chs[0] = reports()
	hub, rec, err := listenHub(n, silence, on)
	if err != nil {
		t.Fatal(err)
	}
	ms[0] = hub
	for r := 1; r < n; r++ {
		on, chs[r] = reports()
		if ms[r], err = dialHub(rec, r, n, guard, on); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, m := range ms {
			m.close()
		}
	})
	return ms, chs
}

// kill ends m's connections as a killed process's do: without the bye.
func kill(m *monitor) {
	m.mu.Lock()
	m.closed = true
	var cs []net.Conn
	for _, p := range m.peers {
		if p.conn != nil {
			cs = append(cs, p.conn)
		}
	}
	m.mu.Unlock()
	close(m.stop)
	if m.ln != nil {
		m.ln.Close()
	}
	for _, c := range cs {
		c.Close()
	}
}

func wantLost(t *testing.T, err error, rank, size int) {
	t.Helper()
	want := fmt.Sprintf("process %d of %d (host %s, pid %d) died", rank, size, hostname(), os.Getpid())
	if !errors.Is(err, ErrProcessLost) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want ErrProcessLost naming %q", err, want)
	}
}

// A killed process is named by process 0 with its host and pid at once (no
// heartbeat has to be missed: the silence bound is an hour).
func TestLivenessKilledProcess(t *testing.T) {
	ms, chs := startJob(t, 3, time.Hour)
	kill(ms[2])
	err := next(t, chs[0], "process 2's death")
	wantLost(t, err, 2, 3)
	if !strings.Contains(err.Error(), "without Finalize") {
		t.Fatalf("the loss does not say the connection ended without Finalize: %v", err)
	}
	if got := ms[0].err(); got != err {
		t.Fatalf("the monitor keeps %v, want the first loss %v", got, err)
	}
}

// Process 0's death is seen by every other process.
func TestLivenessKilledHub(t *testing.T) {
	ms, chs := startJob(t, 3, time.Hour)
	kill(ms[0])
	for r := 1; r < 3; r++ {
		wantLost(t, next(t, chs[r], fmt.Sprintf("process 0's death in process %d", r)), 0, 3)
	}
}

// A process that closes (Finalize) says goodbye first and is not lost: the
// first loss after it closed is the one of the process killed afterwards.
func TestLivenessByeIsNotDeath(t *testing.T) {
	ms, chs := startJob(t, 3, time.Hour)
	ms[1].close()
	for {
		ms[0].mu.Lock()
		bye := ms[0].peers[1].bye
		ms[0].mu.Unlock()
		if bye {
			break
		}
		select {
		case err := <-chs[0]:
			t.Fatalf("a process that closed was reported lost: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	kill(ms[2])
	wantLost(t, next(t, chs[0], "process 2's death"), 2, 3)
}

// A process that holds its connection but sends nothing is lost after the
// silence bound, named with the host and pid it gave in its hello.
func TestLivenessSilentProcess(t *testing.T) {
	on, ch := reports()
	hub, rec, err := listenHub(2, 50*time.Millisecond, on)
	if err != nil {
		t.Fatal(err)
	}
	defer hub.close()
	port := strings.Fields(rec)[2]
	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "%s 1 2 4242 elsewhere\n", liveMagic)
	if ok, err := bufio.NewReader(conn).ReadString('\n'); ok != "ok\n" || err != nil {
		t.Fatalf("the handshake answered %q, %v", ok, err)
	}
	err = next(t, ch, "the silent process")
	if !errors.Is(err, ErrProcessLost) || !strings.Contains(err.Error(), "process 1 of 2 (host elsewhere, pid 4242) is silent") {
		t.Fatalf("got %v, want ErrProcessLost naming the silent process 1", err)
	}
}

// A connection that is not a process of the job (another size, a rank out
// of range, not a hello) is refused, and no process is lost for it.
func TestLivenessRefusesStrangers(t *testing.T) {
	ms, chs := startJob(t, 2, time.Hour)
	_, port, _ := net.SplitHostPort(ms[0].ln.Addr().String())
	for _, hello := range []string{"GET / HTTP/1.0\n", liveMagic + " 1 3 1 h\n", liveMagic + " 2 2 1 h\n", liveMagic + " 1 2 1 h\n"} {
		conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(conn, hello)
		if line, err := bufio.NewReader(conn).ReadString('\n'); err == nil {
			t.Fatalf("hello %q was answered %q, want the connection closed", hello, line)
		}
		conn.Close()
	}
	kill(ms[1])
	wantLost(t, next(t, chs[0], "process 1's death"), 1, 2)
}

func TestLiveSettings(t *testing.T) {
	for _, c := range []struct {
		env     string
		timeout time.Duration
		on      bool
		silence time.Duration
		bad     bool
	}{
		{"", 0, true, DefaultSilence, false},
		{"", 5 * time.Minute, true, DefaultSilence, false},
		{"", 20 * time.Second, true, 10 * time.Second, false},
		{"", 2 * time.Second, true, minSilence, false},
		{"off", 0, false, 0, false},
		{"3s", 2 * time.Second, true, 3 * time.Second, false},
		{"-1s", 0, false, 0, true},
		{"soon", 0, false, 0, true},
	} {
		t.Setenv(LivenessEnv, c.env)
		on, silence, err := liveSettings(c.timeout)
		if (err != nil) != c.bad || on != c.on || silence != c.silence {
			t.Errorf("%s=%q, timeout %v: got %v, %v, %v", LivenessEnv, c.env, c.timeout, on, silence, err)
		}
		if err != nil && !strings.Contains(err.Error(), LivenessEnv) {
			t.Errorf("the error does not name %s: %v", LivenessEnv, err)
		}
	}
}

// Process 0 passes a loss on to the others on their connections, ahead of
// its own end: a process that hears of process 2's death and then loses
// process 0 (which exits next) reports process 2.
func TestLivenessLossPassedOn(t *testing.T) {
	ms, chs := startJob(t, 3, time.Hour)
	kill(ms[2])
	wantLost(t, next(t, chs[0], "process 2's death in process 0"), 2, 3)
	kill(ms[0])
	err := next(t, chs[1], "process 2's death in process 1")
	wantLost(t, err, 2, 3)
	if got := ms[1].err(); got != err {
		t.Fatalf("process 1 keeps %v, want its first loss %v", got, err)
	}
}
