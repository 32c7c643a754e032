package passes

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// Partitioned is a function split for a device mesh by Partition: one
// program that every device of the mesh runs on its own blocks (SPMD).
type Partitioned struct {
	// Mesh is the mesh of the function's shardings.
	Mesh *ir.Mesh
	// Func is the per-device program. Its parameters and results are the
	// devices' blocks of the global ones (unsharded types of the block
	// shapes); communication between devices is done by collective ops
	// whose "axis" names one mesh axis, or several joined by commas ("x,y":
	// the group along both, ranked row-major in that order), and whose
	// "size" is the group's size. axis_index over such a string gives the
	// device's rank in its group.
	Func *ir.Func
	// Params and Results hold the global layout of each parameter and
	// result of the original function.
	Params, Results []*ir.NamedSharding
	// Axes lists the axis strings of Func's collectives, sorted: the groups
	// the executor needs a communicator for.
	Axes []string
}

// Partition splits f over the mesh of its shardings (GSPMD's SPMD
// partitioner). It completes the shardings with AnalyzeShardings, then
// rewrites every op to compute the block of its result that a device holds
// from its blocks of the operands: it reshards an operand whose layout is
// not the one the op's rule wants (all-gather along the dimensions whose
// split must change, then local slicing with offsets from axis_index),
// combines partial reductions with an all-reduce over the partial axes (a
// reduce-scatter where every user wants the sum split along those axes; where
// the split is taken later, after a transpose or from a scan's ys, the
// Pipeline's reduce-scatter pass turns the all-reduce into one), and
// rewrites the shape attributes (broadcast_in_dim, reshape, dynamic_slice,
// slice along split dimensions) and iota (whose split dimension counts from
// the device's offset, so that random bits, which are elementwise functions
// of iota, are computed for the device's block only). Scan bodies are
// partitioned with the scan; while and cond run on replicated operands.
//
// Results are laid out as their shardings say (the sharding the value has in
// f, from an annotation or propagation). f is not changed. It is an error
// if no value of f is sharded, or if f holds a collective op (whose axis
// nothing binds in a global program).
func Partition(f *ir.Func) (*Partitioned, error) {
	if err := checkBoundAxes(f, nil); err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	var fusion error
	f.Body.Walk(func(op *ir.Op) {
		if op.Code == ir.Fusion && fusion == nil {
			fusion = fmt.Errorf("partition: %s: fusions are made after partitioning", op.Describe())
		}
	})
	if fusion != nil {
		return nil, fusion
	}
	a, err := AnalyzeShardings(f)
	if err != nil {
		return nil, err
	}
	if a.Mesh == nil {
		return nil, fmt.Errorf("partition: no value of %s is sharded", f.Name)
	}
	p := &partitioner{a: a, out: ir.NewFunc(f.Name), env: map[*ir.Value]*ir.Value{}, axes: map[string]bool{},
		layout: map[*ir.Value]*ir.NamedSharding{}, wants: map[*ir.Value][]*ir.NamedSharding{}}
	res := &Partitioned{Mesh: a.Mesh, Func: p.out}
	for _, v := range f.Body.Params {
		s := a.Shardings[v]
		lt, err := localType(v.Type, s)
		if err != nil {
			return nil, fmt.Errorf("partition: parameter %v: %w", v, err)
		}
		p.env[v] = p.out.Body.AddParam(lt)
		res.Params = append(res.Params, s)
	}
	want := make([]*ir.NamedSharding, len(f.Body.Results))
	for i, v := range f.Body.Results {
		want[i] = a.Shardings[v]
		res.Results = append(res.Results, want[i])
	}
	if err := p.region(f.Body, p.out.Body, want); err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	for ax := range p.axes {
		res.Axes = append(res.Axes, ax)
	}
	slices.Sort(res.Axes)
	if err := ir.Verify(p.out); err != nil {
		return nil, fmt.Errorf("partition: the per-device program does not verify: %w\n%s", err, p.out)
	}
	if err := dumpPartition(f, res); err != nil {
		return nil, err
	}
	return res, nil
}

