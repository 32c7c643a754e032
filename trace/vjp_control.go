package trace

import (
	"maps"

	"github.com/ferryml/ferry/ir"
)

// Reverse-mode differentiation of the region ops scan and cond.
//
// Residual policy (scan): the forward scan is re-emitted with extra ys, the
// residuals, stacked on axis 0: every value of the body's forward pass that the
// body's VJP rules reference (JAX's default of saving everything the backward
// needs), so the backward pass never recomputes the forward. Three kinds of
// referenced values are not stacked: the scan's consts (passed to the backward
// scan as consts), its xs slices (the backward scan slices the forward xs
// itself), and values computed only from constants and iotas by cheap shape ops
// (recomputed inside the backward body). The carry and all other intermediates
// are stacked. The backward is a scan with reverse flipped whose carry holds the
// consts' cotangent accumulators and the carry's cotangent, and whose ys are the
// xs' cotangents. Later compiler passes (remat, offload) decide whether each
// stacked residual stays on device, moves to host or is recomputed.
//
// The trick that finds the residuals: the forward body is replayed into a
// tracer F, and the backward body is traced into a tracer B pushed on top of F
// while F is still active. Every array of F that a VJP rule uses is then captured
// by B as a parameter; those captures are exactly the residuals.
//
// Cond works the same way per branch: each branch's residuals are extra results
// of the forward cond (zeros from the other branch), and the backward is a cond
// on the same predicate whose branches are the branches' VJPs.

// adCtOrZeros returns ct with t's dtype and shape, on device, or zeros of
// that type when ct is nil. Cotangents always live in device memory, whatever
// the space of their primal (see vjpDevicePut).
func adCtOrZeros(ct *Array, t ir.Type) *Array {
	t = adCtType(t)
	if ct == nil {
		return adZeros(t)
	}
	return adCastLike(ct, t)
}

// adScanLin linearizes a scan op: it emits the forward scan with the
// residuals as extra ys and returns its results, which of them are active,
// and the backward function (a reversed scan) from their cotangents to the
// arguments'.
func adScanLin(op *ir.Op, args []*Array, argAct []bool) ([]*Array, []bool, func([]*Array) []*Array) {
	s := newScanLin(op, args, argAct)
	dst := adDstFunc()
	s.F = NewTracer(dst, dst.NewRegion())
	s.B = NewTracer(dst, dst.NewRegion())
	defer s.F.Close()
	defer s.B.Close()
	adWith(s.F, s.traceBodies)
	s.sortCaptures()
	s.forwardScan()
	s.arrangeBackward()
	return s.outs, s.outAct(), s.backward
}

// scanLin is the state of adScanLin: the scan's shape, which of its body
// parameters are active, the forward (F) and backward (B) body tracers, and
// what the backward body captured, sorted.
type scanLin struct {
	op   *ir.Op
	args []*Array
	body *ir.Region
	// nc, nk, n: the scan's consts, carries and length; np, ny: its body's
	// parameters and ys.
	nc, nk, n, np, ny int
	rev               bool
	// pAct[i]: body parameter i is active.
	pAct []bool
	// accIdx: the active consts; ccIdx: the active carries; xIdx: the
	// active xs; yIdx: the active ys.
	accIdx, ccIdx, xIdx, yIdx []int
	F, B                      *Tracer
	lin                       *adLin
	// nExp counts the backward body's explicit parameters (accumulators,
	// carry cotangents, ys' cotangents); its captures follow.
	nExp int
	// bps are the backward body's parameters as traced.
	bps []*ir.Value
	// fcaps are the forward body's captures when the backward's are sorted.
	fcaps []*Array
	// The backward body's captures, sorted: consts (bConsts, parameters
	// bConstP), the forward xs (bXs, bXsP) and the residuals (forward
	// arrays resF, parameters resP).
	bConsts, bXs, resF  []*Array
	bConstP, bXsP, resP []*ir.Value
	leafP               map[*ir.Value]*ir.Value
	bRegion             *ir.Region
	outs, stacked       []*Array
}

