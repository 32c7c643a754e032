package mpi

import (
	"context"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"os"
	"testing"

	"github.com/ferryml/ferry/collective"
	table "github.com/ferryml/ferry/internal/settings"
)

// The tests named TestMPI* need a job of several processes: build the test
// binary and run it under mpirun (see .ci/mpi.sh):
//
//	go test -c -o /tmp/mpi.test ./collective/mpi
//	mpirun --oversubscribe -np 4 /tmp/mpi.test -test.run MPI
//
// Under plain go test they skip.

// job is the state of the MPI job the test process belongs to.
var job struct {
	err   error // why the MPI tests skip or fail, nil in a job
	world *Comm
	seed  uint64 // chosen by rank 0, the same on every rank
	// skipAgreement is set when a rank was killed on purpose: the others do
	// not all-reduce their results at the end.
	skipAgreement bool
}

func TestMain(m *testing.M) {
	if !InMPIJob() {
		job.err = fmt.Errorf("not started by mpirun; run: go test -c -o /tmp/mpi.test ./collective/mpi && mpirun --oversubscribe -np 4 /tmp/mpi.test -test.run MPI")
		os.Exit(m.Run())
	}
	if table.MPITestAllgatherDesc.Get() {
		p2pDescMax = 0 // test the exchange of large groups
	}
	if err := Init(); err != nil {
		fmt.Fprintln(os.Stderr, "mpi: Init:", err)
		os.Exit(1)
	}
	w, err := newWorld()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mpi: World:", err)
		os.Exit(1)
	}
	job.world = w
	// Fresh inputs every run (or $FERRY_TEST_SEED's): rank 0 picks the
	// seed and broadcasts it.
	seed := alloc(8)
	if w.Rank() == 0 {
		s, err := testseed.Fresh()
		if err != nil {
			fmt.Fprintln(os.Stderr, "mpi:", err)
			os.Exit(1)
		}
		*(*uint64)(ptr(seed)) = s
	}
	if err := w.Broadcast(context.Background(), u64, 0, seed); err != nil {
		fmt.Fprintln(os.Stderr, "mpi: broadcasting the seed:", err)
		os.Exit(1)
	}
	job.seed = *(*uint64)(ptr(seed))
	if w.Rank() == 0 {
		fmt.Printf("mpi: %d processes, %s, seed %d (FERRY_TEST_SEED=%d replays it), descriptors exchanged by %s\n", w.Size(), LibraryPath(), job.seed, job.seed,
			map[bool]string{true: "point-to-point messages", false: "MPI_Iallgather"}[w.Size() <= p2pDescMax])
	}
	code := m.Run()
	// Every rank agrees on failure, so that mpirun's exit status says it.
	flag := alloc(4)
	*(*int32)(ptr(flag)) = int32(code)
	if job.skipAgreement {
		os.Exit(code)
	}
	if err := w.AllReduce(context.Background(), collective.Max, i32, flag, flag); err != nil {
		fmt.Fprintln(os.Stderr, "mpi: agreeing on the result:", err)
		code = 1
	} else if *(*int32)(ptr(flag)) != 0 {
		code = 1
	}
	w.Close()
	if err := Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "mpi:", err)
		code = 1
	}
	os.Exit(code)
}

// jobWorld returns the job's communicator or skips.
func jobWorld(t *testing.T) *Comm {
	t.Helper()
	if job.err != nil {
		t.Skip(job.err)
	}
	return job.world
}
