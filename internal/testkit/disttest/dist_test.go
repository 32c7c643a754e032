package disttest

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/mpi"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// inJob is set when the test process is one of an MPI job's.
var inJob bool

// killed is set when TestMPIProcessDeath killed a process on purpose.
var killed bool

func TestMain(m *testing.M) {
	if !mpi.InMPIJob() {
		os.Exit(m.Run())
	}
	inJob = true
	if !settings.CPUDevices.IsSet() {
		if err := rt.SetCPUDeviceCount(2); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	err := rt.InitDistributed(rt.DistributedConfig{})
	if settings.DistTestMismatch.Get() {
		// Launched with different device counts per process (.ci/mpi.sh):
		// every process must refuse, naming the counts.
		if err == nil || !strings.Contains(err.Error(), "every process must have the same number") {
			fmt.Fprintln(os.Stderr, "dist: InitDistributed with different device counts returned", err)
			os.Exit(1)
		}
		fmt.Println("dist: InitDistributed refused:", err)
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "InitDistributed:", err)
		os.Exit(2)
	}
	if rt.ProcessIndex() == 0 {
		fmt.Printf("dist: %d processes, %d devices\n", rt.ProcessCount(), len(rt.Devices()))
	}
	code := m.Run()
	if killed {
		os.Exit(code) // a dead process cannot agree
	}
	// Every process agrees on failure: the codes, one per device, gathered.
	n := len(rt.Devices())
	codes := make([]int32, n)
	for i := range codes {
		codes[i] = int32(code)
	}
	if all, err := gatherPerDevice(codes); err != nil {
		fmt.Fprintln(os.Stderr, "dist: agreeing on the result:", err)
		code = 1
	} else {
		for _, c := range all {
			if c != 0 {
				code = 1
			}
		}
	}
	if err := rt.ShutdownDistributed(); err != nil {
		fmt.Fprintln(os.Stderr, "dist:", err)
		code = 1
	}
	os.Exit(code)
}

// gatherPerDevice puts v (one element per device) sharded over every device
// of the job, each process giving its own values, and reads it back whole:
// element i is the value of the process holding device i.
func gatherPerDevice(v []int32) ([]int32, error) {
	m, err := ir.NewMesh([]int{len(v)}, []string{"all"})
	if err != nil {
		return nil, err
	}
	s, err := ir.NewNamedSharding(m, ir.P("all"))
	if err != nil {
		return nil, err
	}
	x, err := rt.DevicePut(trace.Const(v, len(v)), s)
	if err != nil {
		return nil, err
	}
	return x.Int32s(), nil
}

// jobSeed returns a seed chosen by process 0 (its test's seed, see
// internal/testkit/testseed), the same in every process.
func jobSeed(t *testing.T) uint64 {
	n := len(rt.Devices())
	mine := make([]int32, n)
	for i := range mine {
		mine[i] = int32(uint32(testseed.Uint64(t)))
	}
	all, err := gatherPerDevice(mine)
	require.NoError(t, err)
	return uint64(uint32(all[0]))
}

func sharding(t *testing.T, shape []int, names []string, spec ir.PartitionSpec) *ir.NamedSharding {
	t.Helper()
	m, err := ir.NewMesh(shape, names)
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(m, spec)
	require.NoError(t, err)
	return s
}

func randArray(rng *rand.Rand, shape ...int) (*trace.Array, []float64) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float64, n)
	f := make([]float32, n)
	for i := range v {
		f[i] = float32(rng.NormFloat64())
		v[i] = float64(f[i])
	}
	return trace.Const(f, shape...), v
}

// shardedCheck holds what checkSharded's checks share: the job's device
// count n, the devices per process k, this process's index p, and the
// random source (the same on every process).
type shardedCheck struct {
	n, k, p int
	rng     *rand.Rand
}