// newScanLin reads op's attributes and finds the active body parameters.
func newScanLin(op *ir.Op, args []*Array, argAct []bool) *scanLin {
	at := op.Attrs
	body := op.Regions[0]
	s := &scanLin{
		op: op, args: args, body: body,
		nc: at.Int("num_consts"), nk: at.Int("num_carry"), n: at.Int("length"), rev: at.Bool("reverse"),
		np:    len(body.Params),
		leafP: map[*ir.Value]*ir.Value{},
	}
	s.ny = len(body.Results) - s.nk
	s.activity(argAct)
	s.activeIndices()
	return s
}

// activity finds which body parameters are active: a carry is active if
// its initial value is or if the body makes it depend on an active value
// (a fixed point).
func (s *scanLin) activity(argAct []bool) {
	body, nc, nk := s.body, s.nc, s.nk
	s.pAct = make([]bool, s.np)
	pAct := s.pAct
	for i := range pAct {
		pAct[i] = argAct[i] && adFloat(body.Params[i].Type.DType)
	}
	for {
		ra := adActivity(body, pAct)
		changed := false
		for j := 0; j < nk; j++ {
			if ra[j] && !pAct[nc+j] {
				pAct[nc+j], changed = true, true
			}
		}
		if !changed {
			break
		}
	}
}

// activeIndices lists the active consts, carries and xs.
func (s *scanLin) activeIndices() {
	nc, nk := s.nc, s.nk
	for i := 0; i < nc; i++ {
		if s.pAct[i] {
			s.accIdx = append(s.accIdx, i)
		}
	}
	for j := 0; j < nk; j++ {
		if s.pAct[nc+j] {
			s.ccIdx = append(s.ccIdx, j)
		}
	}
	for i := nc + nk; i < s.np; i++ {
		if s.pAct[i] {
			s.xIdx = append(s.xIdx, i-nc-nk)
		}
	}
}

// traceBodies linearizes the body into F (active) and traces the backward
// body into B on top of it.
func (s *scanLin) traceBodies() {
	fp := make([]*Array, s.np)
	for i, p := range s.body.Params {
		fp[i] = s.F.Param(p.Type)
	}
	s.lin = adLinearize(s.body, fp, s.pAct)
	for k := 0; k < s.ny; k++ {
		if s.lin.resAct[s.nk+k] {
			s.yIdx = append(s.yIdx, k)
		}
	}
	adWith(s.B, s.traceBackwardBody)
}

// traceBackwardBody traces the backward body: from the accumulators, the
// carry's and the ys' cotangents to the accumulators, the carry's and the
// xs' cotangents.
func (s *scanLin) traceBackwardBody() {
	B, body, nc, nk := s.B, s.body, s.nc, s.nk
	var acc, cc, cy []*Array
	for _, i := range s.accIdx {
		acc = append(acc, B.Param(adCtType(body.Params[i].Type)))
	}
	for _, j := range s.ccIdx {
		cc = append(cc, B.Param(adCtType(body.Params[nc+j].Type)))
	}
	for _, k := range s.yIdx {
		cy = append(cy, B.Param(adCtType(body.Results[nk+k].Type)))
	}
	s.nExp = len(acc) + len(cc) + len(cy)
	cts := make([]*Array, nk+s.ny)
	for q, j := range s.ccIdx {
		cts[j] = cc[q]
	}
	for q, k := range s.yIdx {
		cts[nk+k] = cy[q]
	}
	pc := s.lin.backward(cts)
	var res []*ir.Value
	for q, i := range s.accIdx {
		res = append(res, B.Output(adCtOrZeros(adAccum(acc[q], pc[i]), body.Params[i].Type)))
	}
	for _, j := range s.ccIdx {
		res = append(res, B.Output(adCtOrZeros(pc[nc+j], body.Params[nc+j].Type)))
	}
	for _, x := range s.xIdx {
		res = append(res, B.Output(adCtOrZeros(pc[nc+nk+x], body.Params[nc+nk+x].Type)))
	}
	B.region.Results = res
}

