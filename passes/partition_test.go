package passes_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// spmdRun runs the per-device program of part on every device of its mesh,
// each on its blocks of args, with an interpreter written here (eval per op;
// collectives through collective.Local; scan bodies iterated here), and
// assembles the global results, checking that devices holding the same
// block agree.
func spmdRun(t *testing.T, part *passes.Partitioned, args []*ir.Literal) []*ir.Literal {
	t.Helper()
	m := part.Mesh
	devs := m.Devices()
	world, err := collective.NewLocal(len(devs))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	outs := make([][]*ir.Literal, len(devs))
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for rank, dev := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					errs[rank] = fmt.Errorf("panic: %v", p)
					world[rank].Abort(errs[rank])
				}
			}()
			comms := map[string]collective.Communicator{}
			for _, ax := range part.Axes {
				var idx []int
				for _, name := range strings.Split(ax, ",") {
					idx = append(idx, m.AxisIndex(name))
				}
				c, err := collective.MeshAxes(ctx, world[rank], m.Shape(), idx...)
				if err != nil {
					errs[rank] = err
					world[rank].Abort(err)
					return
				}
				comms[ax] = c
			}
			in := make([]*ir.Literal, len(args))
			for i, l := range args {
				start, limit, err := part.Params[i].ShardBounds(l.Type.Shape, dev)
				if err != nil {
					errs[rank] = err
					return
				}
				in[i] = block(l, start, limit)
				in[i].Type.Space = l.Type.Space
			}
			s := &spmd{ctx: ctx, comms: comms}
			outs[rank], errs[rank] = s.region(part.Func.Body, in)
			if errs[rank] != nil {
				world[rank].Abort(errs[rank])
			}
		}()
	}
	wg.Wait()
	for rank, err := range errs {
		require.NoError(t, err, "device %d\n%s", devs[rank], part.Func)
	}
	res := make([]*ir.Literal, len(part.Func.Body.Results))
	for i, s := range part.Results {
		gt := part.Func.Body.Results[i].Type
		shape := slices.Clone(gt.Shape)
		for d := range shape {
			if d < len(s.Spec) {
				for _, a := range s.Spec[d] {
					shape[d] *= m.AxisSize(a)
				}
			}
		}
		res[i] = ir.NewLiteral(ir.Type{DType: gt.DType, Shape: shape, Space: gt.Space})
		seen := make([]bool, shape.Size())
		for rank, dev := range devs {
			start, limit, err := s.ShardBounds(shape, dev)
			require.NoError(t, err)
			local := outs[rank][i]
			forBlock(start, limit, shape, func(j, at int) {
				v := local.Float64At(j)
				if seen[at] {
					w := res[i].Float64At(at)
					require.True(t, v == w || math.IsNaN(v) && math.IsNaN(w), "result %d element %d: device %d has %v, another device %v", i, at, dev, v, w)
					return
				}
				seen[at] = true
				res[i].SetFloat64At(at, v)
			})
		}
	}
	return res
}

// forBlock calls fn(j, at) for every element of the block [start, limit) of
// an array of the given shape: j its index in the block, at in the array.
func forBlock(start, limit []int, shape ir.Shape, fn func(j, at int)) {
	n := 1
	for d := range start {
		n *= limit[d] - start[d]
	}
	strides := shape.Strides()
	idx := make([]int, len(start))
	for j := range n {
		rem, at := j, 0
		for d := len(start) - 1; d >= 0; d-- {
			w := limit[d] - start[d]
			idx[d] = rem % w
			rem /= w
		}
		for d := range idx {
			at += (start[d] + idx[d]) * strides[d]
		}
		fn(j, at)
	}
}

// spmd interprets one device's program.
type spmd struct {
	ctx   context.Context
	comms map[string]collective.Communicator
}

