package runtime

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// devCollBackend is a backend that says its collectives run on device
// memory (backend.DeviceCollectives); only its name is used.
type devCollBackend struct{ Backend }

func (devCollBackend) Name() string            { return "fakedev" }
func (devCollBackend) DeviceCollectives() bool { return true }

// recMaker is a DeviceCommMaker that records what it is asked for.
type recMaker struct {
	mu    sync.Mutex
	all   [][]int  // InitAll device lists
	joins []string // "size/rank id[0]"
	ids   byte
}

type recComm struct {
	backend.DeviceCommunicator
	rank, size int
	aborted    *int
}

func (c *recComm) Rank() int    { return c.rank }
func (c *recComm) Size() int    { return c.size }
func (c *recComm) Abort() error { *c.aborted++; return nil }

func (m *recMaker) InitAll(devices []int) ([]backend.DeviceCommunicator, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.all = append(m.all, slices.Clone(devices))
	var out []backend.DeviceCommunicator
	for i := range devices {
		out = append(out, &recComm{rank: i, size: len(devices), aborted: new(int)})
	}
	return out, nil
}

func (m *recMaker) NewGroupID() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ids++
	id := make([]byte, groupIDBytes)
	id[0] = 100 + m.ids
	return id, nil
}

func (m *recMaker) InitRank(id []byte, size, rank int) (backend.DeviceCommunicator, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.joins = append(m.joins, fmt.Sprintf("%d/%d id%d", size, rank, id[0]))
	return &recComm{rank: rank, size: size, aborted: new(int)}, nil
}