// outerOf returns the outer array of an F const parameter.
func (s *scanLin) outerOf(v *ir.Value) *Array {
	if v.Index < s.nc {
		return s.args[v.Index]
	}
	return s.fcaps[v.Index-s.np]
}

// isLeaf reports whether v is a loop-invariant parameter of F: a const or
// a capture.
func (s *scanLin) isLeaf(v *ir.Value) bool {
	F := s.F
	return v.Index < len(F.region.Params) && F.region.Params[v.Index] == v && (v.Index < s.nc || v.Index >= s.np)
}

// leafParam returns the backward body's const parameter for the F leaf v,
// adding it if new.
func (s *scanLin) leafParam(v *ir.Value) *ir.Value {
	if p := s.leafP[v]; p != nil {
		return p
	}
	p := s.B.region.AddParam(v.Type)
	s.leafP[v] = p
	s.bConsts, s.bConstP = append(s.bConsts, s.outerOf(v)), append(s.bConstP, p)
	return p
}

// sortCaptures sorts what the backward body captured: consts, xs,
// residuals. Forward values computed from loop-invariant consts by cheap
// shape ops are recomputed in the backward body from the consts rather
// than stacked.
func (s *scanLin) sortCaptures() {
	s.fcaps = s.F.Captures()
	s.bps = append([]*ir.Value(nil), s.B.region.Params...)
	lv := &adLeaves{ok: s.isLeaf, get: s.leafParam}
	for j, c := range s.B.Captures() {
		s.sortCapture(c, s.bps[s.nExp+j], lv)
	}
}

// sortCapture sorts the backward body's capture c, its parameter pv.
func (s *scanLin) sortCapture(c *Array, pv *ir.Value, lv *adLeaves) {
	if c.tr != s.F {
		s.bConsts, s.bConstP = append(s.bConsts, c), append(s.bConstP, pv)
		return
	}
	if c.val.Op == nil {
		switch idx := c.val.Index; {
		case idx < s.nc || idx >= s.np:
			if have := s.leafP[c.val]; have != nil {
				adMergeParam(s.B.region, pv, have)
			} else {
				s.leafP[c.val] = pv
				s.bConsts, s.bConstP = append(s.bConsts, s.outerOf(c.val)), append(s.bConstP, pv)
			}
		case idx < s.nc+s.nk:
			s.resF, s.resP = append(s.resF, c), append(s.resP, pv)
		default:
			s.bXs, s.bXsP = append(s.bXs, s.args[idx]), append(s.bXsP, pv)
		}
		return
	}
	if adRematInto(s.B.region, pv, c.val, lv) {
		return
	}
	s.resF, s.resP = append(s.resF, c), append(s.resP, pv)
}

// forwardScan emits the forward scan: the body's results plus the
// residuals as extra ys.
func (s *scanLin) forwardScan() {
	F := s.F
	adWith(F, func() {
		var vals []*ir.Value
		for _, r := range s.lin.results {
			vals = append(vals, F.Output(r))
		}
		for _, r := range s.resF {
			vals = append(vals, F.Output(r))
		}
		F.region.Results = vals
	})
	fcaps := F.Captures()
	var fslots []adSlot
	for _, p := range F.region.Params[s.np:] {
		fslots = append(fslots, adSlot{v: p})
	}
	for _, p := range F.region.Params[:s.np] {
		fslots = append(fslots, adSlot{v: p})
	}
	adArrange(F.region, fslots)
	fargs := append(append([]*Array{}, fcaps...), s.args...)
	fattrs := ir.Attrs{"num_consts": len(fcaps) + s.nc, "num_carry": s.nk, "length": s.n, "reverse": s.rev}
	all := adApplyRegions(ir.Scan, fattrs, []*ir.Region{F.region}, false, fargs)
	adKeepLoc(all, s.op)
	s.outs, s.stacked = all[:s.nk+s.ny], all[s.nk+s.ny:]
}

