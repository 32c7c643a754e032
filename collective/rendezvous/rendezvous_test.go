package rendezvous_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/rendezvous"
	"github.com/ferryml/ferry/ir"
)

// TestBootstrap runs what a bootstrap does on 4 processes: a barrier, the
// broadcast of a random 128-byte id from each root, and an all-gather of
// each process's random counts.
func TestBootstrap(t *testing.T) {
	const n = 4
	comms := join(t, n, nil)
	ctx := context.Background()
	for p, c := range comms {
		if c.Rank() != p || c.Size() != n {
			t.Fatalf("process %d: rank %d of %d", p, c.Rank(), c.Size())
		}
	}
	ids := make([][]byte, n)
	rng := testseed.Rand(t, 1)
	for root := range n {
		ids[root] = make([]byte, 128)
		for i := range ids[root] {
			ids[root][i] = byte(rng.Uint32())
		}
	}
	counts := make([]uint64, n)
	for p := range counts {
		counts[p] = testseed.Uint64(t)
	}
	errs := onEach(n, func(p int) error {
		c := comms[p]
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		for root := range n {
			buf := make([]byte, 128)
			if p == root {
				copy(buf, ids[root])
			}
			if err := c.Broadcast(ctx, ir.Uint8, root, buf); err != nil {
				return err
			}
			if !bytes.Equal(buf, ids[root]) {
				return fmt.Errorf("the id broadcast from %d arrived as %x, want %x", root, buf, ids[root])
			}
		}
		send, recv := make([]byte, 8), make([]byte, 8*n)
		binary.LittleEndian.PutUint64(send, counts[p])
		if err := c.AllGather(ctx, ir.Int64, nil, 0, send, recv); err != nil {
			return err
		}
		for q := range n {
			if got := binary.LittleEndian.Uint64(recv[8*q:]); got != counts[q] {
				return fmt.Errorf("gathered count of process %d is %d, want %d", q, got, counts[q])
			}
		}
		return c.Barrier(ctx)
	})
	for p, err := range errs {
		if err != nil {
			t.Errorf("process %d: %v", p, err)
		}
	}
}

