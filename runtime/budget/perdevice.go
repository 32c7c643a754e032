package budget

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// How the estimate prices what is not arithmetic: the host link's two
// directions, the collectives of a sharded function's per-device program,
// and the candidates of such a program (one device's share of each), and
// which candidates cost nothing to take again (views of the scope's
// inputs).

// linkSecs is the host link's time per call by direction: copies to the
// device (in) and to pinned_host (out), at Rates.Bandwidth.
type linkSecs struct{ in, out float64 }

// link prices the host link's copies l: a link with a copy engine per
// direction (PCIe and NVLink-C2C are full duplex; CUDA copies to the device
// and to the host on separate streams) moves both directions at once, so
// the step pays the larger; copies on the cores that compute (Serial) pay
// both.
func (r Rates) link(l linkSecs) float64 {
	if r.Serial {
		return l.in + l.out
	}
	return max(l.in, l.out)
}

// overlap prices the arithmetic and the collectives of one call: the
// collectives run on a queue of their own beside the compute (the plan's
// schedule starts the next layer's all-gather during this layer's compute)
// and the step pays the longer; when copies share the cores with the
// compute (Serial: the CPU backend, whose in-process collectives are
// copies too) it pays both.
func (r Rates) overlap(compute, collective float64) float64 {
	if r.Serial {
		return compute + collective
	}
	return max(compute, collective)
}

// collectiveSeconds prices the collectives of one call of f (a per-device
// program) at r.Collective bytes/s of bus bandwidth (NCCL's busbw), each
// counted once per iteration of the scans around it: an all-gather of S
// bytes (its result) or a reduce-scatter of S bytes (its operand) over a
// group of n devices takes S·(n−1)/n / r.Collective, an all-reduce twice
// that, another collective S·(n−1)/n of its operands. It is 0 when r has
// no collective bandwidth.
func collectiveSeconds(f *ir.Func, r Rates) float64 {
	if r.Collective <= 0 {
		return 0
	}
	return collectiveBytes(f.Body, 1) / r.Collective
}

// collectiveBytes sums the ring bytes of the collectives of region reg,
// which runs times times per call.
func collectiveBytes(reg *ir.Region, times float64) float64 {
	total := 0.0
	for _, op := range reg.Ops {
		if op.Code == ir.Scan {
			total += collectiveBytes(op.Regions[0], times*float64(op.Attrs.Int("length")))
			continue
		}
		for _, sub := range op.Regions {
			total += collectiveBytes(sub, times)
		}
		if !op.Code.IsCollective() {
			continue
		}
		n := float64(op.Attrs.Int("size"))
		if n <= 1 {
			continue
		}
		ring := (n - 1) / n * times
		switch op.Code {
		case ir.AllGather:
			total += float64(op.Result().Type.Bytes()) * ring
		case ir.AllReduce:
			for _, a := range op.Args {
				total += 2 * float64(a.Type.Bytes()) * ring
			}
		default:
			for _, a := range op.Args {
				total += float64(a.Type.Bytes()) * ring
			}
		}
	}
	return total
}

// perDeviceCands sets the candidates pt recorded for the trace f of a
// sharded function to one device's share: the device bytes of their blocks
// and their arithmetic divided by the ways it is split, as the sharding
// propagation the partitioner runs lays each value out. A candidate is
// found in f by its op, result types and line (a scan body's forward ops
// are inlined copies of the ops the planner saw, and equal ones are laid
// out alike), else by the shardings its result types carry; one found
// neither way, or a function whose shardings do not propagate, keeps its
// global figures.
func perDeviceCands(f *ir.Func, pt *planTrace) {
	an, err := passes.AnalyzeShardings(f)
	if err != nil || an.Mesh == nil {
		return
	}
	type key struct{ op, typ, loc string }
	ops := map[key]*ir.Op{}
	f.Body.Walk(func(op *ir.Op) {
		k := key{op.Code.String(), resultTypes(op), op.Loc}
		if _, ok := ops[k]; !ok {
			ops[k] = op
		}
	})
	for _, k := range sortedKeys(pt.cands) {
		ci := pt.cands[k]
		var bytes int64
		var ways float64
		if op := ops[key{ci.op, ci.typ, ci.loc}]; op != nil {
			bytes, ways = shareOf(op, an)
		} else if bytes, ways = typeShare(ci.results); ways == 0 {
			continue
		}
		ci.bytes = bytes
		ci.dot /= ways
		ci.elem /= ways
		ci.segDot /= ways
		ci.segElem /= ways
	}
}

// shareOf returns one device's bytes of op's device results and the ways
// its arithmetic is split: the most shards among its results and the
// layouts it reads its operands in.
func shareOf(op *ir.Op, an *passes.ShardingAnalysis) (bytes int64, ways float64) {
	ways = 1
	for _, r := range op.Results {
		s := an.Shardings[r]
		b := r.Type.Bytes()
		if s != nil {
			ways = max(ways, float64(s.NumShards()))
			if shape, err := s.ShardShape(r.Type.Shape); err == nil {
				b = ir.Type{DType: r.Type.DType, Shape: shape}.Bytes()
			}
		}
		if r.Type.Space == ir.Device {
			bytes += b
		}
	}
	for _, s := range an.Operands[op] {
		if s != nil {
			ways = max(ways, float64(s.NumShards()))
		}
	}
	return bytes, ways
}

// typeShare returns one device's bytes of the device values of types and
// the ways they are split, when each carries its sharding (a sharding
// constraint's result, which the traced function no longer holds as an
// op); ways is 0 when one does not.
func typeShare(types []ir.Type) (bytes int64, ways float64) {
	ways = 1
	for _, t := range types {
		s := t.Sharding
		if s == nil {
			return 0, 0
		}
		shape, err := s.ShardShape(t.Shape)
		if err != nil {
			return 0, 0
		}
		ways = max(ways, float64(s.NumShards()))
		if t.Space == ir.Device {
			bytes += ir.Type{DType: t.DType, Shape: shape}.Bytes()
		}
	}
	return bytes, ways
}

// resultTypes is op's result types as candInfo.typ writes them.
func resultTypes(op *ir.Op) string {
	s := ""
	for i, r := range op.Results {
		if i > 0 {
			s += ", "
		}
		s += r.Type.String()
	}
	return s
}

// rereadable reports whether op only views the inputs of its scope (a
// scan body's parameters: the layer's slice of a stacked argument; a
// function's arguments; or such a slice of an argument in pinned_host, as
// streamed in), through reshapes, transposes and slices: the backward pass
// can take it again from those inputs, which stay live, at no arithmetic,
// so it is recomputed rather than offloaded. A sharding constraint is not
// such a view: under FSDP the partitioner gathers what it constrains, and
// taking it again in the backward pass gathers it a second time beside the
// backward's own gather (measured: examples/sharded's FSDP step no longer
// fit half its memory when its layers' constraints were taken again).
func rereadable(op *ir.Op) bool {
	switch op.Code {
	case ir.Reshape, ir.Transpose, ir.Slice, ir.DynamicSlice:
	default:
		return false
	}
	for i, a := range op.Args {
		switch {
		case a.Op == nil: // a parameter of the scope (or of one around it)
		case a.Op.Code == ir.DevicePut && a.Op.Args[0].Op == nil && a.Op.Args[0].Type.Space == ir.PinnedHost:
			// a slice streamed in from pinned_host, which the backward
			// pass copies in again anyway
		case i > 0 && a.Op.Code == ir.Constant: // a constant start index
		case rereadable(a.Op):
		default:
			return false
		}
	}
	return true
}