// checkSharded runs sharded jitted functions over every device of the job
// (n of them, k per process) and compares them with float64 references.
func checkSharded(t *testing.T) {
	n, k := len(rt.Devices()), len(rt.LocalDevices())
	p := rt.ProcessIndex()
	for d, dev := range rt.LocalDevices() {
		require.Equal(t, p*k+d, dev.ID)
		require.Equal(t, p, dev.Process)
	}
	rng := rand.New(rand.NewPCG(jobSeed(t), 7))
	sc := &shardedCheck{n: n, k: k, p: p, rng: rng}
	t.Run("devices", sc.devices)
	t.Run("elementwise", sc.elementwise)
	t.Run("sum", sc.sum)
	t.Run("matmul", sc.matmul)
	t.Run("lastProcess", sc.lastProcess)
	t.Run("mesh2d", sc.mesh2d)
}

// devices checks one-device arrays on this process's devices.
func (sc *shardedCheck) devices(t *testing.T) {
	n, k, p, rng := sc.n, sc.k, sc.p, sc.rng
	// One-device arrays live on this process's devices, named by
	// global IDs; another process's device is an error naming it.
	x, xv := randArray(rng, 3)
	dev := rt.LocalDevices()[k-1]
	y, err := rt.ToDevice(x, dev)
	require.NoError(t, err)
	got, err := rt.DeviceOf(y)
	require.NoError(t, err)
	require.Equal(t, dev, got)
	z := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Mul(a, a) })(y)
	got, err = rt.DeviceOf(z)
	require.NoError(t, err)
	require.Equal(t, dev, got)
	for i, v := range z.Float64s() {
		require.InDelta(t, xv[i]*xv[i], v, 1e-6)
	}
	if n > k {
		other := rt.Devices()[(p*k+k)%n]
		_, err := rt.ToDevice(x, other)
		require.ErrorContains(t, err, "belongs to process")
	}
}

// elementwise checks an elementwise function of an array split over
// every device.
func (sc *shardedCheck) elementwise(t *testing.T) {
	n, k, p, rng := sc.n, sc.k, sc.p, sc.rng
	x, xv := randArray(rng, 3*n, 5)
	s := sharding(t, []int{n}, []string{"x"}, ir.P("x"))
	xs, err := rt.DevicePut(x, s)
	require.NoError(t, err)
	shards, err := rt.Shards(xs)
	require.NoError(t, err)
	require.Len(t, shards, k) // this process's blocks only
	for d, sh := range shards {
		g := p*k + d
		require.Equal(t, g, sh.Device.ID)
		require.Equal(t, []int{3 * g, 0}, sh.Start)
		require.Equal(t, xv[3*g*5:(3*g+1)*5], sh.Array.Float64s()[:5])
	}
	y := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Tanh(trace.Mul(a, a)) })(xs)
	got := y.Float64s()
	for i := range xv {
		require.InDelta(t, math.Tanh(xv[i]*xv[i]), got[i], 1e-6)
	}
}

// sum checks full and partial sums of an array split over every device.
func (sc *shardedCheck) sum(t *testing.T) {
	n, rng := sc.n, sc.rng
	x, xv := randArray(rng, 2*n, 3)
	s := sharding(t, []int{n}, []string{"x"}, ir.P("x"))
	xs, err := rt.DevicePut(x, s)
	require.NoError(t, err)
	f := rt.Jit(func(a *trace.Array) (*trace.Array, *trace.Array) { return trace.Sum(a), trace.Sum(a, 0) })
	o0, o1 := f(xs)
	var want float64
	cols := make([]float64, 3)
	for i, v := range xv {
		want += v
		cols[i%3] += v
	}
	require.InDelta(t, want, o0.Item(), 1e-4)
	got := o1.Float64s()
	for j := range cols {
		require.InDelta(t, cols[j], got[j], 1e-4)
	}
}

