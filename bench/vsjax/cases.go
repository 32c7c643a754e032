package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Tensor is an array sent to the JAX side: little-endian bytes in C order.
type Tensor struct {
	Name  string `json:"name"`
	DType string `json:"dtype"` // numpy's name: float32, int32
	Shape []int  `json:"shape"`
	Data  []byte `json:"-"`
}

func f32Tensor(name string, data []float32, shape ...int) Tensor {
	b := make([]byte, 4*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return Tensor{Name: name, DType: "float32", Shape: append([]int{}, shape...), Data: b}
}

func i32Tensor(name string, data []int32, shape ...int) Tensor {
	b := make([]byte, 4*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return Tensor{Name: name, DType: "int32", Shape: append([]int{}, shape...), Data: b}
}

// Result is what one side's check produced: a training step's losses over a
// few steps from the shared initial values, or a function's output.
type Result struct {
	Losses  []float64
	Out     []float32
	FirstMS float64 // wall time of the first call: trace, compile and run
}

// Case is one row: the Ferry program, ready to run in this process, and what
// the JAX side needs to build its twin (bench/jax/bench.py, case JAXCase).
type Case struct {
	Name    string         // row name
	What    string         // one line for the table
	JAXCase string         // bench.py's case
	Cfg     map[string]any // bench.py's settings for the case
	Arrays  []Tensor       // the inputs (and initial parameters) both sides use
	Steps   int            // check: training steps compared (0: a function, its output compared)
	Tol     float64        // check: relative tolerance
	// Call runs the Ferry program once (a training step advances its state).
	Call func() error
	// Check runs the Ferry program from the initial values: Steps training
	// steps, or one call of the function. Call it before Call so that its
	// first call includes the compile.
	Check func() (Result, error)
}

func randF32(n int, seed uint64, lo, hi float32) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	s := make([]float32, n)
	for i := range s {
		s[i] = lo + rng.Float32()*(hi-lo)
	}
	return s
}

func randI32(n int, seed uint64, below int) []int32 {
	rng := rand.New(rand.NewPCG(seed, 2))
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(rng.IntN(below))
	}
	return s
}

// fnCase makes the Case of a jitted function with one f32 result; call runs
// it once on its inputs (the host copies of ins, made into arrays by args).
func fnCase(name, what, jaxCase string, ins []Tensor, call func() *trace.Array) *Case {
	return &Case{
		Name: name, What: what, JAXCase: jaxCase, Arrays: ins, Tol: 1e-4,
		Call: func() (err error) {
			defer trace.Recover(&err)
			return call().Delete()
		},
		Check: func() (res Result, err error) {
			defer trace.Recover(&err)
			t0 := now()
			out := call()
			res.FirstMS = sinceMS(t0)
			res.Out = out.Float32s()
			return res, out.Delete()
		},
	}
}

// AddCase is a jitted a+b of two f32 scalars: the cost of one call.
func AddCase() *Case {
	a, b := rt.FromScalar(float32(1.5)), rt.FromScalar(float32(-0.25))
	f := rt.Jit(func(a, b *trace.Array) *trace.Array { return trace.Add(a, b) })
	return fnCase("add", "jitted scalar f32 add (cost of a call)", "add",
		[]Tensor{f32Tensor("a", []float32{1.5}), f32Tensor("b", []float32{-0.25})},
		func() *trace.Array { return f(a, b) })
}

// MatMulCase is a jitted f32 product a[m,k]·b[k,n], inputs uniform in [-1, 1).
func MatMulCase(m, n, k int) *Case {
	ah, bh := randF32(m*k, 1, -1, 1), randF32(k*n, 2, -1, 1)
	a, b := rt.FromSlice(ah, m, k), rt.FromSlice(bh, k, n)
	f := rt.Jit(func(a, b *trace.Array) *trace.Array { return trace.MatMul(a, b) })
	return fnCase(fmt.Sprintf("matmul_%dx%dx%d", m, n, k),
		fmt.Sprintf("f32 matmul m×n×k = %d×%d×%d", m, n, k), "matmul",
		[]Tensor{f32Tensor("a", ah, m, k), f32Tensor("b", bh, k, n)},
		func() *trace.Array { return f(a, b) })
}