// arrangeBackward orders the backward body's parameters: consts, carry
// (accumulators, carry cotangent), xs (ys' cotangents, forward xs,
// residuals).
func (s *scanLin) arrangeBackward() {
	var bslots []adSlot
	for _, p := range s.bConstP {
		bslots = append(bslots, adSlot{v: p})
	}
	for _, p := range s.bps[:s.nExp] {
		bslots = append(bslots, adSlot{v: p})
	}
	for _, p := range append(append([]*ir.Value{}, s.bXsP...), s.resP...) {
		bslots = append(bslots, adSlot{v: p})
	}
	adArrange(s.B.region, bslots)
	s.bRegion = s.B.region
}

// outAct reports which of the scan's results are active.
func (s *scanLin) outAct() []bool {
	outAct := make([]bool, s.nk+s.ny)
	for j := 0; j < s.nk; j++ {
		outAct[j] = s.pAct[s.nc+j]
	}
	for _, k := range s.yIdx {
		outAct[s.nk+k] = true
	}
	return outAct
}

// backward emits the backward scan from the results' cotangents cts and
// returns the arguments' cotangents.
func (s *scanLin) backward(cts []*Array) []*Array {
	nc, nk, body := s.nc, s.nk, s.body
	bargs := append([]*Array{}, s.bConsts...)
	for _, i := range s.accIdx {
		bargs = append(bargs, adZeros(adCtType(body.Params[i].Type)))
	}
	for _, j := range s.ccIdx {
		bargs = append(bargs, adCtOrZeros(cts[j], s.args[nc+j].Type()))
	}
	for _, k := range s.yIdx {
		bargs = append(bargs, adCtOrZeros(cts[nk+k], s.outs[nk+k].Type()))
	}
	bargs = append(append(bargs, s.bXs...), s.stacked...)
	battrs := ir.Attrs{"num_consts": len(s.bConsts), "num_carry": len(s.accIdx) + len(s.ccIdx), "length": s.n, "reverse": !s.rev}
	bo := adApplyRegions(ir.Scan, battrs, []*ir.Region{s.bRegion}, true, bargs)
	adKeepLoc(bo, s.op)
	argCts := make([]*Array, len(s.args))
	for q, i := range s.accIdx {
		argCts[i] = bo[q]
	}
	for q, j := range s.ccIdx {
		argCts[nc+j] = bo[len(s.accIdx)+q]
	}
	off := len(s.accIdx) + len(s.ccIdx)
	for q, x := range s.xIdx {
		argCts[nc+nk+x] = bo[off+q]
	}
	return argCts
}

// adCondLin linearizes a cond op: it emits the forward cond with every
// branch's residuals as extra results and returns its results, which of
// them are active, and the backward function (a cond on the same
// predicate over the branches' VJPs) from their cotangents to the
// arguments'.
func adCondLin(op *ir.Op, args []*Array, argAct []bool) ([]*Array, []bool, func([]*Array) []*Array) {
	s := newCondLin(op, args, argAct)
	dst := adDstFunc()
	for b := range s.regs {
		s.Fs[b], s.Bs[b] = NewTracer(dst, dst.NewRegion()), NewTracer(dst, dst.NewRegion())
		defer s.Fs[b].Close()
		defer s.Bs[b].Close()
		adWith(s.Fs[b], func() { s.linearize(b) })
	}
	s.activeResults()
	s.nExp = len(s.rIdx)
	for b := range s.regs {
		s.traceBackward(b)
		s.sortCaptures(b)
	}
	s.forwardCond()
	s.arrangeBackward()
	return s.outs, s.resAct, s.backward
}