// TestJobOfOne: a job of one process needs no port and its collectives
// return at once.
func TestJobOfOne(t *testing.T) {
	c, err := rendezvous.Join(context.Background(), rendezvous.Config{CoordinatorAddress: "127.0.0.1:0", NumProcesses: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := []byte{1, 2, 3}
	recv := make([]byte, 3)
	if err := c.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.AllGather(context.Background(), ir.Uint8, nil, 0, buf, recv); err != nil || !bytes.Equal(recv, buf) {
		t.Fatalf("AllGather: %v %v", recv, err)
	}
}

// TestSplit splits 5 processes by parity, ranked by descending process id,
// with process 4 in no group, and broadcasts a different id in each group.
func TestSplit(t *testing.T) {
	const n = 5
	comms := join(t, n, nil)
	ctx := context.Background()
	want := map[int][]int{0: {2, 0}, 1: {3, 1}} // color -> processes by new rank
	ids := [][]byte{[]byte("id of the even group"), []byte("id of the odd group!")}
	errs := onEach(n, func(p int) error {
		color := p % 2
		if p == 4 {
			color = collective.Undefined
		}
		sub, err := comms[p].Split(ctx, color, -p)
		if err != nil {
			return err
		}
		if p == 4 {
			if sub != nil {
				return fmt.Errorf("color Undefined gave a communicator of %d ranks", sub.Size())
			}
			return nil
		}
		defer sub.Close()
		members := want[color]
		if sub.Size() != len(members) || members[sub.Rank()] != p {
			return fmt.Errorf("got rank %d of %d, want rank %d of %v", sub.Rank(), sub.Size(), bytes.IndexByte(nil, 0), members)
		}
		for r, q := range members {
			if got := sub.(*rendezvous.Comm).Process(r); got != q {
				return fmt.Errorf("rank %d is process %d, want %d", r, got, q)
			}
		}
		buf := make([]byte, len(ids[color]))
		if sub.Rank() == 0 {
			copy(buf, ids[color])
		}
		if err := sub.Broadcast(ctx, ir.Uint8, 0, buf); err != nil {
			return err
		}
		if !bytes.Equal(buf, ids[color]) {
			return fmt.Errorf("group %d's id arrived as %q", color, buf)
		}
		// The groups' collectives are independent of the job's.
		return sub.Barrier(ctx)
	})
	for p, err := range errs {
		if err != nil {
			t.Errorf("process %d: %v", p, err)
		}
	}
	// The job's communicator still works after the split.
	for p, err := range onEach(n, func(p int) error { return comms[p].Barrier(ctx) }) {
		if err != nil {
			t.Errorf("process %d: barrier after Split: %v", p, err)
		}
	}
}

// TestMismatchAndInvalid: different collectives, roots or lengths give
// ErrMismatch on every process, one process's bad root ErrInvalid on every
// process; the job stays usable.
func TestMismatchAndInvalid(t *testing.T) {
	const n = 3
	comms := join(t, n, nil)
	ctx := context.Background()
	check := func(name string, want error, fn func(p int) error, says ...string) {
		t.Helper()
		for p, err := range onEach(n, fn) {
			if !errors.Is(err, want) {
				t.Errorf("%s: process %d: got %v, want %v", name, p, err, want)
				continue
			}
			for _, s := range says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%s: process %d: %q does not say %q", name, p, err, s)
				}
			}
		}
	}
	check("collectives", collective.ErrMismatch, func(p int) error {
		if p == 2 {
			return comms[p].Barrier(ctx)
		}
		return comms[p].Broadcast(ctx, ir.Uint8, 0, make([]byte, 4))
	}, "process 2", "Barrier", "Broadcast")
	check("roots", collective.ErrMismatch, func(p int) error {
		return comms[p].Broadcast(ctx, ir.Uint8, min(p, 1), make([]byte, 4))
	}, "root 1", "root 0")
	check("lengths", collective.ErrMismatch, func(p int) error {
		send := make([]byte, 4+4*(p/2))
		return comms[p].AllGather(ctx, ir.Uint8, nil, 0, send, make([]byte, n*len(send)))
	}, "8 bytes", "4 bytes")
	check("root out of range", collective.ErrInvalid, func(p int) error {
		root := 0
		if p == 1 {
			root = n
		}
		return comms[p].Broadcast(ctx, ir.Uint8, root, make([]byte, 4))
	}, "process 1", "root 3 is out of range")
	check("recv length", collective.ErrInvalid, func(p int) error {
		return comms[p].AllGather(ctx, ir.Uint8, nil, 0, make([]byte, 2), make([]byte, 2*n+p/2))
	}, "recv has 7 bytes, want 6")
	check("elements", collective.ErrInvalid, func(p int) error {
		send := make([]byte, 8+3*(p/2))
		return comms[p].AllGather(ctx, ir.Int64, nil, 0, send, make([]byte, n*len(send)))
	}, "process 2", "send has 11 bytes, not a whole number of i64 elements")
	for p, err := range onEach(n, func(p int) error { return comms[p].Barrier(ctx) }) {
		if err != nil {
			t.Errorf("process %d: barrier after the errors: %v", p, err)
		}
	}
}

// TestDataCollectives: the collectives that move array data are refused at
// once with ErrDataCollective, which points to MPI and NCCL.
func TestDataCollectives(t *testing.T) {
	comms := join(t, 2, nil)
	ctx := context.Background()
	c := comms[1]
	buf, out := make([]byte, 16), make([]byte, 16)
	big := make([]byte, rendezvous.MaxBytes+8)
	for name, err := range map[string]error{
		"AllReduce":         c.AllReduce(ctx, collective.Sum, ir.Float32, buf, out),
		"ReduceScatter":     c.ReduceScatter(ctx, collective.Sum, ir.Float32, nil, 0, buf, out[:8]),
		"AllToAll":          c.AllToAll(ctx, ir.Float32, nil, 0, 0, buf, out),
		"CollectivePermute": c.CollectivePermute(ctx, ir.Float32, []collective.Pair{{Source: 0, Target: 1}}, buf, out),
		"AllGather":         c.AllGather(ctx, ir.Float32, []int{2, 2}, 1, buf, make([]byte, 32)),
		"Broadcast":         c.Broadcast(ctx, ir.Uint8, 0, big),
	} {
		if !errors.Is(err, rendezvous.ErrDataCollective) || !errors.Is(err, collective.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrDataCollective and ErrInvalid", name, err)
			continue
		}
		for _, s := range []string{name, "process 1", "MPI", "NCCL", "only barriers and ids"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", name, err, s)
			}
		}
	}
}