// GeluCase is bench/cpu's fused gelu(x*w+b) (tanh form) over x f32[rows, cols]
// with w and b f32[cols] broadcast: x uniform in [-2, 2), w and b in [-1, 1).
func GeluCase(rows, cols int) *Case {
	xh, wh, bh := randF32(rows*cols, 3, -2, 2), randF32(cols, 4, -1, 1), randF32(cols, 5, -1, 1)
	x, w, b := rt.FromSlice(xh, rows, cols), rt.FromSlice(wh, cols), rt.FromSlice(bh, cols)
	f := rt.Jit(func(x, w, b *trace.Array) *trace.Array {
		return trace.Gelu(trace.Add(trace.Mul(x, w), b), true)
	})
	return fnCase(fmt.Sprintf("gelu_%dx%d", rows, cols),
		fmt.Sprintf("fused gelu(x*w+b), x f32[%d,%d]", rows, cols), "gelu",
		[]Tensor{f32Tensor("x", xh, rows, cols), f32Tensor("w", wh, cols), f32Tensor("b", bh, cols)},
		func() *trace.Array { return f(x, w, b) })
}

// snapshot is a tree of concrete arrays kept on the host, to make fresh
// copies of it (a training step donates its parameters).
type snapshot struct {
	def    *trace.TreeDef
	data   [][]float32
	shapes [][]int
}

func takeSnapshot(tree any) (*snapshot, error) {
	leaves, def, err := trace.Flatten(tree)
	if err != nil {
		return nil, err
	}
	s := &snapshot{def: def}
	for _, l := range leaves {
		if l.DType() != ir.Float32 {
			return nil, fmt.Errorf("leaf of dtype %v: only f32 parameters are copied", l.DType())
		}
		s.data = append(s.data, l.Float32s())
		s.shapes = append(s.shapes, []int(l.Shape()))
	}
	return s, nil
}

func (s *snapshot) tensors(names []string) ([]Tensor, error) {
	if len(names) != len(s.data) {
		return nil, fmt.Errorf("%d leaves, %d names", len(s.data), len(names))
	}
	var ts []Tensor
	for i := range s.data {
		ts = append(ts, f32Tensor(names[i], s.data[i], s.shapes[i]...))
	}
	return ts, nil
}

func fresh[P any](s *snapshot) (P, error) {
	var p P
	leaves := make([]*trace.Array, len(s.data))
	for i := range s.data {
		leaves[i] = rt.FromSlice(s.data[i], s.shapes[i]...)
	}
	v, err := s.def.Unflatten(leaves)
	if err != nil {
		return p, err
	}
	p, ok := v.(P)
	if !ok {
		return p, fmt.Errorf("snapshot holds %T, want %T", v, p)
	}
	return p, nil
}

// stepCase makes the Case of a training step with params (type P) and
// optimizer state (S) donated, on fixed inputs x, y.
func stepCase[P, S any](c *Case, init *snapshot, opt optim.Optimizer[P, S],
	step func(p P, s S, x, y *trace.Array) (P, S, *trace.Array, error), x, y *trace.Array) *Case {
	jstep := rt.Jit(step, rt.Donate(0, 1))
	var p P
	var s S
	start := func() error {
		var err error
		if p, err = fresh[P](init); err != nil {
			return err
		}
		s, err = opt.Init(p)
		return err
	}
	c.Call = func() (err error) {
		defer trace.Recover(&err)
		var loss *trace.Array
		if p, s, loss, err = jstep(p, s, x, y); err != nil {
			return err
		}
		return loss.Delete()
	}
	c.Check = func() (res Result, err error) {
		defer trace.Recover(&err)
		if err := start(); err != nil {
			return res, err
		}
		for i := range c.Steps {
			t0 := now()
			var loss *trace.Array
			if p, s, loss, err = jstep(p, s, x, y); err != nil {
				return res, err
			}
			l := loss.Item()
			if i == 0 {
				res.FirstMS = sinceMS(t0)
			}
			res.Losses = append(res.Losses, l)
			if err := loss.Delete(); err != nil {
				return res, err
			}
		}
		return res, start() // timing starts from the initial values too
	}
	return c
}