func (s *spmd) region(r *ir.Region, args []*ir.Literal) ([]*ir.Literal, error) {
	env := map[*ir.Value]*ir.Literal{}
	for i, p := range r.Params {
		env[p] = args[i]
	}
	for _, op := range r.Ops {
		in := make([]*ir.Literal, len(op.Args))
		for i, v := range op.Args {
			in[i] = env[v]
		}
		var out []*ir.Literal
		var err error
		switch {
		case op.Code.IsCollective():
			out, err = s.collective(op, in)
		case op.Code == ir.Scan:
			out, err = s.scan(op, in)
		default:
			out, err = eval.EvalOp(op, in)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op.Describe(), err)
		}
		for i, v := range op.Results {
			env[v] = out[i]
		}
	}
	out := make([]*ir.Literal, len(r.Results))
	for i, v := range r.Results {
		out[i] = env[v]
	}
	return out, nil
}

func (s *spmd) scan(op *ir.Op, in []*ir.Literal) ([]*ir.Literal, error) {
	nc, nk, n := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry"), op.Attrs.Int("length")
	carry := slices.Clone(in[nc : nc+nk])
	ys := make([]*ir.Literal, len(op.Results)-nk)
	for j := range ys {
		ys[j] = ir.NewLiteral(op.Results[nk+j].Type)
	}
	for it := range n {
		i := it
		if op.Attrs.Bool("reverse") {
			i = n - 1 - it
		}
		args := append(slices.Clone(in[:nc]), carry...)
		for k, x := range in[nc+nk:] {
			pt := op.Regions[0].Params[nc+nk+k].Type
			sz := int(pt.Bytes())
			l := ir.NewLiteral(pt)
			copy(l.Data, x.Data[i*sz:(i+1)*sz])
			args = append(args, l)
		}
		res, err := s.region(op.Regions[0], args)
		if err != nil {
			return nil, err
		}
		carry = res[:nk]
		for j, y := range res[nk:] {
			sz := len(y.Data)
			copy(ys[j].Data[i*sz:(i+1)*sz], y.Data)
		}
	}
	return append(carry, ys...), nil
}

func (s *spmd) collective(op *ir.Op, in []*ir.Literal) ([]*ir.Literal, error) {
	c := s.comms[op.Attrs.String("axis")]
	if c == nil {
		return nil, fmt.Errorf("no communicator for axis %q", op.Attrs.String("axis"))
	}
	if c.Size() != op.Attrs.Int("size") {
		return nil, fmt.Errorf("group of %d for size %d", c.Size(), op.Attrs.Int("size"))
	}
	out := ir.NewLiteral(op.Results[0].Type)
	var err error
	switch op.Code {
	case ir.AxisIndex:
		out.SetFloat64At(0, float64(c.Rank()))
	case ir.AllReduce:
		o := map[string]collective.Op{"sum": collective.Sum, "max": collective.Max, "min": collective.Min}[op.Attrs.String("reduction")]
		err = c.AllReduce(s.ctx, o, out.Type.DType, in[0].Data, out.Data)
	case ir.AllGather:
		shape, d := []int(in[0].Type.Shape), op.Attrs.Int("dimension")
		if !op.Attrs.Bool("tiled") {
			shape = slices.Insert(slices.Clone(shape), d, 1)
		}
		err = c.AllGather(s.ctx, out.Type.DType, shape, d, in[0].Data, out.Data)
	case ir.ReduceScatter:
		shape, d := []int(in[0].Type.Shape), op.Attrs.Int("dimension")
		if !op.Attrs.Bool("tiled") {
			return nil, fmt.Errorf("the test interpreter has no stacked reduce_scatter")
		}
		err = c.ReduceScatter(s.ctx, collective.Sum, out.Type.DType, shape, d, in[0].Data, out.Data)
	default:
		return nil, fmt.Errorf("the test interpreter has no %v", op.Code)
	}
	return []*ir.Literal{out}, err
}

// partitionMesh is the 2×4 mesh of the partition tests.
func partitionMesh(t *testing.T) *ir.Mesh {
	m, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	require.NoError(t, err)
	return m
}