func mustMesh(t *testing.T, shape []int, names []string, devs ...int) *ir.Mesh {
	t.Helper()
	m, err := ir.NewMesh(shape, names, devs...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// In one process, each group of the mesh along each axis string is one
// InitAll over its devices in rank order, and each device gets the
// communicator of its rank; a second call reuses the set.
func TestDeviceCommsOneProcess(t *testing.T) {
	mk := &recMaker{}
	backend.RegisterDeviceCommMaker("fakedev", mk)
	m := mustMesh(t, []int{2, 2}, []string{"x", "y"}, 3, 2, 1, 0)
	e := &shardedExecutable{be: devCollBackend{}, part: &passes.Partitioned{Mesh: m, Axes: []string{"x", "x,y", "y"}}}
	set, err := e.deviceComms(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{3, 1}, {2, 0}, {3, 2, 1, 0}, {3, 2}, {1, 0}}
	if fmt.Sprint(mk.all) != fmt.Sprint(want) {
		t.Errorf("InitAll calls %v, want %v", mk.all, want)
	}
	// Mesh position r holds device m.Devices()[r]; its rank along x is
	// its row, along y its column, along x,y r.
	for r := range 4 {
		for ax, rank := range map[string]int{"x": r / 2, "y": r % 2, "x,y": r} {
			if c := set[r][ax]; c == nil || c.Rank() != rank {
				t.Errorf("position %d, axis %s: %v, want rank %d", r, ax, c, rank)
			}
		}
	}
	e.freeDev = append(e.freeDev, set)
	again, err := e.deviceComms(context.Background())
	if err != nil || len(mk.all) != len(want) || again[0]["x"] != set[0]["x"] {
		t.Errorf("the second call made new communicators (%v)", err)
	}
	// No maker for the platform: a clear error.
	backend.RegisterDeviceCommMaker("fakedev", nil)
	e.freeDev = nil
	if _, err := e.deviceComms(context.Background()); err == nil || !strings.Contains(err.Error(), "cuda/nccl") {
		t.Errorf("without a maker: %v", err)
	}
}

// Across processes (one device each), the group's rank 0 makes the id, the
// ids travel in one AllGather over the processes per axis string, and each
// device joins its group with InitRank at its rank. Process 1 is played by
// a goroutine on the other rank of an in-process communicator.
func TestDeviceCommsAcrossProcesses(t *testing.T) {
	procs, err := collective.NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	dist.mu.Lock()
	saved := dist.on
	dist.on, dist.p, dist.np, dist.k, dist.gather = true, 0, 2, 1, procs[0]
	dist.mu.Unlock()
	defer func() {
		dist.mu.Lock()
		dist.on, dist.p, dist.np, dist.k, dist.gather = saved, 0, 1, 0, nil
		dist.mu.Unlock()
	}()
	mk := &recMaker{}
	backend.RegisterDeviceCommMaker("fakedev", mk)
	defer backend.RegisterDeviceCommMaker("fakedev", nil)
	for _, tc := range []struct {
		devs  []int
		other byte // process 1's id byte, when it leads
		want  string
	}{
		{[]int{0, 1}, 0, "[2/0 id101]"}, // this process's device is rank 0: it makes the id
		{[]int{1, 0}, 7, "[2/1 id7]"},   // process 1 leads: its id
	} {
		mk.joins = nil
		m := mustMesh(t, []int{2}, []string{"x"}, tc.devs...)
		e := &shardedExecutable{be: devCollBackend{}, part: &passes.Partitioned{Mesh: m, Axes: []string{"x"}}}
		done := make(chan error)
		go func() {
			mine := make([]byte, groupIDBytes)
			mine[0] = tc.other
			done <- procs[1].AllGather(context.Background(), ir.Uint8, nil, 0, mine, make([]byte, 2*groupIDBytes))
		}()
		set, err := e.deviceComms(context.Background())
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(mk.joins); got != tc.want || len(set) != 1 || set[0]["x"] == nil {
			t.Errorf("mesh devices %v: InitRank calls %s, want %s", tc.devs, got, tc.want)
		}
		mk.ids = 0
	}
}

// onePerProcess is a backend of one device that is no backend.Placer (as
// the CUDA backend): the CPU backend under another name.
type onePerProcess struct{ Backend }

func (onePerProcess) Name() string { return "onegpu" }

// A backend of one device that cannot place arrays on several devices
// still holds and runs its process's block of a mesh spread over the
// processes of a job, one device each (as the CUDA backend does under
// InitDistributed): DevicePut gives this process its one block, and a
// sharded function compiles for it.
func TestOneDevicePerProcessMesh(t *testing.T) {
	be := onePerProcess{DefaultBackend()}
	if len(be.Devices()) != 1 {
		t.Skip("the CPU backend has several devices here")
	}
	backend.Register(be)
	defer backend.Unregister(be)
	dist.mu.Lock()
	saved := dist.on
	dist.on, dist.p, dist.np, dist.k = true, 1, 2, 1
	dist.mu.Unlock()
	defer func() {
		dist.mu.Lock()
		dist.on, dist.p, dist.np, dist.k = saved, 0, 1, 0
		dist.mu.Unlock()
	}()
	m := mustMesh(t, []int{2}, []string{"x"})
	s, err := ir.NewNamedSharding(m, ir.P("x"))
	if err != nil {
		t.Fatal(err)
	}
	x := FromSlice([]float32{1, 2, 3, 4, 5, 6}, 6)
	y, err := DevicePut(x, s)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := Shards(y)
	if err != nil {
		t.Fatal(err)
	}
	if len(sh) != 1 || sh[0].Device.ID != 1 || !slices.Equal(sh[0].Array.Float32s(), []float32{4, 5, 6}) {
		t.Fatalf("shards %v, want this process's block [4 5 6] on device 1", sh)
	}
	f, err := ir.Parse(`func @f(%0: f32[6]{sharding<mesh[x=2], [{x}]>}) -> (f32[6]{sharding<mesh[x=2], [{x}]>}) {
  %1 = exp(%0) : f32[6]{sharding<mesh[x=2], [{x}]>}
  return %1
}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compileSharded(be, f, CompileOptions{}); err != nil {
		t.Fatalf("compileSharded over a mesh of one device per process: %v", err)
	}
}
