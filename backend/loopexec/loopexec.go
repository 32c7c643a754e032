// Package loopexec runs a loop of the executable plan (passes.Loop: a scan,
// while or cond with its nested blocks and bindings) for a backend, over
// the backend's type of memory location: the Init copies, the binding of
// every block's parameters before each run (consts, carries, the running
// iteration's xs slices and the next one's, the ys slices its values are
// computed into), the predicate reads of while and cond, and after each run
// the results put where the plan says (sources another result's
// destination overlaps staged first, results computed in place not
// copied). Both backends run their loops through it: the CPU over byte
// slices, CUDA over device and pinned host pointers.
package loopexec

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Memory is how a backend addresses, moves and reads the bytes at its
// locations L, for one loop step.
type Memory[L any] interface {
	// Slice returns the n bytes at offset off of l.
	Slice(l L, off, n int64) L
	// Copy copies n bytes from src to dst (nothing when they are the same
	// bytes).
	Copy(dst, src L, n int64) error
	// Stage copies the n bytes at src into the loop step's staging buffer
	// of result j and returns it.
	Stage(j int, src L, n int64) (L, error)
	// Predicate reads the boolean at l, once it is computed.
	Predicate(l L) (bool, error)
}

// Block is the activation of one nested block of the loop, reused by every
// run of the block.
type Block[L any] interface {
	// Bind points parameter j at l.
	Bind(j int, l L)
	// BindNext gives a scan body the next iteration's slice of xs parameter
	// j (for its prefetches); ok is false in the last iteration.
	BindNext(j int, l L, ok bool)
	// BindYs points a scan body's values of result j (a ys) at the running
	// iteration's slice.
	BindYs(j int, l L)
	// Run runs the block.
	Run() error
	// Result returns where result j of the last run is.
	Result(j int) (L, error)
	// End tells a scan body that the scan is over (failed: an iteration
	// failed): the work it runs beyond an iteration (prefetches, carried
	// collectives) is waited for, and the first error of it returned.
	End(failed bool) error
}

// BlockName names block k of a loop op of code c: a scan's body, a
// while's cond and body, a cond's true and false branch.
func BlockName(c ir.Code, k int) string {
	switch c {
	case ir.While:
		return [...]string{"cond", "body"}[min(k, 1)]
	case ir.Cond:
		return [...]string{"true branch", "false branch"}[min(k, 1)]
	}
	return "body"
}

// runner is the state of one Run.
type runner[L any] struct {
	st         *passes.Step
	lp         *passes.Loop
	mem        Memory[L]
	args, outs []L
	src        []L
}

// Run runs loop step st, whose operands are at args and results at outs;
// block(k) returns the activation of the loop's block k.
func Run[L any](st *passes.Step, mem Memory[L], args, outs []L, block func(k int) Block[L]) error {
	lp := st.Loop
	r := &runner[L]{st: st, lp: lp, mem: mem, args: args, outs: outs, src: make([]L, len(lp.Results))}
	for _, m := range lp.Init {
		if err := mem.Copy(outs[m.Out], args[m.Arg], st.Op.Results[m.Out].Type.Bytes()); err != nil {
			return err
		}
	}
	switch lp.Code {
	case ir.Scan:
		return r.scan(block)
	case ir.While:
		return r.while(block)
	case ir.Cond:
		ok, err := mem.Predicate(args[0])
		if err != nil {
			return err
		}
		k := 1
		if ok {
			k = 0
		}
		if err := r.run(k, block(k), 0, 0, false); err != nil {
			return fmt.Errorf("%s: %w", BlockName(ir.Cond, k), err)
		}
	}
	return nil
}

func (r *runner[L]) scan(block func(k int) Block[L]) (err error) {
	n := r.lp.Length
	if n == 0 {
		return nil
	}
	body := block(0)
	defer func() {
		if end := body.End(err != nil); err == nil && end != nil {
			err = fmt.Errorf("body: %w", end)
		}
	}()
	for it := range n {
		idx, next := it, it+1
		if r.lp.Reverse {
			idx, next = n-1-it, n-2-it
		}
		if err := r.run(0, body, idx, next, it+1 < n); err != nil {
			return fmt.Errorf("body, iteration %d: %w", idx, err)
		}
	}
	return nil
}

func (r *runner[L]) while(block func(k int) Block[L]) error {
	cond, body := block(0), block(1)
	for it := 0; ; it++ {
		r.bind(cond, 0, 0, false)
		if err := cond.Run(); err != nil {
			return fmt.Errorf("cond, iteration %d: %w", it, err)
		}
		p, err := cond.Result(0)
		if err != nil {
			return err
		}
		if ok, err := r.mem.Predicate(p); err != nil || !ok {
			return err
		}
		if err := r.run(1, body, 0, 0, false); err != nil {
			return fmt.Errorf("body, iteration %d: %w", it, err)
		}
	}
}

// bind binds b's parameters for iteration idx (next: the following one,
// when hasNext) and, in a scan body, its ys slices.
func (r *runner[L]) bind(b Block[L], idx, next int, hasNext bool) {
	for j, p := range r.lp.Params {
		switch p.Kind {
		case passes.BindArg:
			b.Bind(j, r.args[p.Arg])
		case passes.BindOut:
			b.Bind(j, r.outs[p.Out])
		case passes.BindSlice:
			b.Bind(j, r.mem.Slice(r.args[p.Arg], int64(idx)*p.Stride, p.Stride))
			if hasNext {
				b.BindNext(j, r.mem.Slice(r.args[p.Arg], int64(next)*p.Stride, p.Stride), true)
			} else {
				b.BindNext(j, r.args[p.Arg], false)
			}
		}
	}
	for j, res := range r.lp.Results {
		if res.Stride != 0 {
			b.BindYs(j, r.mem.Slice(r.outs[res.Out], int64(idx)*res.Stride, res.Stride))
		}
	}
}

// run binds and runs block k (b) for iteration idx, then puts its results
// where Loop.Results says, as if every source were read before any
// destination is written.
func (r *runner[L]) run(k int, b Block[L], idx, next int, hasNext bool) error {
	r.bind(b, idx, next, hasNext)
	if err := b.Run(); err != nil {
		return err
	}
	blk := r.lp.Blocks[k]
	size := func(j int) int64 { return blk.Slots[blk.Results[j]].Bytes }
	for j, res := range r.lp.Results {
		var err error
		if r.src[j], err = b.Result(j); err != nil {
			return err
		}
		if n := size(j); res.Stage && n > 0 {
			if r.src[j], err = r.mem.Stage(j, r.src[j], n); err != nil {
				return err
			}
		}
	}
	for j, res := range r.lp.Results {
		if res.InPlace {
			continue
		}
		dst := r.outs[res.Out]
		if res.Stride != 0 {
			dst = r.mem.Slice(dst, int64(idx)*res.Stride, res.Stride)
		}
		if err := r.mem.Copy(dst, r.src[j], size(j)); err != nil {
			return err
		}
	}
	return nil
}