// checkPartition partitions f, runs it on random arguments over the mesh
// and compares with the whole program evaluated by eval.
func checkPartition(t *testing.T, f *ir.Func, rng *rand.Rand) *passes.Partitioned {
	t.Helper()
	whole := ir.Clone(f)
	stripShardings(whole.Body)
	part, err := passes.Partition(f)
	require.NoError(t, err, "partitioning\n%s", f)
	args := randprog.Args(rng, whole)
	want, err := eval.Run(whole, args)
	require.NoError(t, err)
	got := spmdRun(t, part, args)
	require.Len(t, got, len(want))
	for i := range want {
		require.True(t, got[i].Type.EqualUnsharded(want[i].Type), "result %d: %v, want %v", i, got[i].Type, want[i].Type)
		for j := range want[i].Type.Size() {
			w, g := want[i].Float64At(j), got[i].Float64At(j)
			if w == g || math.IsNaN(w) && math.IsNaN(g) {
				continue
			}
			tol := 1e-3 // sums in another order
			require.LessOrEqual(t, math.Abs(w-g), tol*(1+math.Abs(w)), "result %d element %d: %v, want %v\nglobal:\n%s\nper device:\n%s", i, j, g, w, f, part.Func)
		}
	}
	return part
}

// stripShardings drops the shardings of r's values.
func stripShardings(r *ir.Region) {
	for _, v := range r.Params {
		v.Type = v.Type.WithSharding(nil)
	}
	for _, op := range r.Ops {
		for _, v := range op.Results {
			v.Type = v.Type.WithSharding(nil)
		}
		for _, sub := range op.Regions {
			stripShardings(sub)
		}
	}
}

