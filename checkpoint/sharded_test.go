package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/collective/mpi"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// inJob is set when the test process is one of an MPI job's.
var inJob bool

func TestMain(m *testing.M) {
	if !mpi.InMPIJob() {
		if err := rt.SetCPUDeviceCount(8); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(m.Run())
	}
	inJob = true
	if !settings.CPUDevices.IsSet() {
		if err := rt.SetCPUDeviceCount(2); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if err := rt.InitDistributed(rt.DistributedConfig{}); err != nil {
		fmt.Fprintln(os.Stderr, "InitDistributed:", err)
		os.Exit(2)
	}
	code := m.Run()
	if err := rt.ShutdownDistributed(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// ckTree is the tree of the sharded checkpoint tests.
type ckTree struct {
	A, B, C, D, E, F, G *trace.Array
}

// ckTypes are the leaves' dtypes and shapes, in field order.
var ckTypes = []ir.Type{
	{DType: ir.Float32, Shape: ir.Shape{16, 24}},
	{DType: ir.BFloat16, Shape: ir.Shape{8, 6}},
	{DType: ir.Int32, Shape: ir.Shape{4, 8}},
	{DType: ir.Float64, Shape: ir.Shape{6, 5}},
	{DType: ir.Bool, Shape: ir.Shape{10}},
	{DType: ir.Uint8, Shape: ir.Shape{3, 4, 5}},
	{DType: ir.Int64, Shape: ir.Shape{}},
}

// randomLiterals returns host values of the leaves drawn from seed: random
// bytes (0 or 1 for bools).
func randomLiterals(seed uint64) []*ir.Literal {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([]*ir.Literal, len(ckTypes))
	for i, t := range ckTypes {
		l := ir.NewLiteral(t)
		for j := range l.Data {
			l.Data[j] = byte(rng.Uint32())
			if t.DType == ir.Bool {
				l.Data[j] &= 1
			}
		}
		out[i] = l
	}
	return out
}

func mesh(t *testing.T, shape []int, names []string, devices ...int) *ir.Mesh {
	t.Helper()
	m, err := ir.NewMesh(shape, names, devices...)
	require.NoError(t, err)
	return m
}

// place makes the tree of values ls, leaf i laid out as specs[i] on
// meshes[i] (unsharded where meshes[i] is nil).
func place(t *testing.T, ls []*ir.Literal, meshes []*ir.Mesh, specs []ir.PartitionSpec) ckTree {
	t.Helper()
	leaves := make([]*trace.Array, len(ls))
	for i, l := range ls {
		x, err := rt.FromLiteral(l)
		require.NoError(t, err)
		if meshes[i] != nil {
			s, err := ir.NewNamedSharding(meshes[i], specs[i])
			require.NoError(t, err)
			y, err := rt.DevicePut(x, s)
			require.NoError(t, err)
			require.NoError(t, x.Delete())
			x = y
		}
		leaves[i] = x
	}
	return ckTree{leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5], leaves[6]}
}

func (c ckTree) leaves() []*trace.Array { return []*trace.Array{c.A, c.B, c.C, c.D, c.E, c.F, c.G} }

// zeros returns ls's types as zero literals.
func zeros() []*ir.Literal {
	out := make([]*ir.Literal, len(ckTypes))
	for i, t := range ckTypes {
		out[i] = ir.NewLiteral(t)
	}
	return out
}

// checkTree checks got's values bit for bit against want and its layout
// against meshes and specs.
func checkTree(t *testing.T, got ckTree, want []*ir.Literal, meshes []*ir.Mesh, specs []ir.PartitionSpec) {
	t.Helper()
	for i, x := range got.leaves() {
		s := x.Type().Sharding
		if meshes[i] == nil {
			require.Nil(t, s, "leaf %d", i)
		} else {
			require.NotNil(t, s, "leaf %d", i)
			require.True(t, s.Mesh.Equal(meshes[i]) && s.Spec.Equal(specs[i]), "leaf %d: %v", i, s)
		}
		l, err := x.Literal()
		require.NoError(t, err)
		require.Equal(t, want[i].Type.DType, l.Type.DType, "leaf %d", i)
		require.Equal(t, want[i].Data, l.Data, "leaf %d: values differ", i)
	}
}

// checkOwners checks dir's index against the saved layout and each data
// file against the index: every block is in the file of the process of the
// lowest device holding it, and each file holds exactly its blocks, once,
// with the original values.
func checkOwners(t *testing.T, dir string, want []*ir.Literal, meshes []*ir.Mesh, specs []ir.PartitionSpec) {
	t.Helper()
	idx, err := checkpoint.ReadIndex(dir)
	require.NoError(t, err)
	n := rt.ProcessCount()
	require.Equal(t, n, idx.Processes)
	require.Len(t, idx.Arrays, len(want))
	devs := rt.Devices()
	inFile := map[string]map[string]checkpoint.IndexBlock{}
	for i, a := range idx.Arrays {
		require.Equal(t, "ABCDEFG"[i:i+1], a.Path)
		require.Equal(t, []int(want[i].Type.Shape), a.Shape)
		if meshes[i] == nil {
			require.Empty(t, a.Sharding)
			require.Len(t, a.Blocks, 1)
			require.Equal(t, fmt.Sprintf("process-0-of-%d.save%s.safetensors", n, idx.SaveID), a.Blocks[0].File)
		} else {
			s, err := ir.ParseSharding(a.Sharding)
			require.NoError(t, err)
			require.True(t, s.Mesh.Equal(meshes[i]) && s.Spec.Equal(specs[i]), a.Sharding)
			// The reference owner of each block: the lowest device holding it.
			owner := map[string]int{}
			for _, g := range meshes[i].Devices() {
				start, _, err := s.ShardBounds(want[i].Type.Shape, g)
				require.NoError(t, err)
				k := fmt.Sprint(start)
				if o, ok := owner[k]; !ok || g < o {
					owner[k] = g
				}
			}
			require.Len(t, a.Blocks, len(owner), "%s: one entry per distinct block", a.Path)
			for _, b := range a.Blocks {
				g, ok := owner[fmt.Sprint(b.Start)]
				require.True(t, ok)
				require.Equal(t, fmt.Sprintf("process-%d-of-%d.save%s.safetensors", devs[g].Process, n, idx.SaveID), b.File, "%s block %v", a.Path, b.Start)
			}
		}
		for _, b := range a.Blocks {
			if inFile[b.File] == nil {
				inFile[b.File] = map[string]checkpoint.IndexBlock{}
			}
			inFile[b.File][b.Tensor] = b
		}
	}
	require.Len(t, idx.Files, n)
	for q := range n {
		name := fmt.Sprintf("process-%d-of-%d.save%s.safetensors", q, n, idx.SaveID)
		require.Equal(t, name, idx.Files[q].Name)
		data, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		hdr, _, err := checkpoint.ReadHeader(bytes.NewReader(data))
		require.NoError(t, err)
		base := 8 + int64(binary.LittleEndian.Uint64(data))
		require.Len(t, hdr, len(inFile[name]), "%s holds only its blocks", name)
		for tn, ti := range hdr {
			b, ok := inFile[name][tn]
			require.True(t, ok, "%s: tensor %q is not in the index", name, tn)
			i := int(b.Tensor[0] - 'A')
			require.Equal(t, block(want[i], b.Start, b.Limit), data[base+ti.DataOffsets[0]:base+ti.DataOffsets[1]], "%s: %s", name, tn)
		}
	}
}

// block cuts [start, limit) out of l, element by element (a reference).
func block(l *ir.Literal, start, limit []int) []byte {
	es := l.Type.DType.Size()
	shape := l.Type.Shape
	var out []byte
	idx := slices.Clone(start)
	for {
		for d := range idx {
			if idx[d] >= limit[d] {
				return out
			}
		}
		off := 0
		for d := range idx {
			off = off*shape[d] + idx[d]
		}
		out = append(out, l.Data[off*es:(off+1)*es]...)
		d := len(idx) - 1
		for ; d >= 0; d-- {
			if idx[d]++; idx[d] < limit[d] {
				break
			}
			idx[d] = start[d]
		}
		if d < 0 {
			return out
		}
	}
}

func TestShardedCheckpoint(t *testing.T) {
	if inJob {
		t.Skip("one process: see TestMPIShardedCheckpoint")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	want := randomLiterals(seed)
	m8 := mesh(t, []int{8}, []string{"x"})
	m24 := mesh(t, []int{2, 4}, []string{"x", "y"})
	m4 := mesh(t, []int{4}, []string{"x"})
	m2 := mesh(t, []int{2}, []string{"x"}, 6, 3)
	m42 := mesh(t, []int{4, 2}, []string{"a", "b"}, 7, 6, 5, 4, 3, 2, 1, 0)
	savedMeshes := []*ir.Mesh{m24, m8, m24, m24, nil, m24, nil}
	savedSpecs := []ir.PartitionSpec{ir.P("x", "y"), ir.P("x"), ir.P("y"), ir.P(), nil, ir.P("", "x"), nil}
	tree := place(t, want, savedMeshes, savedSpecs)
	dir := t.TempDir()
	require.NoError(t, checkpoint.SaveSharded(dir, tree, map[string]string{"step": "3"}))
	checkOwners(t, dir, want, savedMeshes, savedSpecs)
	idx, err := checkpoint.ReadIndex(dir)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"step": "3"}, idx.Metadata)

	layouts := []struct {
		name   string
		meshes []*ir.Mesh
		specs  []ir.PartitionSpec
	}{
		{"same", savedMeshes, savedSpecs},
		{"resharded", []*ir.Mesh{m4, m24, m8, m2, m2, nil, m8},
			[]ir.PartitionSpec{ir.P("", "x"), ir.P("y", "x"), ir.P("", "x"), ir.P("x"), ir.P("x"), nil, ir.P()}},
		{"reversed", []*ir.Mesh{m42, m42, m42, m42, m42, m42, m42},
			[]ir.PartitionSpec{{{"a", "b"}, nil}, ir.P("b", ""), ir.P("a", "b"), ir.P("b"), ir.P("b"), ir.P("", "a"), ir.P()}},
		{"unsharded", make([]*ir.Mesh, 7), make([]ir.PartitionSpec, 7)},
	}
	for _, lay := range layouts {
		t.Run(lay.name, func(t *testing.T) {
			like := place(t, zeros(), lay.meshes, lay.specs)
			got, err := checkpoint.LoadSharded(dir, like)
			require.NoError(t, err)
			checkTree(t, got, want, lay.meshes, lay.specs)
		})
	}

	// Saving the loaded tree anew on other shardings (permuted devices,
	// several axes on a dimension) gives a checkpoint that loads back the
	// same values.
	for _, lay := range layouts[1:3] {
		again, err := checkpoint.LoadSharded(dir, place(t, zeros(), lay.meshes, lay.specs))
		require.NoError(t, err)
		dir2 := t.TempDir()
		require.NoError(t, checkpoint.SaveSharded(dir2, again, nil))
		checkOwners(t, dir2, want, lay.meshes, lay.specs)
		got, err := checkpoint.LoadSharded(dir2, place(t, zeros(), savedMeshes, savedSpecs))
		require.NoError(t, err)
		checkTree(t, got, want, savedMeshes, savedSpecs)
	}
}

func TestShardedCheckpointErrors(t *testing.T) {
	if inJob {
		t.Skip("one process")
	}
	want := randomLiterals(1)
	m8 := mesh(t, []int{8}, []string{"x"})
	meshes := []*ir.Mesh{m8, m8, nil, nil, nil, nil, nil}
	specs := []ir.PartitionSpec{ir.P("x"), ir.P("x"), nil, nil, nil, nil, nil}
	dir := t.TempDir()
	require.NoError(t, checkpoint.SaveSharded(dir, place(t, want, meshes, specs), nil))
	like := place(t, zeros(), make([]*ir.Mesh, 7), make([]ir.PartitionSpec, 7))

	_, err := checkpoint.LoadSharded(t.TempDir(), like)
	require.ErrorContains(t, err, "no sharded checkpoint in")

	// Another tree: a leaf missing from the checkpoint and one not in the tree.
	other := struct{ A, B, C, D, E, F, H *trace.Array }{like.A, like.B, like.C, like.D, like.E, like.F, like.G}
	_, err = checkpoint.LoadSharded(dir, other)
	require.ErrorContains(t, err, `array "H" is missing from the checkpoint`)
	require.ErrorContains(t, err, `the checkpoint has array "G", which is not in the tree`)

	// Wrong shape and dtype.
	bad := like
	bad.A = trace.Zeros(ir.Shape{16, 11}, ir.Float32)
	bad.C = trace.Zeros(ir.Shape{4, 8}, ir.Float32)
	_, err = checkpoint.LoadSharded(dir, bad)
	require.ErrorContains(t, err, `array "A" is f32[16,24] in the checkpoint, want f32[16,11]`)
	require.ErrorContains(t, err, `array "C" is i32[4,8] in the checkpoint, want f32[4,8]`)

	// A missing data file.
	require.NoError(t, os.Rename(filepath.Join(dir, "process-0-of-1.save1.safetensors"), filepath.Join(dir, "moved")))
	_, err = checkpoint.LoadSharded(dir, like)
	require.ErrorContains(t, err, "process-0-of-1.save1.safetensors")
	require.NoError(t, os.Rename(filepath.Join(dir, "moved"), filepath.Join(dir, "process-0-of-1.save1.safetensors")))
	_, err = checkpoint.LoadSharded(dir, like)
	require.NoError(t, err)

	// A corrupt index.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "index.json"), []byte(`{"format":"x"}`), 0o644))
	_, err = checkpoint.LoadSharded(dir, like)
	require.ErrorContains(t, err, `format "x"`)
}

// TestMPIShardedCheckpoint saves a tree sharded over the devices of the
// processes of an MPI job and loads it resharded, in this job or in a job
// of another process count (.ci/mpi.sh): FERRY_CKPT_MPI=save writes the
// checkpoint to FERRY_CKPT_DIR (a directory every process sees) and loads
// it back on other shardings; FERRY_CKPT_MPI=load loads it on shardings
// over all the devices of this job. The values are drawn from a fixed
// seed, so every job knows them.
func TestMPIShardedCheckpoint(t *testing.T) {
	phase, dir := settings.CkptMPI.Get(), settings.CkptDir.Get()
	if !inJob || dir == "" || (phase != "save" && phase != "load") {
		t.Skip("run under mpirun with FERRY_CKPT_MPI=save|load and FERRY_CKPT_DIR (.ci/mpi.sh)")
	}
	want := randomLiterals(20261125)
	n := len(rt.Devices())
	all := mesh(t, []int{n}, []string{"x"})
	grid := mesh(t, []int{2, n / 2}, []string{"x", "y"})
	// The first devices of the first one or two processes, reversed.
	var some []int
	for _, d := range rt.Devices() {
		if d.ID%len(rt.LocalDevices()) == 0 && d.Process < min(rt.ProcessCount()-1, 2) || rt.ProcessCount() == 1 && d.ID == 0 {
			some = append([]int{d.ID}, some...)
		}
	}
	few := mesh(t, []int{len(some)}, []string{"x"}, some...)
	savedMeshes := []*ir.Mesh{grid, all, grid, grid, nil, grid, nil}
	savedSpecs := []ir.PartitionSpec{ir.P("x", "y"), ir.P("x"), ir.P("y"), ir.P(), nil, ir.P("", "x"), nil}
	if phase == "save" {
		require.NoError(t, checkpoint.SaveSharded(dir, place(t, want, savedMeshes, savedSpecs), nil))
		checkOwners(t, dir, want, savedMeshes, savedSpecs)
	}
	meshes := []*ir.Mesh{all, grid, few, few, grid, nil, all}
	specs := []ir.PartitionSpec{ir.P("", "x"), ir.P("y", "x"), ir.P("", "x"), ir.P("x"), ir.P("x"), nil, ir.P()}
	got, err := checkpoint.LoadSharded(dir, place(t, zeros(), meshes, specs))
	require.NoError(t, err)
	checkTree(t, got, want, meshes, specs)
	t.Logf("process %d of %d: loaded the checkpoint of %s resharded", rt.ProcessIndex(), rt.ProcessCount(), dir)
}