// condLin is the state of adCondLin: the branches' forward (Fs) and
// backward (Bs) tracers, and what each backward branch captured.
type condLin struct {
	op   *ir.Op
	args []*Array
	pred *Array
	// ops are the branches' operands.
	ops  []*Array
	regs []*ir.Region
	// m, nb, nr: the operands, branches and results.
	m, nb, nr int
	// pAct[i]: operand i is active; opIdx lists the active operands.
	pAct  []bool
	opIdx []int
	Fs    []*Tracer
	Bs    []*Tracer
	lins  []*adLin
	// resAct[i]: result i is active in some branch; rIdx lists them.
	resAct []bool
	rIdx   []int
	// nExp counts the backward branches' explicit parameters (the active
	// results' cotangents); their captures follow.
	nExp int
	// outer holds the outer arrays the backward branches capture;
	// outerP[b] maps its indices to branch b's parameters.
	outer  adUnion
	outerP []map[int]*ir.Value
	// resArrs[b] are branch b's residuals (forward arrays), resPs[b] their
	// backward parameters; expPs[b] are its explicit parameters.
	resArrs [][]*Array
	resPs   [][]*ir.Value
	expPs   [][]*ir.Value
	// outs are the forward cond's results, resOuts its residual results.
	outs, resOuts []*Array
	bregions      []*ir.Region
}

// newCondLin finds the active operands.
func newCondLin(op *ir.Op, args []*Array, argAct []bool) *condLin {
	nb := len(op.Regions)
	s := &condLin{
		op: op, args: args, pred: args[0], ops: args[1:], regs: op.Regions,
		m: len(args) - 1, nb: nb, nr: len(op.Results),
		Fs: make([]*Tracer, nb), Bs: make([]*Tracer, nb), lins: make([]*adLin, nb),
		outerP:  make([]map[int]*ir.Value, nb),
		resArrs: make([][]*Array, nb),
		resPs:   make([][]*ir.Value, nb),
		expPs:   make([][]*ir.Value, nb),
	}
	s.pAct = make([]bool, s.m)
	for i := range s.pAct {
		s.pAct[i] = argAct[1+i] && adFloat(s.ops[i].DType())
		if s.pAct[i] {
			s.opIdx = append(s.opIdx, i)
		}
	}
	return s
}

// linearize linearizes branch b into its forward tracer.
func (s *condLin) linearize(b int) {
	fp := make([]*Array, s.m)
	for i, p := range s.regs[b].Params {
		fp[i] = s.Fs[b].Param(p.Type)
	}
	s.lins[b] = adLinearize(s.regs[b], fp, s.pAct)
}

// activeResults finds the results active in some branch.
func (s *condLin) activeResults() {
	s.resAct = make([]bool, s.nr)
	for i := range s.resAct {
		for b := range s.regs {
			s.resAct[i] = s.resAct[i] || s.lins[b].resAct[i]
		}
		if s.resAct[i] {
			s.rIdx = append(s.rIdx, i)
		}
	}
}

// traceBackward traces branch b's backward branch into Bs[b], on top of
// its forward tracer.
func (s *condLin) traceBackward(b int) {
	F, B := s.Fs[b], s.Bs[b]
	adWith(F, func() {
		adWith(B, func() {
			cts := make([]*Array, s.nr)
			for _, i := range s.rIdx {
				cts[i] = B.Param(adCtType(s.op.Results[i].Type))
			}
			pc := s.lins[b].backward(cts)
			var res []*ir.Value
			for _, i := range s.opIdx {
				res = append(res, B.Output(adCtOrZeros(pc[i], s.ops[i].Type())))
			}
			B.region.Results = res
		})
	})
}

// sortCaptures sorts what backward branch b captured: residuals of its
// forward branch (or their cheap recomputation), and outer arrays.
func (s *condLin) sortCaptures(b int) {
	F, B := s.Fs[b], s.Bs[b]
	bps := append([]*ir.Value(nil), B.region.Params...)
	s.expPs[b] = bps[:s.nExp]
	s.outerP[b] = map[int]*ir.Value{}
	fcaps := F.Captures()
	for j, c := range B.Captures() {
		pv := bps[s.nExp+j]
		key := c
		if c.tr == F {
			if c.val.Op != nil {
				if !adRematInto(B.region, pv, c.val, nil) {
					s.resArrs[b], s.resPs[b] = append(s.resArrs[b], c), append(s.resPs[b], pv)
				}
				continue
			}
			if idx := c.val.Index; idx < s.m {
				key = s.ops[idx]
			} else {
				key = fcaps[idx-s.m]
			}
		}
		idx := s.outer.add(key)
		if have := s.outerP[b][idx]; have != nil {
			adMergeParam(B.region, pv, have)
		} else {
			s.outerP[b][idx] = pv
		}
	}
}