// matmul checks a matrix product whose contracting dimension is split
// over every device.
func (sc *shardedCheck) matmul(t *testing.T) {
	n, rng := sc.n, sc.rng
	// The contracting dimension split over every device: each device's
	// partial product, all-reduced.
	a, av := randArray(rng, 4, 2*n)
	b, bv := randArray(rng, 2*n, 3)
	m, err := ir.NewMesh([]int{n}, []string{"x"})
	require.NoError(t, err)
	sa, err := ir.NewNamedSharding(m, ir.P("", "x"))
	require.NoError(t, err)
	sb, err := ir.NewNamedSharding(m, ir.P("x"))
	require.NoError(t, err)
	as, err := rt.DevicePut(a, sa)
	require.NoError(t, err)
	bs, err := rt.DevicePut(b, sb)
	require.NoError(t, err)
	c := rt.Jit(trace.MatMul)(as, bs)
	got := c.Float64s()
	for i := range 4 {
		for j := range 3 {
			var want float64
			for l := range 2 * n {
				want += av[i*2*n+l] * bv[l*3+j]
			}
			require.InDelta(t, want, got[i*3+j], 1e-4)
		}
	}
}

// lastProcess checks a function over a mesh of the last process's devices alone.
func (sc *shardedCheck) lastProcess(t *testing.T) {
	k, p, rng := sc.k, sc.p, sc.rng
	// A mesh of the last process's devices alone (all devices in a job
	// of one): the other processes run nothing, and read the result
	// by gathering it.
	last := rt.ProcessCount() - 1
	var ids []int
	for d := range k {
		ids = append(ids, last*k+d)
	}
	m, err := ir.NewMesh([]int{k}, []string{"x"}, ids...)
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(m, ir.P("x"))
	require.NoError(t, err)
	x, xv := randArray(rng, 2*k, 3)
	xs, err := rt.DevicePut(x, s)
	require.NoError(t, err)
	shards, err := rt.Shards(xs)
	require.NoError(t, err)
	if p == last {
		require.Len(t, shards, k)
	} else {
		require.Empty(t, shards)
	}
	y := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Sum(trace.Exp(a), 0) })(xs)
	got := y.Float64s()
	for j := range 3 {
		var want float64
		for i := range 2 * k {
			want += math.Exp(xv[i*3+j])
		}
		require.InDelta(t, want, got[j], 1e-4)
	}
}

// mesh2d checks sums over either axis of a 2-D mesh.
func (sc *shardedCheck) mesh2d(t *testing.T) {
	n, rng := sc.n, sc.rng
	// A 2-D mesh whose first axis crosses processes: a sum over one axis
	// reduces within groups that span processes (or not).
	x, xv := randArray(rng, 2*2, n/2*3)
	s := sharding(t, []int{2, n / 2}, []string{"a", "b"}, ir.P("a", "b"))
	xs, err := rt.DevicePut(x, s)
	require.NoError(t, err)
	f := rt.Jit(func(a *trace.Array) (*trace.Array, *trace.Array) { return trace.Sum(a, 0), trace.Sum(a, 1) })
	o0, o1 := f(xs)
	rows, cols := 4, n/2*3
	s0, s1 := o0.Float64s(), o1.Float64s()
	for j := range cols {
		var want float64
		for i := range rows {
			want += xv[i*cols+j]
		}
		require.InDelta(t, want, s0[j], 1e-4)
	}
	for i := range rows {
		var want float64
		for j := range cols {
			want += xv[i*cols+j]
		}
		require.InDelta(t, want, s1[i], 1e-4)
	}
}

// TestMPISharded runs the checks over the devices of every process of the
// job.
func TestMPISharded(t *testing.T) {
	if !inJob {
		t.Skip("not started by mpirun; run: go test -c -o /tmp/dist.test ./internal/testkit/disttest && mpirun --oversubscribe -np 2 /tmp/dist.test -test.run MPI")
	}
	require.Greater(t, rt.ProcessCount(), 1)
	checkSharded(t)
}