// dumpPartition writes, when $FERRY_DUMP_IR names a directory, f with the
// shardings propagation gave every value (NNN-<func>-propagated.ir) and
// the per-device program (NNN-<func>-partitioned.ir), as Compile writes
// each pass's IR; compiling the per-device program then dumps its passes.
func dumpPartition(f *ir.Func, part *Partitioned) error {
	dir := settings.DumpIR.Get()
	if dir == "" {
		return nil
	}
	g := ir.Clone(f)
	if err := PropagateShardings(g); err != nil {
		return err
	}
	d := &dumper{dir: dir, seq: dumpSeq.Add(1) - 1, name: FileName(f.Name)}
	for _, w := range []struct {
		name string
		fn   *ir.Func
	}{{"propagated", g}, {"partitioned", part.Func}} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("passes: dump: %w", err)
		}
		name := fmt.Sprintf("%03d-%s-%s.ir", d.seq, d.name, w.name)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(w.fn.String()), 0o644); err != nil {
			return fmt.Errorf("passes: dump: %w", err)
		}
	}
	return nil
}

// localType is t's block under s, unsharded.
func localType(t ir.Type, s *ir.NamedSharding) (ir.Type, error) {
	t = t.WithSharding(nil)
	if s == nil {
		return t, nil
	}
	shape, err := s.ShardShape(t.Shape)
	if err != nil {
		return ir.Type{}, err
	}
	t.Shape = shape
	return t, nil
}

type partitioner struct {
	a    *ShardingAnalysis
	out  *ir.Func
	env  map[*ir.Value]*ir.Value // global value → its local value
	axes map[string]bool
	// layout holds the layout of a value's local value where it is not
	// its sharding (a partial sum reduce-scattered into the split its
	// users want); wants the layouts a value's users want it in (a nil
	// entry: a user the partitioner does not look into).
	layout map[*ir.Value]*ir.NamedSharding
	wants  map[*ir.Value][]*ir.NamedSharding
}

// from is the layout of v's local value.
func (p *partitioner) from(v *ir.Value) *ir.NamedSharding {
	if l := p.layout[v]; l != nil {
		return l
	}
	return p.a.Shardings[v]
}

// region partitions the ops of src into dst (whose parameters the caller
// has mapped in env) and sets dst's results: src's results resharded to
// want.
func (p *partitioner) region(src, dst *ir.Region, want []*ir.NamedSharding) error {
	for _, op := range src.Ops {
		for k, v := range op.Args {
			var w *ir.NamedSharding
			if op.Code != ir.Scan && op.Code != ir.While && op.Code != ir.Cond {
				w = p.a.Operands[op][k]
			}
			p.wants[v] = append(p.wants[v], w)
		}
	}
	for i, v := range src.Results {
		p.wants[v] = append(p.wants[v], want[i])
	}
	for _, op := range src.Ops {
		if err := p.op(dst, op); err != nil {
			return err
		}
	}
	b := builder{p, dst, ""}
	for i, v := range src.Results {
		x, err := b.reshard(p.env[v], v.Type.Shape, p.from(v), want[i])
		if err != nil {
			return err
		}
		dst.Results = append(dst.Results, x)
	}
	return nil
}

