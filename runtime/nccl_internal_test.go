package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/runtime/distributed"
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
	id := make([]byte, distributed.GroupIDBytes)
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
	// This process is process 1 of a job of two processes of one device
	// each; process 0 is played by the other rank of an in-process
	// communicator.
	procs, err := collective.NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	jobs := make([]*distributed.Job, 2)
	errs := distributed.OnEachDevice(2, func(p int) (err error) {
		jobs[p], err = distributed.New(context.Background(), procs[p], 1)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	dist.mu.Lock()
	saved := dist.job
	dist.job = jobs[1]
	dist.mu.Unlock()
	defer func() {
		dist.mu.Lock()
		dist.job = saved
		dist.mu.Unlock()
		for _, j := range jobs {
			_ = j.Close()
		}
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