// MLPSize is the MLP row's size.
type MLPSize struct{ Batch, In, Hidden, Classes int }

// mlpParams initialises examples/mlp's model In → Hidden → Classes (key 0)
// and returns it, its host snapshot, and its leaves as the JAX side names
// them (w0, b0, w1, b1).
func mlpParams(sz MLPSize) (nn.MLP, *snapshot, []Tensor, error) {
	sizes := []int{sz.In, sz.Hidden, sz.Classes}
	params := rt.Jit(func(key *trace.Array) nn.MLP {
		return nn.NewMLP(key, ir.Float32, sizes, nn.Relu)
	})(random.NewKey(0))
	init, err := takeSnapshot(params)
	if err != nil {
		return nn.MLP{}, nil, nil, err
	}
	ts, err := init.tensors([]string{"w0", "b0", "w1", "b1"})
	return params, init, ts, err
}

// MLPCase is examples/mlp's training step: an nn.MLP In → Hidden → Classes
// with ReLU, mean softmax cross-entropy, Adam (lr 1e-3, 0.9, 0.999, 1e-8),
// params and optimizer state donated; x uniform in [0, 1) (pixels), labels
// uniform over the classes.
func MLPCase(sz MLPSize) (c *Case, err error) {
	defer trace.Recover(&err)
	_, init, ts, err := mlpParams(sz)
	if err != nil {
		return nil, err
	}
	const lr = 1e-3
	xs, ys := randF32(sz.Batch*sz.In, 6, 0, 1), randI32(sz.Batch, 7, sz.Classes)
	c = &Case{
		Name:    "mlp_step",
		What:    fmt.Sprintf("examples/mlp train step: %d-%d-%d ReLU, Adam, batch %d", sz.In, sz.Hidden, sz.Classes, sz.Batch),
		JAXCase: "mlp", Cfg: map[string]any{"lr": lr}, Steps: 3, Tol: 1e-3,
		Arrays: append(ts, f32Tensor("x", xs, sz.Batch, sz.In), i32Tensor("y", ys, sz.Batch)),
	}
	opt := optim.Adam[nn.MLP](optim.Constant(lr), 0.9, 0.999, 1e-8)
	step := func(p nn.MLP, s optim.AdamState[nn.MLP], x, y *trace.Array) (nn.MLP, optim.AdamState[nn.MLP], *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p nn.MLP) *trace.Array {
			return nn.SoftmaxCrossEntropy(p.Apply(x), y)
		})(p)
		p, s, err := optim.Step(opt, g, s, p)
		return p, s, loss, err
	}
	return stepCase(c, init, opt, step, rt.FromSlice(xs, sz.Batch, sz.In), rt.FromSlice(ys, sz.Batch)), nil
}