// op partitions one op of a region into dst.
func (p *partitioner) op(dst *ir.Region, op *ir.Op) error {
	b := builder{p, dst, op.Loc}
	wantArgs := p.a.Operands[op]
	switch op.Code {
	case ir.While, ir.Cond:
		wantArgs = make([]*ir.NamedSharding, len(op.Args))
		for i, v := range op.Args {
			wantArgs[i] = ir.Replicated(p.a.Mesh, v.Type.Rank())
		}
	case ir.Scan:
		return p.scan(b, op)
	}
	args := make([]*ir.Value, len(op.Args))
	for i, v := range op.Args {
		x, err := b.reshard(p.env[v], v.Type.Shape, p.from(v), wantArgs[i])
		if err != nil {
			return fmt.Errorf("%s: operand %d: %w", op.Describe(), i, err)
		}
		args[i] = x
	}
	var outs []*ir.Value
	produced := make([]*ir.NamedSharding, len(op.Results))
	partial := make([]ir.PartialReduction, len(op.Results))
	for i, r := range op.Results {
		produced[i] = p.a.Shardings[r]
		partial[i] = p.a.Partial[r]
	}
	switch op.Code {
	case ir.ShardingConstraint:
		outs = args
	case ir.Iota:
		x, err := b.iota(op)
		if err != nil {
			return err
		}
		outs = []*ir.Value{x}
	case ir.Constant:
		x, err := b.add(ir.Constant, nil, ir.CloneAttrs(op.Attrs))
		if err != nil {
			return err
		}
		outs, produced[0] = []*ir.Value{x}, ir.Replicated(p.a.Mesh, x.Type.Rank())
	case ir.While, ir.Cond:
		regions := make([]*ir.Region, len(op.Regions))
		for i, r := range op.Regions {
			regions[i] = p.wholeRegion(r)
		}
		o, err := b.op(op.Code, args, ir.CloneAttrs(op.Attrs), regions...)
		if err != nil {
			return err
		}
		outs = o.Results
		for i, r := range op.Results {
			produced[i] = ir.Replicated(p.a.Mesh, r.Type.Rank())
		}
	default:
		partial = p.forward(op, wantArgs, produced)
		attrs, err := localAttrs(op, produced[0])
		if err != nil {
			return err
		}
		o, err := b.op(op.Code, args, attrs)
		if err != nil {
			return err
		}
		outs = o.Results
	}
	for i, r := range op.Results {
		x := outs[i]
		want, err := localType(r.Type, produced[i])
		if err != nil {
			return fmt.Errorf("%s: result %d: %w", op.Describe(), i, err)
		}
		if !x.Type.EqualUnsharded(want) {
			return fmt.Errorf("%s: result %d: the device's block is %v, want %v (sharding %v)", op.Describe(), i, x.Type, want, produced[i])
		}
		if pr := partial[i]; len(pr.Axes) > 0 {
			if y, l := b.scatter(x, r, produced[i], pr); y != nil {
				p.env[r], p.layout[r] = y, l
				continue
			}
			if x, err = b.combine(x, pr); err != nil {
				return fmt.Errorf("%s: %w", op.Describe(), err)
			}
		}
		if x, err = b.reshard(x, r.Type.Shape, produced[i], p.a.Shardings[r]); err != nil {
			return fmt.Errorf("%s: result %d: %w", op.Describe(), i, err)
		}
		p.env[r] = x
	}
	return nil
}

// forward sets produced to the layouts op gives its results when its
// operands are laid out as wantArgs (its rule asked again with those
// operands and the results' shardings), where the rule says, and returns
// the partial reductions it leaves. That is the results' sharding, except where the sharding came
// from elsewhere (an annotation after a reshape that does not keep the
// split, say): the result is then resharded from what the op gives.
func (p *partitioner) forward(op *ir.Op, wantArgs, produced []*ir.NamedSharding) []ir.PartialReduction {
	partial := make([]ir.PartialReduction, len(op.Results))
	for i, r := range op.Results {
		partial[i] = p.a.Partial[r]
	}
	fw := op.Info().Shard(op, wantArgs, p.results(op))
	for i, r := range op.Results {
		if i >= len(fw.Results) || fw.Results[i] == nil || !fw.Results[i].Mesh.Equal(p.a.Mesh) {
			continue
		}
		produced[i] = fit(fw.Results[i], r.Type.Shape)
		partial[i] = ir.PartialReduction{}
		if i < len(fw.Partial) {
			partial[i] = fw.Partial[i]
		}
	}
	return partial
}

// results returns the shardings of op's results.
func (p *partitioner) results(op *ir.Op) []*ir.NamedSharding {
	out := make([]*ir.NamedSharding, len(op.Results))
	for i, r := range op.Results {
		out[i] = p.a.Shardings[r]
	}
	return out
}

// localAttrs returns op's attributes for the devices' blocks: shape
// attributes become the block's shape; a slice takes a split dimension whole
// (its rule splits only dimensions the slice keeps whole).
func localAttrs(op *ir.Op, s *ir.NamedSharding) (ir.Attrs, error) {
	attrs := ir.CloneAttrs(op.Attrs)
	if len(op.Results) == 0 {
		return attrs, nil
	}
	r := op.Results[0]
	local, err := localType(r.Type, s)
	if err != nil {
		return nil, err
	}
	switch op.Code {
	case ir.BroadcastInDim, ir.Reshape:
		attrs["shape"] = []int(local.Shape.Clone())
	case ir.DynamicSlice:
		attrs["sizes"] = []int(local.Shape.Clone())
	case ir.Slice:
		start, limit := slices.Clone(attrs.Ints("start")), slices.Clone(attrs.Ints("limit"))
		for d := range start {
			if local.Shape[d] != r.Type.Shape[d] {
				start[d], limit[d] = 0, local.Shape[d]
			}
		}
		attrs["start"], attrs["limit"] = start, limit
	}
	return attrs, nil
}

