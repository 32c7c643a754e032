package rendezvous_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/rendezvous"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// childEnv makes the test binary one process of a job (see child) instead
// of running the tests.
const childEnv = "FERRY_RENDEZVOUS_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := settings.RendezvousTestChild.Get(); role != "" {
		os.Exit(child(role))
	}
	os.Exit(m.Run())
}

// child is a process of a job started by startChildren, configured by the
// FERRY_* variables: it joins, receives process 0's 128-byte id and prints
// it, all-gathers the processes' pids, and then by role: "ok" closes;
// "victim" prints "ready" and waits to be killed or stopped; "survivor"
// calls a barrier that must fail naming process 2, and prints the error.
func child(role string) int {
	cfg, ok, err := rendezvous.ConfigFromEnv()
	if !ok || err != nil {
		fmt.Fprintln(os.Stderr, "child: no job in the environment:", err)
		return 2
	}
	ctx := context.Background()
	c, err := rendezvous.Join(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: Join:", err)
		return 1
	}
	id := make([]byte, 128)
	send, recv := make([]byte, 8), make([]byte, 8*c.Size())
	binary.LittleEndian.PutUint64(send, uint64(os.Getpid()))
	err = errors.Join(
		c.Broadcast(ctx, ir.Uint8, 0, id),
		c.AllGather(ctx, ir.Int64, nil, 0, send, recv),
		c.Barrier(ctx))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Printf("id %x\n", id)
	fmt.Printf("pids %x\n", recv)
	switch role {
	case "victim":
		fmt.Println("ready")
		select {}
	case "survivor":
		err := c.Barrier(ctx)
		fmt.Printf("failed: %v\n", err)
		if !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), "process(es) [2]") && !strings.Contains(err.Error(), "process 2 is gone") {
			return 1
		}
		return 0
	}
	if err := c.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "child: Close:", err)
		return 1
	}
	return 0
}

// proc is a child process and the lines it prints.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	err   bytes.Buffer
}

// next returns the child's next line of output.
func (p *proc) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("child %d ended early: %s", p.cmd.Process.Pid, p.err.String())
		}
		return l
	case <-time.After(time.Minute):
		t.Fatalf("child %d printed nothing for a minute", p.cmd.Process.Pid)
	}
	return ""
}

// startChild starts this test binary again as process id of a job of n
// processes, with the given role (see child).
func startChild(t *testing.T, addr string, n, id int, timeout, role string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(os.Args[0]), lines: make(chan string, 16)}
	p.cmd.Env = append(os.Environ(), childEnv+"="+role,
		rendezvous.AddressEnv+"="+addr, rendezvous.NumProcessesEnv+"="+strconv.Itoa(n),
		rendezvous.ProcessIDEnv+"="+strconv.Itoa(id), collective.TimeoutEnv+"="+timeout)
	p.cmd.Stderr = &p.err
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := bufio.NewScanner(out)
		s.Buffer(nil, 1<<20)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
	return p
}