// PerExampleCase is the first step of DP-SGD on examples/mlp's model:
// per-example gradients of its loss (trace.Vmap of trace.Grad over the
// examples, the parameters not mapped), reduced to each example's squared
// gradient norm, jitted; JAX's twin is jax.vmap(jax.grad(loss), in_axes=(None,
// 0, 0)).
func PerExampleCase(sz MLPSize) (c *Case, err error) {
	defer trace.Recover(&err)
	params, _, ts, err := mlpParams(sz)
	if err != nil {
		return nil, err
	}
	xs, ys := randF32(sz.Batch*sz.In, 8, 0, 1), randI32(sz.Batch, 9, sz.Classes)
	x, y := rt.FromSlice(xs, sz.Batch, sz.In), rt.FromSlice(ys, sz.Batch)
	f := rt.Jit(func(p nn.MLP, x, y *trace.Array) *trace.Array {
		g := trace.Vmap(func(xe, ye *trace.Array) nn.MLP {
			return trace.Grad(func(p nn.MLP) *trace.Array {
				return nn.SoftmaxCrossEntropy(p.Apply(trace.ExpandDims(xe, 0)), trace.ExpandDims(ye, 0))
			})(p)
		})(x, y)
		var total *trace.Array
		for _, l := range trace.Leaves(g) {
			sq := trace.Sum(trace.Square(trace.Reshape(l, sz.Batch, l.Size()/sz.Batch)), 1)
			if total == nil {
				total = sq
			} else {
				total = trace.Add(total, sq)
			}
		}
		return total
	})
	return fnCase("per_example_grads",
		fmt.Sprintf("per-example gradient norms (Vmap of Grad), %d-%d-%d ReLU MLP, batch %d", sz.In, sz.Hidden, sz.Classes, sz.Batch),
		"per_example", append(ts, f32Tensor("x", xs, sz.Batch, sz.In), i32Tensor("y", ys, sz.Batch)),
		func() *trace.Array { return f(params, x, y) }), nil
}

// TFSize is the Transformer row's size and optimizer settings
// (examples/transformer's defaults in DefaultSizes).
type TFSize struct {
	Vocab, Batch, Seq, Layers, D, Heads int
	LR, EndLR, WeightDecay, Clip        float64
	Warmup, Total                       int
}

// tfModel is examples/transformer's model.
type tfModel = nn.TransformerLM

// tfLeaves names tfModel's leaves in trace.Flatten's order, as bench.py's
// TF_LEAVES expects them.
var tfLeaves = []string{"tok", "pos",
	"ln1_scale", "ln1_bias", "wq", "wk", "wv", "wo", "ln2_scale", "ln2_bias",
	"w1", "b1", "w2", "b2",
	"norm_scale", "norm_bias"}

// TransformerCase is examples/transformer's training step at its default size:
// chain(ClipByGlobalNorm, AdamW(WarmupCosine)), params and optimizer state
// donated, on one batch of random token windows (inputs tok[:, :-1], labels
// tok[:, 1:]).
func TransformerCase(sz TFSize) (c *Case, err error) {
	defer trace.Recover(&err)
	params := rt.Jit(func(k *trace.Array) tfModel {
		return nn.NewTransformerLM(k, ir.Float32, sz.Vocab, sz.Seq, sz.Layers, sz.D, sz.Heads, 4*sz.D)
	})(random.NewKey(0))
	init, err := takeSnapshot(params)
	if err != nil {
		return nil, err
	}
	ts, err := init.tensors(tfLeaves)
	if err != nil {
		return nil, err
	}
	tok := randI32(sz.Batch*(sz.Seq+1), 8, sz.Vocab)
	xs, ys := make([]int32, sz.Batch*sz.Seq), make([]int32, sz.Batch*sz.Seq)
	for b := range sz.Batch {
		copy(xs[b*sz.Seq:], tok[b*(sz.Seq+1):b*(sz.Seq+1)+sz.Seq])
		copy(ys[b*sz.Seq:], tok[b*(sz.Seq+1)+1:(b+1)*(sz.Seq+1)])
	}
	c = &Case{
		Name: "transformer_step",
		What: fmt.Sprintf("examples/transformer train step: batch %d, seq %d, %d layers, d %d, %d heads, vocab %d, AdamW",
			sz.Batch, sz.Seq, sz.Layers, sz.D, sz.Heads, sz.Vocab),
		JAXCase: "transformer", Steps: 3, Tol: 1e-3,
		Cfg: map[string]any{"heads": sz.Heads, "lr": sz.LR, "end_lr": sz.EndLR, "warmup": sz.Warmup,
			"total": sz.Total, "weight_decay": sz.WeightDecay, "clip": sz.Clip},
		Arrays: append(ts, i32Tensor("x", xs, sz.Batch, sz.Seq), i32Tensor("y", ys, sz.Batch, sz.Seq)),
	}
	opt := optim.Chain(
		optim.ClipByGlobalNorm[tfModel](sz.Clip),
		optim.AdamW[tfModel](optim.WarmupCosine(sz.LR, sz.Warmup, sz.Total, sz.EndLR), 0.9, 0.95, 1e-8, sz.WeightDecay),
	)
	type optState = optim.ChainState[optim.EmptyState, optim.AdamState[tfModel]]
	step := func(p tfModel, s optState, x, y *trace.Array) (tfModel, optState, *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p tfModel) *trace.Array { return p.Loss(x, y) })(p)
		upd, s2, err := opt.Update(g, s, p)
		if err != nil {
			return p, s, loss, err
		}
		p2, err := optim.ApplyUpdates(p, upd)
		return p2, s2, loss, err
	}
	return stepCase(c, init, opt, step, rt.FromSlice(xs, sz.Batch, sz.Seq), rt.FromSlice(ys, sz.Batch, sz.Seq)), nil
}

