package mpi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryml/ferry/collective"
	table "github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// killEnv makes TestRankDeath kill a rank mid-job: "1" or "last" the last
// rank, "first" rank 0 (process 0, which holds the other processes'
// liveness connections). Run it under mpirun --enable-recovery (else mpirun
// ends the whole job at once when a process dies):
//
//	FERRY_MPI_KILL_TEST=1 FERRY_COLLECTIVE_TIMEOUT=60s mpirun --enable-recovery -np 3 /tmp/mpi.test -test.run RankDeath
//
// The surviving ranks must fail their AllReduce with ErrProcessLost naming
// the dead rank and its host, found by the liveness connections long before
// the timeout (a timeout error fails the test). With FERRY_MPI_LIVENESS=off
// they must fail with the timeout error naming the rank that never joined.
// The killed rank prints the time of its death and the survivors the time
// of their error (Unix nanoseconds, "killed at" and "returned at"), so
// that a script on one machine can tell the time to detection.
const killEnv = "FERRY_MPI_KILL_TEST"

func TestRankDeath(t *testing.T) {
	w := jobWorld(t)
	var victim int
	switch table.MPIKillTest.Get() {
	case "1", "last":
		victim = w.Size() - 1
	case "first":
		victim = 0
	default:
		t.Skipf("set %s=1 (under mpirun --enable-recovery) to kill the last rank mid-job, or first to kill rank 0", killEnv)
	}
	job.skipAgreement = true // a dead rank cannot agree
	ctx := context.Background()
	if err := w.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Rank() == victim {
		time.Sleep(100 * time.Millisecond)
		fmt.Printf("mpi: rank %d killed at %d\n", w.Rank(), time.Now().UnixNano())
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	start := time.Now()
	err := w.AllReduce(ctx, collective.Sum, ir.Float32, alloc(64), alloc(64))
	end := time.Now()
	t.Logf("rank %d of %d: AllReduce returned at %d after %v: %v", w.Rank(), w.Size(), end.UnixNano(), end.Sub(start), err)
	if d, set, _ := table.MPILiveness.Lookup(); set && d == 0 {
		absent := fmt.Sprintf("rank(s) [%d] of %d ", victim, w.Size())
		if !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), ErrTimeout.Error()) ||
			!strings.Contains(err.Error(), "AllReduce") || !strings.Contains(err.Error(), absent) {
			t.Fatalf("a surviving rank got %v, want the timeout error naming AllReduce and %q", err, absent)
		}
		return
	}
	dead := fmt.Sprintf("process %d of %d (host %s, pid ", victim, w.Size(), hostname())
	if !errors.Is(err, collective.ErrAborted) || !errors.Is(err, ErrProcessLost) || strings.Contains(err.Error(), ErrTimeout.Error()) ||
		!strings.Contains(err.Error(), dead) {
		t.Fatalf("a surviving rank got %v, want ErrProcessLost naming %q (found by the liveness connections, not the timeout)", err, dead)
	}
}
