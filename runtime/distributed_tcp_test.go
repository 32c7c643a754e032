package runtime_test

import (
	"errors"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/rendezvous"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// tcpChildEnv makes TestTCPJob one process of the job it launches.
const tcpChildEnv = "FERRY_RT_TEST_TCP_CHILD"

// TestTCPJob launches 2 processes of 2 CPU devices each, joined without MPI
// by FERRY_COORDINATOR_ADDRESS, FERRY_NUM_PROCESSES and FERRY_PROCESS_ID
// (this test binary again, running tcpJobProcess).
func TestTCPJob(t *testing.T) {
	switch settings.RTTestTCPChild.Get() {
	case "1":
		tcpJobProcess(t)
	case "dies":
		tcpJobDeath(t)
	case "":
		launchTCPJob(t, "TestTCPJob", "1", 2, 2)
	}
}

// TestTCPJobDeviceMismatch: processes with different device counts are
// refused in both, naming the counts.
func TestTCPJobDeviceMismatch(t *testing.T) {
	switch settings.RTTestTCPChild.Get() {
	case "mismatch":
		err := rt.InitDistributed(rt.DistributedConfig{})
		require.ErrorContains(t, err, "process 0 has 2 local devices but process 1 has 3; every process must have the same number")
		require.Equal(t, 1, rt.ProcessCount())
	case "":
		launchTCPJob(t, "TestTCPJobDeviceMismatch", "mismatch", 2, 3)
	}
}

// TestTCPJobProcessDies: process 1 of a job joined over TCP exits in the
// middle of the job; process 0's next ProcessBarrier fails naming it.
func TestTCPJobProcessDies(t *testing.T) {
	switch settings.RTTestTCPChild.Get() {
	case "dies":
		tcpJobDeath(t)
	case "":
		launchTCPJob(t, "TestTCPJobProcessDies", "dies", 2, 2)
	}
}

// tcpJobDeath is a process of TestTCPJobProcessDies.
func tcpJobDeath(t *testing.T) {
	require.NoError(t, rt.InitDistributed(rt.DistributedConfig{}))
	_, err := rt.ProcessBarrier(true)
	require.NoError(t, err)
	if rt.ProcessIndex() == 1 {
		os.Exit(0) // without ShutdownDistributed: gone from the job
	}
	_, err = rt.ProcessBarrier(true)
	require.True(t, errors.Is(err, collective.ErrAborted), "got %v", err)
	require.True(t, errors.Is(err, rendezvous.ErrProcessLost), "got %v", err)
	require.ErrorContains(t, err, "process 1 is gone")
	require.NoError(t, rt.ShutdownDistributed())
}

// launchTCPJob runs test in 2 processes (this test binary again, with
// tcpChildEnv=role) of the given CPU device counts, joined over a port of
// 127.0.0.1, and checks that both pass.
func launchTCPJob(t *testing.T, test, role string, devices ...int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // process 0 listens there
	outs, errs := make([][]byte, 2), make([]error, 2)
	var wg sync.WaitGroup
	for p := range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), tcpChildEnv+"="+role, rt.EnvCPUDevices+"="+strconv.Itoa(devices[p]),
			rendezvous.AddressEnv+"="+addr, rendezvous.NumProcessesEnv+"=2", rendezvous.ProcessIDEnv+"="+strconv.Itoa(p),
			collective.TimeoutEnv+"=1m", "OMPI_COMM_WORLD_SIZE=", "OMPI_COMM_WORLD_RANK=", "PMIX_RANK=", "PMI_RANK=")
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[p], errs[p] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for p := range 2 {
		if errs[p] != nil || p == 0 && !strings.Contains(string(outs[p]), "--- PASS: "+test) {
			t.Errorf("process %d: %v\n%s", p, errs[p], outs[p])
		}
	}
}

