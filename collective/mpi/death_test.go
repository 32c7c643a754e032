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
	"github.com/ferryml/ferry/ir"
)

// KillEnv, set to 1, makes TestRankDeath kill the last rank mid-job. Run it
// under mpirun --enable-recovery (else mpirun ends the whole job at once
// when a process dies), with a short FERRY_COLLECTIVE_TIMEOUT:
//
//	FERRY_MPI_KILL_TEST=1 FERRY_COLLECTIVE_TIMEOUT=2s mpirun --enable-recovery -np 3 /tmp/mpi.test -test.run RankDeath
//
// The surviving ranks must fail their AllReduce with the timeout error
// naming the dead rank, instead of hanging.
const killEnv = "FERRY_MPI_KILL_TEST"

func TestRankDeath(t *testing.T) {
	w := jobWorld(t)
	if os.Getenv(killEnv) != "1" {
		t.Skipf("set %s=1 (under mpirun --enable-recovery) to kill the last rank mid-job", killEnv)
	}
	job.skipAgreement = true // a dead rank cannot agree
	ctx := context.Background()
	if err := w.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Rank() == w.Size()-1 {
		time.Sleep(100 * time.Millisecond)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	start := time.Now()
	err := w.AllReduce(ctx, collective.Sum, ir.Float32, alloc(64), alloc(64))
	t.Logf("rank %d of %d: AllReduce returned after %v: %v", w.Rank(), w.Size(), time.Since(start), err)
	dead := fmt.Sprintf("rank(s) [%d] of %d did not join it", w.Size()-1, w.Size())
	if !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), ErrTimeout.Error()) ||
		!strings.Contains(err.Error(), "AllReduce") || !strings.Contains(err.Error(), dead) {
		t.Fatalf("a surviving rank got %v, want the timeout error naming AllReduce and the dead rank", err)
	}
}