// scan partitions a scan: its operands are resharded to the layouts of the
// body's parameters (xs with a whole leading dimension), the body is
// partitioned with its carry results laid out as its carry parameters, and
// the results are resharded from what the scan produces (the carry
// parameters' layouts; the body's ys layouts behind a whole leading
// dimension) to theirs.
func (p *partitioner) scan(b builder, op *ir.Op) error {
	body := op.Regions[0]
	nc, nk := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry")
	sh := p.a.Shardings
	stacked := func(s *ir.NamedSharding) *ir.NamedSharding {
		return &ir.NamedSharding{Mesh: s.Mesh, Spec: append(ir.PartitionSpec{nil}, s.Spec...)}
	}
	args := make([]*ir.Value, len(op.Args))
	nb := p.out.NewRegion()
	for i, v := range op.Args {
		ps := sh[body.Params[i]]
		want := ps
		if i >= nc+nk {
			want = stacked(ps)
		}
		x, err := b.reshard(p.env[v], v.Type.Shape, p.from(v), want)
		if err != nil {
			return fmt.Errorf("%s: operand %d: %w", op.Describe(), i, err)
		}
		args[i] = x
		lt, err := localType(body.Params[i].Type, ps)
		if err != nil {
			return fmt.Errorf("%s: body parameter %d: %w", op.Describe(), i, err)
		}
		p.env[body.Params[i]] = nb.AddParam(lt)
	}
	want := make([]*ir.NamedSharding, len(body.Results))
	for j, v := range body.Results {
		want[j] = sh[v]
		if j < nk {
			want[j] = sh[body.Params[nc+j]]
		}
	}
	if err := p.region(body, nb, want); err != nil {
		return err
	}
	o, err := b.op(ir.Scan, args, ir.CloneAttrs(op.Attrs), nb)
	if err != nil {
		return err
	}
	for j, r := range op.Results {
		produced := want[j]
		if j >= nk {
			produced = stacked(want[j])
		}
		x, err := b.reshard(o.Results[j], r.Type.Shape, produced, sh[r])
		if err != nil {
			return fmt.Errorf("%s: result %d: %w", op.Describe(), j, err)
		}
		p.env[r] = x
	}
	return nil
}

// wholeRegion copies r (a while's or cond's region, which runs on whole
// values) into the local function with its shardings dropped.
func (p *partitioner) wholeRegion(r *ir.Region) *ir.Region {
	nr := p.out.NewRegion()
	env := map[*ir.Value]*ir.Value{}
	for _, v := range r.Params {
		env[v] = nr.AddParam(v.Type.WithSharding(nil))
	}
	copyOps(p.out, r, nr, env)
	return nr
}

// copyOps appends the ops of src to dst in function f, mapping values
// through env, with shardings dropped.
func copyOps(f *ir.Func, src, dst *ir.Region, env map[*ir.Value]*ir.Value) {
	for _, op := range src.Ops {
		args := make([]*ir.Value, len(op.Args))
		for i, v := range op.Args {
			args[i] = env[v]
		}
		regions := make([]*ir.Region, len(op.Regions))
		for i, r := range op.Regions {
			nr := f.NewRegion()
			for _, v := range r.Params {
				env[v] = nr.AddParam(v.Type.WithSharding(nil))
			}
			copyOps(f, r, nr, env)
			regions[i] = nr
		}
		no := &ir.Op{Code: op.Code, Args: args, Attrs: ir.CloneAttrs(op.Attrs), Regions: regions, Loc: op.Loc}
		for i, r := range op.Results {
			env[r] = f.NewValueWithID(f.NextID(), r.Type.WithSharding(nil), no, i)
			no.Results = append(no.Results, env[r])
		}
		dst.Ops = append(dst.Ops, no)
	}
	for _, v := range src.Results {
		dst.Results = append(dst.Results, env[v])
	}
}

// builder appends ops to a region of the per-device program, located at loc.
type builder struct {
	p   *partitioner
	r   *ir.Region
	loc string
}

func (b builder) op(code ir.Code, args []*ir.Value, attrs ir.Attrs, regions ...*ir.Region) (*ir.Op, error) {
	o, err := b.r.AddOp(code, args, attrs, regions...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", code, err)
	}
	o.Loc = b.loc
	if code.IsCollective() {
		b.p.axes[attrs.String("axis")] = true
	}
	return o, nil
}