// startChildren joins a job of len(roles)+1 processes: processes 1, 2, ...
// are children (this test binary again) with the given roles, process 0 is
// this test, which it returns with the children.
func startChildren(t *testing.T, timeout string, roles ...string) (*rendezvous.Comm, []*proc) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := len(roles) + 1
	addr := ln.Addr().String()
	var procs []*proc
	for i, role := range roles {
		procs = append(procs, startChild(t, addr, n, i+1, timeout, role))
	}
	t.Setenv(collective.TimeoutEnv, timeout)
	c, err := rendezvous.Join(context.Background(), rendezvous.Config{CoordinatorAddress: addr, NumProcesses: n, Listener: ln, ConnectTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return c, procs
}

// bootstrap is process 0's side of child's opening: a random id broadcast,
// the pids gathered (checked against the children's), a barrier.
func bootstrap(t *testing.T, c *rendezvous.Comm, procs []*proc) {
	t.Helper()
	ctx := context.Background()
	id := make([]byte, 128)
	rng := testseed.Rand(t, 1)
	for i := range id {
		id[i] = byte(rng.Uint32())
	}
	send, recv := make([]byte, 8), make([]byte, 8*c.Size())
	binary.LittleEndian.PutUint64(send, uint64(os.Getpid()))
	err := errors.Join(
		c.Broadcast(ctx, ir.Uint8, 0, id),
		c.AllGather(ctx, ir.Int64, nil, 0, send, recv),
		c.Barrier(ctx))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range procs {
		if got := binary.LittleEndian.Uint64(recv[8*(i+1):]); got != uint64(p.cmd.Process.Pid) {
			t.Errorf("process %d's pid arrived as %d, want %d", i+1, got, p.cmd.Process.Pid)
		}
		if l, want := p.next(t), fmt.Sprintf("id %x", id); l != want {
			t.Errorf("process %d received %q, want %q", i+1, l, want)
		}
		if l, want := p.next(t), fmt.Sprintf("pids %x", recv); l != want {
			t.Errorf("process %d gathered %q, want %q", i+1, l, want)
		}
	}
}

// TestProcesses runs a job of 3 real processes: the id broadcast, the pids
// gathered, a barrier, and a clean close.
func TestProcesses(t *testing.T) {
	c, procs := startChildren(t, "1m", "ok", "ok")
	bootstrap(t, c, procs)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("process %d: %v: %s", i+1, err, p.err.String())
		}
	}
}

// TestProcessDies: process 2 of 3 is killed (SIGKILL) or stopped (SIGSTOP)
// after the bootstrap; the next barrier fails in process 0 and process 1
// with an error naming process 2: at once when it died, after
// FERRY_COLLECTIVE_TIMEOUT (500ms here) when it hangs.
func TestProcessDies(t *testing.T) {
	for _, tc := range []struct {
		sig  syscall.Signal
		want error
		says string
	}{
		{syscall.SIGKILL, rendezvous.ErrProcessLost, "process 2 is gone"},
		{syscall.SIGSTOP, rendezvous.ErrTimeout, "process(es) [2] did not join it"},
	} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			c, procs := startChildren(t, "500ms", "survivor", "victim")
			defer c.Close()
			bootstrap(t, c, procs)
			victim, survivor := procs[1], procs[0]
			if l := victim.next(t); l != "ready" {
				t.Fatalf("victim: %q", l)
			}
			if err := victim.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			err := c.Barrier(context.Background())
			if !errors.Is(err, collective.ErrAborted) || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("process 0: got %v, want %v saying %q", err, tc.want, tc.says)
			}
			l := survivor.next(t)
			if err := survivor.cmd.Wait(); err != nil || !strings.Contains(l, tc.says) {
				t.Errorf("process 1: %q, %v, %s", l, err, survivor.err.String())
			}
		})
	}
}

// TestCoordinatorDies: process 0, which runs the coordinator, is killed
// after the bootstrap; process 1's next call fails saying so.
func TestCoordinatorDies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // the child listens there
	victim := startChild(t, addr, 2, 0, "1m", "victim")
	t.Setenv(collective.TimeoutEnv, "1m")
	c, err := rendezvous.Join(context.Background(), rendezvous.Config{CoordinatorAddress: addr, NumProcesses: 2, ProcessID: 1, ConnectTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	id, send, recv := make([]byte, 128), make([]byte, 8), make([]byte, 16)
	binary.LittleEndian.PutUint64(send, uint64(os.Getpid()))
	if err := errors.Join(c.Broadcast(ctx, ir.Uint8, 0, id), c.AllGather(ctx, ir.Int64, nil, 0, send, recv), c.Barrier(ctx)); err != nil {
		t.Fatal(err)
	}
	if l, want := victim.next(t), fmt.Sprintf("id %x", id); l != want {
		t.Errorf("process 0 sent %q, process 1 received %x", l, id)
	}
	victim.next(t) // pids
	if l := victim.next(t); l != "ready" {
		t.Fatalf("victim: %q", l)
	}
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err = c.Barrier(ctx)
	if !errors.Is(err, collective.ErrAborted) || !errors.Is(err, rendezvous.ErrProcessLost) || !strings.Contains(err.Error(), "lost the coordinator (process 0 at "+addr) {
		t.Fatalf("got %v, want ErrProcessLost saying the coordinator is lost", err)
	}
}