// tcpJobProcess is one process of TestTCPJob's job.
func tcpJobProcess(t *testing.T) {
	require.NoError(t, rt.InitDistributed(rt.DistributedConfig{}))
	defer func() { require.NoError(t, rt.ShutdownDistributed()) }()
	p := rt.ProcessIndex()
	require.Equal(t, 2, rt.ProcessCount())
	require.Len(t, rt.Devices(), 4)
	for d, dev := range rt.LocalDevices() {
		require.Equal(t, 2*p+d, dev.ID)
		require.Equal(t, p, dev.Process)
	}
	for g, dev := range rt.Devices() {
		require.Equal(t, g, dev.ID)
		require.Equal(t, g/2, dev.Process)
	}

	// The processes agree on who failed.
	failed, err := rt.ProcessBarrier(p != 1)
	require.NoError(t, err)
	require.Equal(t, []int{1}, failed)

	rng := rand.New(rand.NewPCG(testseed.Uint64(t), uint64(p)))
	random := func(rows, cols int) (*trace.Array, []float64) {
		f, v := make([]float32, rows*cols), make([]float64, rows*cols)
		for i := range f {
			f[i] = float32(rng.NormFloat64())
			v[i] = float64(f[i])
		}
		return trace.Const(f, rows, cols), v
	}
	colSums := func(a *trace.Array) *trace.Array { return trace.Sum(a, 0) }

	// A program over this process's two devices, with an all-reduce
	// between them: it runs, and its result is read here.
	local, err := ir.NewMesh([]int{2}, []string{"x"}, 2*p, 2*p+1)
	require.NoError(t, err)
	ls, err := ir.NewNamedSharding(local, ir.P("x"))
	require.NoError(t, err)
	x, xv := random(6, 3)
	xs, err := rt.DevicePut(x, ls)
	require.NoError(t, err)
	res, err := rt.NewJitted(colSums).Call(xs)
	require.NoError(t, err)
	got := res[0].(*trace.Array).Float64s()
	for j := range 3 {
		want := xv[j] + xv[3+j] + xv[6+j] + xv[9+j] + xv[12+j] + xv[15+j]
		require.InDelta(t, want, got[j], 1e-5)
	}

	// A mesh over both processes' devices: arrays are put (each process
	// its blocks) and programs without collectives run, but collectives
	// between the processes, and reading such an array whole, are the
	// rendezvous's clear error, in both processes.
	all, err := ir.NewMesh([]int{4}, []string{"x"})
	require.NoError(t, err)
	as, err := ir.NewNamedSharding(all, ir.P("x"))
	require.NoError(t, err)
	y, yv := random(8, 3)
	ys, err := rt.DevicePut(y, as)
	require.NoError(t, err)
	sq, err := rt.NewJitted(func(a *trace.Array) *trace.Array { return trace.Mul(a, a) }).Call(ys)
	require.NoError(t, err)
	shards, err := rt.Shards(sq[0].(*trace.Array))
	require.NoError(t, err)
	require.Len(t, shards, 2)
	for d, sh := range shards {
		g := 2*p + d
		require.Equal(t, []int{2 * g, 0}, sh.Start)
		for i, v := range sh.Array.Float64s() {
			want := yv[6*g+i] * yv[6*g+i]
			require.InDelta(t, want, v, 1e-6*math.Max(1, want))
		}
	}
	_, err = rt.NewJitted(colSums).Call(ys)
	require.Error(t, err)
	require.True(t, errors.Is(err, rendezvous.ErrDataCollective), "got %v", err)
	require.ErrorContains(t, err, "need MPI (launch under mpirun) or NCCL on GPUs")
	_, err = ys.Buffer().Literal()
	require.True(t, errors.Is(err, rendezvous.ErrDataCollective), "got %v", err)

	// The job is still whole.
	failed, err = rt.ProcessBarrier(true)
	require.NoError(t, err)
	require.Empty(t, failed)
}

// TestInitDistributedConfigErrors: a bad coordinator configuration is
// refused with an error naming the problem, before any connection.
func TestInitDistributedConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  rt.DistributedConfig
		says string
	}{
		{rt.DistributedConfig{CoordinatorAddress: "node0:29500"}, "at least 1"},
		{rt.DistributedConfig{CoordinatorAddress: "node0:29500", NumProcesses: 2, ProcessID: 5}, "process id 5 is out of range"},
		{rt.DistributedConfig{CoordinatorAddress: "node0", NumProcesses: 2, ProcessID: 1}, "want host:port"},
		{rt.DistributedConfig{NumProcesses: 2, ProcessID: 1}, "want host:port"},
		{rt.DistributedConfig{CoordinatorAddress: "node0:29500", NumProcesses: 2, InitializationTimeout: -1}, "negative"},
	} {
		err := rt.InitDistributed(tc.cfg)
		require.ErrorContains(t, err, tc.says, "%+v", tc.cfg)
		require.Equal(t, 1, rt.ProcessCount())
	}
	t.Setenv(rendezvous.AddressEnv, "node0:29500")
	t.Setenv(rendezvous.NumProcessesEnv, "")
	t.Setenv(rendezvous.ProcessIDEnv, "")
	os.Unsetenv(rendezvous.NumProcessesEnv)
	os.Unsetenv(rendezvous.ProcessIDEnv)
	t.Setenv("OMPI_COMM_WORLD_SIZE", "")
	t.Setenv("OMPI_COMM_WORLD_RANK", "")
	t.Setenv("PMIX_RANK", "")
	t.Setenv("PMI_RANK", "")
	require.ErrorContains(t, rt.InitDistributed(rt.DistributedConfig{}), "FERRY_NUM_PROCESSES and FERRY_PROCESS_ID is not set")
}