// forwardCond emits the forward cond. Its branches return their results,
// then every branch's residuals (zeros from the branches that did not
// compute them).
func (s *condLin) forwardCond() {
	for b := range s.regs {
		s.forwardResults(b)
	}
	fu, fslots := adUnify(s.Fs, s.m)
	fregions := make([]*ir.Region, s.nb)
	for b, F := range s.Fs {
		slots := make([]adSlot, 0, s.m+len(fu.arrs))
		for _, p := range F.region.Params[:s.m] {
			slots = append(slots, adSlot{v: p})
		}
		adArrange(F.region, append(slots, fslots[b]...))
		fregions[b] = F.region
	}
	fargs := append(append([]*Array{s.pred}, s.ops...), fu.arrs...)
	all := adApplyRegions(ir.Cond, nil, fregions, false, fargs)
	adKeepLoc(all, s.op)
	s.outs = all[:s.nr]
	s.resOuts = all[s.nr:]
}

// forwardResults sets forward branch b's results.
func (s *condLin) forwardResults(b int) {
	F := s.Fs[b]
	adWith(F, func() {
		var vals []*ir.Value
		for _, r := range s.lins[b].results {
			vals = append(vals, F.Output(r))
		}
		for bb := range s.regs {
			for _, r := range s.resArrs[bb] {
				if bb == b {
					vals = append(vals, F.Output(r))
				} else {
					vals = append(vals, F.Output(adZeros(r.Type())))
				}
			}
		}
		F.region.Results = vals
	})
}

// arrangeBackward orders every backward branch's parameters: the results'
// cotangents, every branch's residuals (unused slots for the other
// branches'), then the outer arrays.
func (s *condLin) arrangeBackward() {
	s.bregions = make([]*ir.Region, s.nb)
	for b, B := range s.Bs {
		var slots []adSlot
		for _, p := range s.expPs[b] {
			slots = append(slots, adSlot{v: p})
		}
		for bb := range s.regs {
			for q, r := range s.resArrs[bb] {
				if bb == b {
					slots = append(slots, adSlot{v: s.resPs[b][q]})
				} else {
					slots = append(slots, adSlot{t: r.Type()})
				}
			}
		}
		for idx, a := range s.outer.arrs {
			if p := s.outerP[b][idx]; p != nil {
				slots = append(slots, adSlot{v: p})
			} else {
				slots = append(slots, adSlot{t: a.Type()})
			}
		}
		adArrange(B.region, slots)
		s.bregions[b] = B.region
	}
}

// backward emits the backward cond from the results' cotangents cts and
// returns the arguments' cotangents.
func (s *condLin) backward(cts []*Array) []*Array {
	bargs := []*Array{s.pred}
	for _, i := range s.rIdx {
		bargs = append(bargs, adCtOrZeros(cts[i], s.outs[i].Type()))
	}
	bargs = append(append(bargs, s.resOuts...), s.outer.arrs...)
	bo := adApplyRegions(ir.Cond, nil, s.bregions, true, bargs)
	adKeepLoc(bo, s.op)
	argCts := make([]*Array, len(s.args))
	for q, i := range s.opIdx {
		argCts[1+i] = bo[q]
	}
	return argCts
}

// adKeepLoc gives the op that made outs the source location of op.
func adKeepLoc(outs []*Array, op *ir.Op) {
	if op.Loc != "" && len(outs) > 0 && outs[0].val != nil && outs[0].val.Op != nil {
		outs[0].val.Op.Loc = op.Loc
	}
}

