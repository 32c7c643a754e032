package checkpoint_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Save parameters and an optimizer state together, inspect the header, and
// load them back into a tree of the same shape.
func Example() {
	type Params struct{ W, B *trace.Array }
	type TrainState struct {
		Params Params
		Opt    optim.AdamState[Params]
	}
	params := Params{W: rt.FromSlice([]float32{1, 2, 3, 4}, 2, 2), B: rt.FromSlice([]float32{0.5, -0.5})}
	opt := optim.Adam[Params](optim.Constant(0.1), 0.9, 0.999, 1e-8)
	st, _ := opt.Init(params)
	_, st, _ = opt.Update(params, st, params) // one step: Count 1, nonzero moments

	var buf bytes.Buffer // or checkpoint.SaveFile("model.safetensors", ...)
	if err := checkpoint.Save(&buf, TrainState{params, st}, map[string]string{"epoch": "3"}); err != nil {
		panic(err)
	}

	infos, meta, _ := checkpoint.ReadHeader(bytes.NewReader(buf.Bytes()))
	fmt.Println(infos["Params.W"].DType, infos["Params.W"].Shape, infos["Opt.Count"].DType, infos["Opt.Mu.W"].Shape, meta["epoch"])

	// A tree to load into: zero parameters and a fresh state for them.
	like := TrainState{Params: Params{W: trace.Zeros([]int{2, 2}, params.W.DType()), B: trace.Zeros([]int{2}, params.B.DType())}}
	like.Opt, _ = opt.Init(like.Params)
	got, err := checkpoint.Load(bytes.NewReader(buf.Bytes()), like)
	if err != nil {
		panic(err)
	}
	fmt.Println(got.Params.W.Float32s(), got.Params.B.Float32s(), got.Opt.Count.Item(), got.Opt.Nu.B.Float32s())

	like.Params.W = trace.Zeros([]int{3}, params.W.DType())
	_, err = checkpoint.Load(bytes.NewReader(buf.Bytes()), like)
	fmt.Println(err)
	// Output:
	// F32 [2 2] I32 [2 2] 3
	// [1 2 3 4] [0.5 -0.5] 1 [0.00025 0.00025]
	// checkpoint.Load: tensor "Params.W" is f32[2,2] in the file, want f32[3]
}

// Save a matrix sharded over a 2×4 mesh of devices (one data file per
// process, one index) and load it back laid out over 4 devices by columns.
// In a job of several processes (rt.InitDistributed) every process makes
// the same calls with a directory they all see. (The tests give this
// process 8 CPU devices: FERRY_CPU_DEVICES=8 or rt.SetCPUDeviceCount.)
func ExampleSaveSharded() {
	type Params struct{ W *trace.Array }
	grid, _ := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	byBlocks, _ := ir.NewNamedSharding(grid, ir.P("x", "y"))
	w, err := rt.DevicePut(rt.FromSlice([]float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 2, 8), byBlocks)
	if err != nil {
		panic(err)
	}
	dir, _ := os.MkdirTemp("", "ckpt")
	defer os.RemoveAll(dir)
	if err := checkpoint.SaveSharded(dir, Params{W: w}, map[string]string{"step": "100"}); err != nil {
		panic(err)
	}
	idx, _ := checkpoint.ReadIndex(dir)
	a := idx.Arrays[0]
	fmt.Println(idx.SaveID, idx.Files[0].Name, idx.Metadata["step"], a.Sharding, len(a.Blocks), a.Blocks[5].Start, a.Blocks[5].Tensor)

	four, _ := ir.NewMesh([]int{4}, []string{"d"})
	byColumns, _ := ir.NewNamedSharding(four, ir.P("", "d"))
	like, _ := rt.DevicePut(trace.Zeros([]int{2, 8}, ir.Float32), byColumns)
	got, err := checkpoint.LoadSharded(dir, Params{W: like})
	if err != nil {
		panic(err)
	}
	shards, _ := rt.Shards(got.W)
	fmt.Println(got.W.Type(), shards[1].Array.Float32s())
	// Output:
	// 1 process-0-of-1.save1.safetensors 100 sharding<mesh[x=2,y=4], [x,y]> 8 [1 2] W@1,2
	// f32[2,8]{sharding<mesh[d=4], [{},d]>} [2 3 10 11]
}

// Save a checkpoint readable only by its owner: WithFileMode sets the mode
// of the files SaveFile and SaveSharded create (0644 by default; the umask
// applies).
func ExampleWithFileMode() {
	dir, _ := os.MkdirTemp("", "ckpt")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "params.safetensors")
	params := struct{ W *trace.Array }{rt.FromSlice([]float32{1, 2, 3})}
	if err := checkpoint.SaveFile(path, params, nil, checkpoint.WithFileMode(0o600)); err != nil {
		panic(err)
	}
	st, _ := os.Stat(path)
	fmt.Println(st.Mode().Perm())
	// Output:
	// -rw-------
}
