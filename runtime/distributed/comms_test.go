package distributed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

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
}

func (c *recComm) Rank() int    { return c.rank }
func (c *recComm) Size() int    { return c.size }
func (c *recComm) Abort() error { return nil }

func (m *recMaker) InitAll(devices []int) ([]backend.DeviceCommunicator, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.all = append(m.all, slices.Clone(devices))
	var out []backend.DeviceCommunicator
	for i := range devices {
		out = append(out, &recComm{rank: i, size: len(devices)})
	}
	return out, nil
}

func (m *recMaker) NewGroupID() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ids++
	id := make([]byte, GroupIDBytes)
	id[0] = 100 + m.ids
	return id, nil
}

func (m *recMaker) InitRank(id []byte, size, rank int) (backend.DeviceCommunicator, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.joins = append(m.joins, fmt.Sprintf("%d/%d id%d", size, rank, id[0]))
	return &recComm{rank: rank, size: size}, nil
}

func mustMesh(t *testing.T, shape []int, names []string, devs ...int) *ir.Mesh {
	t.Helper()
	m, err := ir.NewMesh(shape, names, devs...)
	if err != nil {
		t.Fatal(err)
	}
	return m
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
	job := &Job{p: 0, np: 2, k: 1, gather: procs[0]}
	mk := &recMaker{}
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
		done := make(chan error)
		go func() {
			mine := make([]byte, GroupIDBytes)
			mine[0] = tc.other
			done <- procs[1].AllGather(context.Background(), ir.Uint8, nil, 0, mine, make([]byte, 2*GroupIDBytes))
		}()
		set, err := job.DeviceComms(context.Background(), mk, m, []string{"x"})
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

// In one process (a nil job), each group of the mesh along each axis string
// is one InitAll over its devices in rank order, and each device gets the
// communicator of its rank.
func TestDeviceCommsOneProcess(t *testing.T) {
	mk := &recMaker{}
	m := mustMesh(t, []int{2, 2}, []string{"x", "y"}, 3, 2, 1, 0)
	var job *Job
	set, err := job.DeviceComms(context.Background(), mk, m, []string{"x", "x,y", "y"})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{3, 1}, {2, 0}, {3, 2, 1, 0}, {3, 2}, {1, 0}}
	if fmt.Sprint(mk.all) != fmt.Sprint(want) {
		t.Errorf("InitAll calls %v, want %v", mk.all, want)
	}
	for r := range 4 {
		for ax, rank := range map[string]int{"x": r / 2, "y": r % 2, "x,y": r} {
			if c := set[r][ax]; c == nil || c.Rank() != rank {
				t.Errorf("position %d, axis %s: %v, want rank %d", r, ax, c, rank)
			}
		}
	}
}

// A job of two processes of two devices each, made over an in-process
// communicator: each process knows its devices' global IDs, and the
// barrier tells both which process failed; after Close, collectives fail
// with ErrEnded.
func TestJobOfTwoProcesses(t *testing.T) {
	procs, err := collective.NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	jobs := make([]*Job, 2)
	errs := OnEachDevice(2, func(p int) (err error) {
		jobs[p], err = New(context.Background(), procs[p], 2)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	m := mustMesh(t, []int{4}, []string{"x"}, 3, 0, 2, 1)
	local := []backend.Device{{Platform: "cpu", ID: 0}, {Platform: "cpu", ID: 1}}
	for p, j := range jobs {
		if j.Process() != p || j.Processes() != 2 || j.DevicesPerProcess() != 2 {
			t.Errorf("process %d: Process %d, Processes %d, DevicesPerProcess %d", p, j.Process(), j.Processes(), j.DevicesPerProcess())
		}
		devs := j.Devices(local)
		for g, d := range devs {
			if d.ID != g || d.Process != g/2 {
				t.Errorf("process %d: device %d is %+v", p, g, d)
			}
			id, ok := j.LocalID(g)
			if ok != (g/2 == p) || ok && (id != g%2 || j.GlobalID(id) != g) {
				t.Errorf("process %d: LocalID(%d) = %d, %v", p, g, id, ok)
			}
		}
		// Mesh positions of this process's devices: 3 and 2 are process 1's.
		want := map[int][]int{0: {1, 3}, 1: {0, 2}}[p]
		if got := j.LocalPositions(m); !slices.Equal(got, want) {
			t.Errorf("process %d: LocalPositions %v, want %v", p, got, want)
		}
		if !j.SpansProcesses(m) || !slices.Equal(j.MeshProcesses(m), []int{1, 0}) {
			t.Errorf("process %d: MeshProcesses %v", p, j.MeshProcesses(m))
		}
	}
	failed := make([][]int, 2)
	errs = OnEachDevice(2, func(p int) (err error) {
		failed[p], err = jobs[p].Barrier(p == 0)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for p := range 2 {
		if !slices.Equal(failed[p], []int{1}) {
			t.Errorf("process %d: the barrier says %v failed, want [1]", p, failed[p])
		}
	}
	for _, j := range jobs {
		if err := j.Close(); err != nil {
			t.Error(err)
		}
	}
	if _, err := jobs[0].Exchange(context.Background(), []byte{1}); !errors.Is(err, ErrEnded) {
		t.Errorf("Exchange after Close: %v, want ErrEnded", err)
	}
}