func (b builder) add(code ir.Code, args []*ir.Value, attrs ir.Attrs) (*ir.Value, error) {
	o, err := b.op(code, args, attrs)
	if err != nil {
		return nil, err
	}
	return o.Results[0], nil
}

// scalar is a constant scalar of dtype dt.
func (b builder) scalar(dt ir.DType, v float64) (*ir.Value, error) {
	l := ir.NewLiteral(ir.TypeOf(dt))
	l.SetFloat64At(0, v)
	return b.add(ir.Constant, nil, ir.Attrs{"value": l})
}

// group names the collective group along axes: the axis string and size.
func (b builder) group(axes []string) (string, int) {
	n := 1
	for _, a := range axes {
		n *= b.p.a.Mesh.AxisSize(a)
	}
	return strings.Join(axes, ","), n
}

// index is the device's rank along axes (row-major), an i32 scalar.
func (b builder) index(axes []string) (*ir.Value, error) {
	name, n := b.group(axes)
	return b.add(ir.AxisIndex, nil, ir.Attrs{"axis": name, "size": n})
}

// effective returns the axes of dimension d of s that split it (size > 1).
func effective(s *ir.NamedSharding, d int) []string {
	var out []string
	if s != nil && d < len(s.Spec) {
		for _, a := range s.Spec[d] {
			if s.Mesh.AxisSize(a) > 1 {
				out = append(out, a)
			}
		}
	}
	return out
}

// reshard turns x, the device's block under from of an array of the given
// global shape, into its block under to: an all-gather along every
// dimension whose axes are not a prefix of the wanted ones, then one
// dynamic_slice taking the device's part of every dimension split further.
func (b builder) reshard(x *ir.Value, shape ir.Shape, from, to *ir.NamedSharding) (*ir.Value, error) {
	rank := len(shape)
	if from == nil || to == nil || from.EquivalentTo(to, rank) {
		return x, nil
	}
	if sp := x.Type.Space; sp != ir.Device { // collectives run on device memory
		d, err := b.add(ir.DevicePut, []*ir.Value{x}, ir.Attrs{"space": ir.Device})
		if err != nil {
			return nil, err
		}
		if d, err = b.reshard(d, shape, from, to); err != nil {
			return nil, err
		}
		return b.add(ir.DevicePut, []*ir.Value{d}, ir.Attrs{"space": sp})
	}
	cur := make([][]string, rank)
	for d := range rank {
		cur[d] = effective(from, d)
		t := effective(to, d)
		if len(cur[d]) == 0 || (len(cur[d]) <= len(t) && slices.Equal(cur[d], t[:len(cur[d])])) {
			continue
		}
		name, n := b.group(cur[d])
		var err error
		x, err = b.add(ir.AllGather, []*ir.Value{x}, ir.Attrs{"axis": name, "size": n, "dimension": d, "tiled": true})
		if err != nil {
			return nil, err
		}
		cur[d] = nil
	}
	sizes := slices.Clone([]int(x.Type.Shape))
	starts := make([]*ir.Value, rank)
	sliced := false
	for d := range rank {
		t := effective(to, d)
		extra := t[len(cur[d]):]
		if len(extra) == 0 {
			continue
		}
		_, n := b.group(extra)
		sizes[d] /= n
		idx, err := b.index(extra)
		if err != nil {
			return nil, err
		}
		size, err := b.scalar(ir.Int32, float64(sizes[d]))
		if err != nil {
			return nil, err
		}
		if starts[d], err = b.add(ir.Mul, []*ir.Value{idx, size}, nil); err != nil {
			return nil, err
		}
		sliced = true
	}
	if !sliced {
		return x, nil
	}
	zero, err := b.scalar(ir.Int32, 0)
	if err != nil {
		return nil, err
	}
	for d := range starts {
		if starts[d] == nil {
			starts[d] = zero
		}
	}
	return b.add(ir.DynamicSlice, append([]*ir.Value{x}, starts...), ir.Attrs{"sizes": sizes})
}