// TestOneProcess runs the same checks on 4 virtual devices of one process.
func TestOneProcess(t *testing.T) {
	if inJob {
		t.Skip("in an MPI job: TestMPISharded runs the checks")
	}
	before := len(rt.Devices())
	require.NoError(t, rt.SetCPUDeviceCount(4))
	t.Cleanup(func() { _ = rt.SetCPUDeviceCount(before) })
	require.NoError(t, rt.InitDistributed(rt.DistributedConfig{})) // a job of one: nothing changes
	require.Equal(t, 1, rt.ProcessCount())
	checkSharded(t)
}

// TestJobOfOne runs the checks in a job of one process joined through a
// processes communicator of one rank (collective.NewLocal): the code of a
// job of several (global device IDs, gathers through the processes
// communicator, the world of devices) without mpirun.
func TestJobOfOne(t *testing.T) {
	if inJob {
		t.Skip("in an MPI job: TestMPISharded runs the checks")
	}
	before := len(rt.Devices())
	require.NoError(t, rt.SetCPUDeviceCount(4))
	procs, err := collective.NewLocal(1)
	require.NoError(t, err)
	require.NoError(t, rt.InitDistributed(rt.DistributedConfig{Processes: procs[0]}))
	t.Cleanup(func() {
		require.NoError(t, rt.ShutdownDistributed())
		require.NoError(t, rt.SetCPUDeviceCount(before))
	})
	require.Error(t, rt.InitDistributed(rt.DistributedConfig{Processes: procs[0]}), "a second InitDistributed")
	require.ErrorContains(t, rt.SetCPUDeviceCount(2), "cannot change")
	require.Equal(t, 1, rt.ProcessCount())
	require.Equal(t, 0, rt.ProcessIndex())
	require.Len(t, rt.Devices(), 4)
	require.Equal(t, rt.Devices(), rt.LocalDevices())
	checkSharded(t)
}

// TestMPIProcessDeath, with FERRY_DIST_KILL_TEST=1 under mpirun
// --enable-recovery and a short FERRY_COLLECTIVE_TIMEOUT, kills the last
// process between two steps of a sharded jitted function whose sum
// all-reduces over every device: the other processes' next step must fail
// with an error naming the dead process and its host (collective/mpi's
// liveness connections), instead of hanging.
//
//	FERRY_DIST_KILL_TEST=1 FERRY_COLLECTIVE_TIMEOUT=2s mpirun --enable-recovery -np 3 /tmp/dist.test -test.run ProcessDeath
func TestMPIProcessDeath(t *testing.T) {
	if !inJob || !settings.DistKillTest.Get() {
		t.Skip("set FERRY_DIST_KILL_TEST=1 under mpirun --enable-recovery to kill the last process mid-job")
	}
	killed = true
	n, np := len(rt.Devices()), rt.ProcessCount()
	s := sharding(t, []int{n}, []string{"x"}, ir.P("x"))
	xs, err := rt.DevicePut(trace.Full(ir.Shape{n, 4}, 1, ir.Float32), s)
	require.NoError(t, err)
	l, err := rt.NewJitted(func(a *trace.Array) *trace.Array { return trace.Sum(a) }).Lower(xs)
	require.NoError(t, err)
	c, err := l.Compile()
	require.NoError(t, err)
	outs, err := c.Call(xs) // every process takes part
	require.NoError(t, err)
	require.Equal(t, float64(4*n), outs[0].(*trace.Array).Item())
	if rt.ProcessIndex() == np-1 {
		time.Sleep(100 * time.Millisecond)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	start := time.Now()
	_, err = c.Call(xs)
	t.Logf("process %d of %d: the step returned after %v: %v", rt.ProcessIndex(), np, time.Since(start), err)
	require.Error(t, err)
	require.ErrorIs(t, err, collective.ErrAborted)
	require.ErrorContains(t, err, fmt.Sprintf("a process of the job is gone: process %d of %d (host ", np-1, np))
}