// Sizes are the rows' sizes.
type Sizes struct {
	MLP     MLPSize
	TF      TFSize
	MatMuls [][3]int // m, n, k
	Gelu    [2]int   // rows, cols
	// PerExample is the per-example gradients row's MLP and batch.
	PerExample MLPSize
}

// DefaultSizes are the benchmark's: examples/mlp's and examples/transformer's
// defaults, bench/cpu's gelu.
var DefaultSizes = Sizes{
	MLP: MLPSize{Batch: 128, In: 784, Hidden: 512, Classes: 10},
	TF: TFSize{Vocab: 96, Batch: 32, Seq: 64, Layers: 4, D: 128, Heads: 4,
		LR: 3e-3, EndLR: 3e-4, WeightDecay: 0.01, Clip: 1, Warmup: 100, Total: 2000},
	MatMuls: [][3]int{{16, 128, 32}, {128, 128, 256}, {1536, 1920, 1024}},
	Gelu:    [2]int{4096, 1024},
	// DP-SGD's usual shape: small batches, the per-example gradients of
	// every parameter held at once (32 × 1.6 MB for the first layer).
	PerExample: MLPSize{Batch: 32, In: 784, Hidden: 512, Classes: 10},
}

// TinySizes are small enough for a test or a quick check of the JAX side
// (-tiny): every row's program at a few dozen elements.
var TinySizes = Sizes{
	MLP: MLPSize{Batch: 8, In: 12, Hidden: 16, Classes: 5},
	TF: TFSize{Vocab: 11, Batch: 2, Seq: 8, Layers: 2, D: 16, Heads: 2,
		LR: 3e-3, EndLR: 3e-4, WeightDecay: 0.01, Clip: 1, Warmup: 2, Total: 20},
	MatMuls:    [][3]int{{3, 5, 7}, {16, 8, 4}, {9, 17, 33}},
	Gelu:       [2]int{4, 6},
	PerExample: MLPSize{Batch: 4, In: 12, Hidden: 16, Classes: 5},
}

// Row is a benchmark row, built on demand.
type Row struct {
	Name  string
	Build func() (*Case, error)
}

// Rows lists every row at the given sizes, in the order they are run.
func Rows(sz Sizes) []Row {
	rows := []Row{{"add", func() (*Case, error) { return AddCase(), nil }}}
	for _, m := range sz.MatMuls {
		rows = append(rows, Row{fmt.Sprintf("matmul_%dx%dx%d", m[0], m[1], m[2]),
			func() (*Case, error) { return MatMulCase(m[0], m[1], m[2]), nil }})
	}
	rows = append(rows,
		Row{fmt.Sprintf("gelu_%dx%d", sz.Gelu[0], sz.Gelu[1]), func() (*Case, error) { return GeluCase(sz.Gelu[0], sz.Gelu[1]), nil }},
		Row{"mlp_step", func() (*Case, error) { return MLPCase(sz.MLP) }},
		Row{"per_example_grads", func() (*Case, error) { return PerExampleCase(sz.PerExample) }},
		Row{"transformer_step", func() (*Case, error) { return TransformerCase(sz.TF) }},
	)
	return rows
}