func TestPartitionCases(t *testing.T) {
	cases := []string{
		// Data parallel: batch split, weights replicated; the gradient of the
		// weights is a partial sum over x.
		`func @f(%0: f32[8,4]@S[x,{}], %1: f32[4,4], %2: f32[8,4]@S[x,{}]) -> (f32[8,4], f32[4,4]) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,4]
  %4 = tanh(%3) : f32[8,4]
  %5 = dot_general(%0, %2) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[4,4]
  return %4, %5
}`,
		// Megatron: column- then row-parallel, one all-reduce.
		`func @f(%0: f32[8,16], %1: f32[16,32]@S[{},y], %2: f32[32,16]@S[y,{}]) -> (f32[8,16]@S[]) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,32]
  %4 = logistic(%3) : f32[8,32]
  %5 = dot_general(%4, %2) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,16]@S[]
  return %5
}`,
		// Resharding between layouts, a reduction over a split dimension,
		// and an iota split along its counted dimension.
		`func @f(%0: f32[8,16]@S[x,y]) -> (f32[8,16]@S[y,x], f32[16]@S[{x,y}], f32[8,16]@S[{},{x,y}], i32[8,16]@S[{x,y},{}]) {
  %1 = exp(%0) : f32[8,16]@S[y,x]
  %2 = reduce_sum(%0) {axes=[0]} : f32[16]
  %3 = sharding_constraint(%2) {sharding="sharding<mesh[x=2,y=4], [{x,y}]>"} : f32[16]@S[{x,y}]
  %4 = neg(%0) : f32[8,16]@S[{},{x,y}]
  %5 = iota() {dim=0, dtype=i32, shape=[8,16]} : i32[8,16]@S[{x,y},{}]
  return %1, %3, %4, %5
}`,
		// A partial sum its user wants split: reduce-scattered (not the
		// second, split first over another axis).
		`func @f(%0: f32[8,16]@S[{},x], %1: f32[16,4]@S[x,{}]) -> (f32[8,4]@S[x,{}], f32[8,4]@S[{y,x},{}]) { // reduce-scattered
  %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,4]
  %3 = sharding_constraint(%2) {sharding="sharding<mesh[x=2,y=4], [x,{}]>"} : f32[8,4]@S[x,{}]
  %4 = exp(%0) : f32[8,16]
  %5 = dot_general(%4, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,4]
  %6 = sharding_constraint(%5) {sharding="sharding<mesh[x=2,y=4], [{y,x},{}]>"} : f32[8,4]@S[{y,x},{}]
  return %3, %6
}`,
		// A scan over stacked layers split on their rows (FSDP-like): the
		// body gets one layer's block and gathers it.
		`func @f(%0: f32[3,16,16]@S[{},x,{}], %1: f32[8,16]@S[y,{}]) -> (f32[8,16], f32[3,8]) {
  %2, %3 = scan(%1, %0) {length=3, num_carry=1, num_consts=0} (
    ^(%4: f32[8,16], %5: f32[16,16]) {
      %6 = dot_general(%4, %5) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,16]
      %7 = tanh(%6) : f32[8,16]
      %8 = reduce_max(%7) {axes=[1]} : f32[8]
      return %7, %8
    }) : f32[8,16], f32[3,8]
  return %2, %3
}`,
		// Reshapes whose result layout no layout of the operand gives
		// block for block (the original Threefry layout: bits of a flat
		// iota reshaped to a matrix split on its columns or on both
		// dimensions): the operand is reshaped whole, then sliced.
		`func @f(%0: f32[128]) -> (f32[8,16]@S[x,y], f32[8,16]@S[{},y], f32[8,16]@S[y,x]) {
  %1 = iota() {dim=0, dtype=f32, shape=[128]} : f32[128]
  %2 = mul(%0, %1) : f32[128]
  %3 = reshape(%2) {shape=[8,16]} : f32[8,16]@S[x,y]
  %4 = reshape(%2) {shape=[8,16]} : f32[8,16]@S[{},y]
  %5 = reshape(%2) {shape=[8,16]} : f32[8,16]@S[y,x]
  return %3, %4, %5
}`,
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	for i, src := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			src = strings.ReplaceAll(src, "@S[]", "{sharding<"+shardMesh+", []>}")
			src = shardMacro.ReplaceAllString(src, "{sharding<"+shardMesh+", $1>}")
			part := checkPartition(t, parse(t, src), rng)
			if strings.Contains(src, "reduce-scattered") {
				require.Equal(t, 1, strings.Count(part.Func.String(), "reduce_scatter("), "%s", part.Func)
			}
		})
	}
}

// TestPartitionRandom partitions random programs whose parameters are split
// at random over the mesh and compares them with the whole programs.
func TestPartitionRandom(t *testing.T) {
	m := partitionMesh(t)
	n := 60
	if testing.Short() {
		n = 20
	}
	for i := range n {
		seed := uint64(i)*7919 + 11
		f := randprog.New(seed, randprog.All())
		rng := rand.New(rand.NewPCG(seed, 9))
		shardParams(t, f, m, rng)
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkPartition(t, f, rng) })
	}
}

// TestPartitionDump: FERRY_DUMP_IR gets the function with its propagated
// shardings and the per-device program.
func TestPartitionDump(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("FERRY_DUMP_IR", dir)
	src := strings.ReplaceAll(`func @dumped(%0: f32[8,4]@S[x,{}]) -> (f32[8,4]) {
  %1 = exp(%0) : f32[8,4]
  return %1
}`, "@S[x,{}]", "{sharding<"+shardMesh+", [x,{}]>}")
	_, err := passes.Partition(parse(t, src))
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(dir, "*-dumped-*.ir"))
	require.NoError(t, err)
	require.Len(t, files, 2)
	var texts []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		texts = append(texts, string(b))
	}
	require.Contains(t, files[0], "-dumped-partitioned.ir") // sorted by name
	require.Contains(t, texts[0], "%1 = exp(%0) : f32[4,4]")
	require.Contains(t, files[1], "-dumped-propagated.ir")
	require.Contains(t, texts[1], "%1 = exp(%0) : f32[8,4]{sharding<mesh[x=2,y=4], [x,{}]>}")
}