// scatter reduce-scatters x, the partial sum r laid out as produced, when
// every user of r wants it split along one dimension by the partial axes
// (after that dimension's own axes): each device then keeps only its
// block of the sum. It returns the local value and its layout, or nil.
func (b builder) scatter(x *ir.Value, r *ir.Value, produced *ir.NamedSharding, pr ir.PartialReduction) (*ir.Value, *ir.NamedSharding) {
	var axes []string
	for _, a := range pr.Axes {
		if b.p.a.Mesh.AxisSize(a) > 1 {
			axes = append(axes, a)
		}
	}
	wants := b.p.wants[r]
	if pr.Reduction != "sum" || len(axes) == 0 || len(wants) == 0 || x.Type.Space != ir.Device {
		return nil, nil
	}
	dim := -1
	for _, w := range wants {
		if w == nil {
			return nil, nil
		}
		found := -1
		for d := range r.Type.Rank() {
			t, c := effective(w, d), effective(produced, d)
			if len(t) >= len(c)+len(axes) && slices.Equal(t[:len(c)], c) && slices.Equal(t[len(c):len(c)+len(axes)], axes) {
				found = d
				break
			}
		}
		if found < 0 || dim >= 0 && found != dim {
			return nil, nil
		}
		dim = found
	}
	name, n := b.group(axes)
	y, err := b.add(ir.ReduceScatter, []*ir.Value{x}, ir.Attrs{"axis": name, "size": n, "dimension": dim, "tiled": true})
	if err != nil {
		return nil, nil
	}
	spec := make(ir.PartitionSpec, r.Type.Rank())
	for d := range spec {
		spec[d] = effective(produced, d)
	}
	spec[dim] = append(slices.Clone(spec[dim]), axes...)
	return y, &ir.NamedSharding{Mesh: b.p.a.Mesh, Spec: spec}
}

// combine reduces x, a partial reduction, over the partial axes: an
// all-reduce (a gather and a local product for "prod").
func (b builder) combine(x *ir.Value, pr ir.PartialReduction) (*ir.Value, error) {
	var axes []string
	for _, a := range pr.Axes {
		if b.p.a.Mesh.AxisSize(a) > 1 {
			axes = append(axes, a)
		}
	}
	if len(axes) == 0 {
		return x, nil
	}
	name, n := b.group(axes)
	if pr.Reduction != "prod" {
		return b.add(ir.AllReduce, []*ir.Value{x}, ir.Attrs{"axis": name, "size": n, "reduction": pr.Reduction})
	}
	g, err := b.add(ir.AllGather, []*ir.Value{x}, ir.Attrs{"axis": name, "size": n, "dimension": 0})
	if err != nil {
		return nil, err
	}
	return b.add(ir.ReduceProd, []*ir.Value{g}, ir.Attrs{"axes": []int{0}})
}

// iota is the device's block of an iota: an iota of the block's shape plus,
// where the counted dimension is split, the offset of the device's block.
// For a float dtype the index is summed in i32 and converted once, as the
// whole iota rounds each index: a float dtype does not hold every offset
// (bf16 rounds 423 to 424).
func (b builder) iota(op *ir.Op) (*ir.Value, error) {
	r := op.Results[0]
	s := b.p.a.Shardings[r]
	local, err := localType(r.Type, s)
	if err != nil {
		return nil, err
	}
	dim, dt := op.Attrs.Int("dim"), op.Attrs.DType("dtype")
	axes := effective(s, dim)
	it := dt
	if len(axes) > 0 && dt.IsFloat() {
		it = ir.Int32
	}
	x, err := b.add(ir.Iota, nil, ir.Attrs{"dtype": it, "shape": []int(local.Shape.Clone()), "dim": dim})
	if err != nil {
		return nil, err
	}
	if len(axes) == 0 {
		return x, nil
	}
	idx, err := b.index(axes)
	if err != nil {
		return nil, err
	}
	if idx, err = b.add(ir.Convert, []*ir.Value{idx}, ir.Attrs{"dtype": it}); err != nil {
		return nil, err
	}
	size, err := b.scalar(it, float64(local.Shape[dim]))
	if err != nil {
		return nil, err
	}
	off, err := b.add(ir.Mul, []*ir.Value{idx, size}, nil)
	if err != nil {
		return nil, err
	}
	if off, err = b.add(ir.BroadcastInDim, []*ir.Value{off}, ir.Attrs{"shape": []int(local.Shape.Clone()), "dims": []int{}}); err != nil {
		return nil, err
	}
	if x, err = b.add(ir.Add, []*ir.Value{x, off}, nil); err != nil || it == dt {
		return x, err
	}
	return b.add(ir.Convert, []*ir.Value{x}, ir.Attrs{"dtype": dt})
}
