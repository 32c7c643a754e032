package passes

import "github.com/ferryml/ferry/ir"

// Cost is the arithmetic a function does, counted per call the way XLA's
// cost_analysis() counts it, so that a step time turns into a FLOP rate:
//
//   - dot_general: 2 × (elements of the result) × (product of the contracted
//     dimensions), in DotFlops and Flops;
//   - arithmetic and compare elementwise ops, select: 1 per result element in
//     Flops; the ops the op table marks Transcendental (exp, log, log1p,
//     expm1, tanh, logistic, sin, cos, erf, sqrt, rsqrt and pow): 1 per
//     element in Transcendentals instead;
//   - reductions: 1 per operand element; sort, gather, scatter and shape ops
//     (broadcast, reshape, transpose, slice, pad, concatenate, convert): 0;
//   - a scan counts its body length times; a cond its costlier branch;
//     a while loop's trip count is not known before it runs, so its body and
//     condition count once and WhileLoops says how many loops were so counted.
//
// Counted on a traced function (rt.Lowered's Func) it is the model's
// arithmetic; on a compiled one it includes what the compiler recomputes
// (remat).
type Cost struct {
	// Flops is every floating-point and integer operation counted above
	// except the transcendental ones.
	Flops float64
	// DotFlops is the dot_general part of Flops: the matrix products (for a
	// neural network, what is usually called its model FLOPs).
	DotFlops float64
	// Transcendentals counts elements of transcendental functions.
	Transcendentals float64
	// WhileLoops counts while loops whose bodies were counted once.
	WhileLoops int
}

// CostAnalysis counts the arithmetic of one call of f (see Cost).
func CostAnalysis(f *ir.Func) Cost {
	var c Cost
	c.region(f.Body, 1)
	return c
}

func (c *Cost) add(o Cost, times float64) {
	c.Flops += o.Flops * times
	c.DotFlops += o.DotFlops * times
	c.Transcendentals += o.Transcendentals * times
	c.WhileLoops += o.WhileLoops
}

func (c *Cost) region(r *ir.Region, times float64) {
	for _, op := range r.Ops {
		c.op(op, times)
	}
}

func (c *Cost) op(op *ir.Op, times float64) {
	switch op.Code {
	case ir.DotGeneral:
		k := 1.0
		lhs := op.Args[0].Type.Shape
		for _, d := range op.Attrs.Ints("lhs_contract") {
			k *= float64(lhs[d])
		}
		f := 2 * float64(op.Result().Type.Size()) * k * times
		c.DotFlops += f
		c.Flops += f
		return
	case ir.Scan:
		var body Cost
		body.region(op.Regions[0], 1)
		c.add(body, float64(op.Attrs.Int("length"))*times)
		return
	case ir.While:
		var body Cost
		for _, r := range op.Regions {
			body.region(r, 1)
		}
		c.add(body, times)
		c.WhileLoops++
		return
	case ir.Cond:
		var best Cost
		for _, r := range op.Regions {
			var b Cost
			b.region(r, 1)
			if b.Flops+b.Transcendentals > best.Flops+best.Transcendentals {
				best = b
			}
		}
		c.add(best, times)
		return
	case ir.Fusion:
		c.region(op.Regions[0], times)
		return
	case ir.Select:
		c.Flops += float64(op.Result().Type.Size()) * times
		return
	case ir.Convert, ir.BitcastConvert:
		return
	case ir.ArgMax, ir.ArgMin:
		c.Flops += float64(op.Args[0].Type.Size()) * times
		return
	}
	switch op.Info().Class {
	case ir.ClassUnary, ir.ClassBinary, ir.ClassCompare:
		n := float64(op.Result().Type.Size()) * times
		if op.Info().Transcendental { // the op table says so
			c.Transcendentals += n
		} else {
			c.Flops += n
		}
	case ir.ClassReduce:
		for _, a := range op.Args {
			c.Flops += float64(a.Type.Size()) * times
		}
	}
}

// OpCost counts the arithmetic of one op (see Cost), its regions included.
func OpCost(op *ir.Op) Cost {
	var c Cost
	c.op(op, 1)
	return c
}