// adUnify collects the captures of several tracers' regions (each with nExp
// explicit parameters first) into one ordered set of outer arrays. For each
// region it returns the parameter slots standing for the set, in order: its own
// capture parameter, or a fresh unused one. Parameters of one region that
// capture the same array are merged.
func adUnify(ts []*Tracer, nExp int) (*adUnion, [][]adSlot) {
	u := &adUnion{}
	have := make([]map[int]*ir.Value, len(ts))
	for b, t := range ts {
		have[b] = map[int]*ir.Value{}
		ps := append([]*ir.Value(nil), t.region.Params...)
		for j, c := range t.Captures() {
			pv := ps[nExp+j]
			idx := u.add(c)
			if h := have[b][idx]; h != nil {
				adMergeParam(t.region, pv, h)
			} else {
				have[b][idx] = pv
			}
		}
	}
	slots := make([][]adSlot, len(ts))
	for b := range ts {
		for idx, a := range u.arrs {
			if p := have[b][idx]; p != nil {
				slots[b] = append(slots[b], adSlot{v: p})
			} else {
				slots[b] = append(slots[b], adSlot{t: a.Type()})
			}
		}
	}
	return u, slots
}

// adMergeParam replaces every use of parameter p in r by parameter keep and
// removes p.
func adMergeParam(r *ir.Region, p, keep *ir.Value) {
	adReplaceUses(r, p, keep)
	adRemoveParam(r, p)
}

func adReplaceUses(r *ir.Region, old, nv *ir.Value) {
	for _, op := range r.Ops {
		for i, a := range op.Args {
			if a == old {
				op.Args[i] = nv
			}
		}
	}
	for i, v := range r.Results {
		if v == old {
			r.Results[i] = nv
		}
	}
}

func adRemoveParam(r *ir.Region, p *ir.Value) {
	ps := r.Params[:0:0]
	for _, q := range r.Params {
		if q != p {
			ps = append(ps, q)
		}
	}
	r.Params = ps
}

// adLeaves lets a recomputed value start from forward parameters: ok says
// whether a forward parameter may be used, get returns the backward region's
// value standing for it.
type adLeaves struct {
	ok  func(*ir.Value) bool
	get func(*ir.Value) *ir.Value
}

// adRematInto replaces the backward region's parameter p, which stands for the
// forward value v, by a copy of v's computation when that is cheap: constants,
// iotas and the forward parameters lv accepts (the scan's loop-invariant
// consts), through broadcasts, reshapes, transposes and converts. It reports
// whether it did.
func adRematInto(r *ir.Region, p, v *ir.Value, lv *adLeaves) bool {
	if !adCheap(v, 0, lv) {
		return false
	}
	var pre []*ir.Op
	nv := adCopyCone(r.Func(), v, map[*ir.Value]*ir.Value{}, &pre, lv)
	r.Ops = append(pre, r.Ops...)
	adReplaceUses(r, p, nv)
	adRemoveParam(r, p)
	return true
}

func adCheap(v *ir.Value, depth int, lv *adLeaves) bool {
	op := v.Op
	if op == nil {
		return lv != nil && lv.ok(v)
	}
	if depth > 8 || len(op.Regions) > 0 {
		return false
	}
	switch op.Code {
	case ir.Constant, ir.Iota:
		return true
	case ir.BroadcastInDim, ir.Reshape, ir.Transpose, ir.Convert:
		return adMarkOf(v) == nil && adCheap(op.Args[0], depth+1, lv)
	}
	return false
}

func adCopyCone(f *ir.Func, v *ir.Value, memo map[*ir.Value]*ir.Value, pre *[]*ir.Op, lv *adLeaves) *ir.Value {
	if nv := memo[v]; nv != nil {
		return nv
	}
	if v.Op == nil {
		memo[v] = lv.get(v)
		return memo[v]
	}
	args := make([]*ir.Value, len(v.Op.Args))
	for i, a := range v.Op.Args {
		args[i] = adCopyCone(f, a, memo, pre, lv)
	}
	nop, err := f.NewOp(v.Op.Code, args, maps.Clone(v.Op.Attrs))
	if err != nil {
		panic(Errorf("grad", "internal error: recomputing %v: %v", v.Op.Code, err))
	}
	nop.Loc = v.Op.Loc
	*pre = append(*pre, nop)
	memo[v] = nop.Results[v.Index]
	return memo[v]
}