// TestInconsistentJob: a process told another count, a process id claimed
// twice and a process of another job make Join fail in every process with
// ErrJob naming the problem.
func TestInconsistentJob(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*rendezvous.Config)
		says string
	}{
		{"count", func(c *rendezvous.Config) {
			if c.ProcessID == 2 {
				c.NumProcesses = 4
			}
		}, "process 2 (from 127.0.0.1:"},
		{"duplicate", func(c *rendezvous.Config) {
			if c.ProcessID == 2 {
				c.ProcessID = 1
			}
		}, "process id 1 was claimed twice"},
		{"job", func(c *rendezvous.Config) {
			c.Job = "train"
			if c.ProcessID == 1 {
				c.Job = "eval"
			}
		}, `belongs to job "eval"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, errs := joinAll(t, 3, tc.edit)
			for p, err := range errs {
				if comms[p] != nil {
					comms[p].Close()
				}
				if !errors.Is(err, rendezvous.ErrJob) || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("process %d: got %v, want ErrJob saying %q", p, err, tc.says)
				}
			}
		})
	}
}

// TestConnectTimeout: with no coordinator listening, Join gives up after the
// connect timeout, naming the address.
func TestConnectTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there now
	_, err = rendezvous.Join(context.Background(), rendezvous.Config{CoordinatorAddress: addr, NumProcesses: 2, ProcessID: 1, ConnectTimeout: 300 * time.Millisecond})
	if !errors.Is(err, rendezvous.ErrTimeout) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "process 0") {
		t.Fatalf("got %v, want ErrTimeout naming %s", err, addr)
	}
}

// TestJoinTimeout: when a process never arrives, the others' Join fails
// after the connect timeout, naming it.
func TestJoinTimeout(t *testing.T) {
	comms, errs := joinAll(t, 3, func(c *rendezvous.Config) {
		c.ConnectTimeout = 300 * time.Millisecond
		if c.ProcessID == 2 {
			c.CoordinatorAddress = "127.0.0.1:1" // lost on its way
			c.ConnectTimeout = 10 * time.Millisecond
		}
	})
	for p, err := range errs[:2] {
		if comms[p] != nil {
			comms[p].Close()
		}
		if !errors.Is(err, rendezvous.ErrTimeout) || !strings.Contains(err.Error(), "process(es) [2] of 3 did not reach the coordinator") {
			t.Errorf("process %d: got %v, want ErrTimeout naming process 2", p, err)
		}
	}
}

// TestCollectiveTimeout: a process that never calls the collective makes
// the others fail after FERRY_COLLECTIVE_TIMEOUT with an error naming it and
// the collective, and its own later call fails too.
func TestCollectiveTimeout(t *testing.T) {
	t.Setenv(collective.TimeoutEnv, "200ms")
	comms := join(t, 3, nil)
	ctx := context.Background()
	errs := onEach(2, func(p int) error { return comms[p].Barrier(ctx) })
	for p, err := range errs {
		if !errors.Is(err, collective.ErrAborted) || !errors.Is(err, rendezvous.ErrTimeout) {
			t.Errorf("process %d: got %v, want ErrAborted and ErrTimeout", p, err)
			continue
		}
		for _, s := range []string{"Barrier", "process(es) [2] did not join", "200ms", collective.TimeoutEnv} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("process %d: %q does not say %q", p, err, s)
			}
		}
	}
	// Process 2 learns of it by the abort message.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := comms[2].Barrier(ctx)
		if errors.Is(err, rendezvous.ErrTimeout) && strings.Contains(err.Error(), "process(es) [2]") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process 2: got %v, want the job's timeout", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAbort: Abort in one process fails the pending calls of the others,
// on every communicator of the job, naming it and the reason.
func TestAbort(t *testing.T) {
	comms := join(t, 3, nil)
	ctx := context.Background()
	subs := make([]collective.Communicator, 3)
	for p, err := range onEach(3, func(p int) (err error) {
		subs[p], err = comms[p].Split(ctx, 0, p)
		return err
	}) {
		if err != nil {
			t.Fatalf("process %d: Split: %v", p, err)
		}
	}
	errs := onEach(3, func(p int) error {
		if p == 1 {
			time.Sleep(20 * time.Millisecond)
			comms[1].Abort(errors.New("the loss is NaN"))
			return nil
		}
		return subs[p].Barrier(ctx)
	})
	for _, p := range []int{0, 2} {
		err := errs[p]
		if !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), "process 1 aborted the job: the loss is NaN") {
			t.Errorf("process %d: got %v", p, err)
		}
	}
}

// TestContextDone: a process whose context ends while it waits gives up,
// and the others' calls fail naming it.
func TestContextDone(t *testing.T) {
	comms := join(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := comms[0].Barrier(ctx)
	if !errors.Is(err, collective.ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("process 0: got %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = comms[1].Barrier(context.Background())
		if errors.Is(err, collective.ErrAborted) && strings.Contains(err.Error(), "process 0 gave up in Barrier") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process 1: got %v", err)
		}
	}
}

// TestCloseWhileAwaited: a process that closes while the others wait for it
// in a collective fails them, naming it; a communicator used after Close
// says so.
func TestCloseWhileAwaited(t *testing.T) {
	comms := join(t, 3, nil)
	ctx := context.Background()
	errs := onEach(3, func(p int) error {
		if p == 2 {
			time.Sleep(20 * time.Millisecond)
			return comms[2].Close()
		}
		return comms[p].Barrier(ctx)
	})
	for _, p := range []int{0, 1} {
		if err := errs[p]; !errors.Is(err, rendezvous.ErrProcessLost) || !strings.Contains(err.Error(), "process 2 closed") {
			t.Errorf("process %d: got %v", p, err)
		}
	}
	if err := comms[2].Barrier(ctx); !errors.Is(err, collective.ErrClosed) {
		t.Errorf("Barrier after Close: %v", err)
	}
}

// TestValidate: bad counts, ids and addresses are refused with errors
// naming the problem and the variable.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  rendezvous.Config
		says string
	}{
		{rendezvous.Config{CoordinatorAddress: "node0:29500", NumProcesses: 0}, "at least 1"},
		{rendezvous.Config{CoordinatorAddress: "node0:29500", NumProcesses: 2, ProcessID: 2}, "process id 2 is out of range for a job of 2 processes, want 0 to 1"},
		{rendezvous.Config{CoordinatorAddress: "node0:29500", NumProcesses: 2, ProcessID: -1}, "out of range"},
		{rendezvous.Config{CoordinatorAddress: "node0", NumProcesses: 2}, "want host:port"},
		{rendezvous.Config{CoordinatorAddress: "node0:http", NumProcesses: 2}, `port "http" is not a number`},
		{rendezvous.Config{CoordinatorAddress: ":29500", NumProcesses: 2}, "has no host"},
		{rendezvous.Config{CoordinatorAddress: "node0:0", NumProcesses: 2}, "port 0"},
		{rendezvous.Config{CoordinatorAddress: "node0:70000", NumProcesses: 2}, "0 to 65535"},
	} {
		_, err := rendezvous.Join(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: got %v, want an error saying %q", tc.cfg, err, tc.says)
		}
	}
}

// TestConfigFromEnv reads the three variables, and refuses a partial or
// non-numeric set.
func TestConfigFromEnv(t *testing.T) {
	set := func(addr, n, id string) {
		for name, v := range map[string]string{rendezvous.AddressEnv: addr, rendezvous.NumProcessesEnv: n, rendezvous.ProcessIDEnv: id} {
			if v == "-" {
				t.Setenv(name, "")
				unsetenv(t, name)
			} else {
				t.Setenv(name, v)
			}
		}
	}
	set("-", "-", "-")
	if _, ok, err := rendezvous.ConfigFromEnv(); ok || err != nil {
		t.Fatalf("unset: %v %v", ok, err)
	}
	set("node0:29500", "4", "3")
	cfg, ok, err := rendezvous.ConfigFromEnv()
	if !ok || err != nil || cfg.CoordinatorAddress != "node0:29500" || cfg.NumProcesses != 4 || cfg.ProcessID != 3 {
		t.Fatalf("got %+v %v %v", cfg, ok, err)
	}
	set("node0:29500", "-", "3")
	if _, _, err := rendezvous.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), rendezvous.NumProcessesEnv+" is not set") {
		t.Fatalf("partial: %v", err)
	}
	set("node0:29500", "two", "1")
	if _, _, err := rendezvous.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), `FERRY_NUM_PROCESSES="two"`) {
		t.Fatalf("not a number: %v", err)
	}
}

// TestLateProcess: a process that arrives after the job started (a stray
// duplicate) is refused with ErrJob, and the job goes on.
func TestLateProcess(t *testing.T) {
	var addr string
	comms := join(t, 2, func(c *rendezvous.Config) {
		if c.Listener != nil {
			addr = c.Listener.Addr().String()
		}
	})
	_, err := rendezvous.Join(context.Background(), rendezvous.Config{CoordinatorAddress: addr, NumProcesses: 2, ProcessID: 1, ConnectTimeout: 10 * time.Second})
	if !errors.Is(err, rendezvous.ErrJob) || !strings.Contains(err.Error(), "arrived after the job's 2 processes had joined") {
		t.Fatalf("late process: %v", err)
	}
	for p, err := range onEach(2, func(p int) error { return comms[p].Barrier(context.Background()) }) {
		if err != nil {
			t.Errorf("process %d: %v", p, err)
		}
	}
}
