// Package cpuexec executes a compiled passes.Program on the CPU over real
// buffers: the arguments, one allocation per result, and one temporary arena
// per memory space whose size and layout the compiler planned.
//
// New renders the program's executable plan (passes.Lower): the plan's
// blocks, steps and kernels become the regions, steps and block programs
// below. A region runs through backend/blockrun (the schedule's waits,
// prefetches and carried collectives, with the copy and collective workers'
// completions as its events) and its loops through backend/loopexec, both
// shared with the CUDA backend; the vector JIT and the workers are the
// CPU's own.
//
// Every op runs through eval.EvalOpInto writing into its planned buffer,
// except:
//
//   - fusion ops, which run as one pass over memory: the fused region is
//     compiled (at New) into a small program over blocks of the iteration
//     space (1024 elements), so no full-size buffer ever exists for a value
//     inside the group. See fused.go for the three strategies (loop, input,
//     output). Groups the block compiler does not understand fall back to
//     eval (correct, but with full-size temporaries on the Go heap). An f32
//     chain compiled to machine code (vmath.CompileChain) that keeps every
//     intermediate in registers runs instead straight over the operands and
//     results in spans of up to spanTarget elements (row broadcasts read
//     from a per-worker repeated copy), with no block copies at all. Large
//     groups are split across cores in chunks taken from a shared counter by
//     the caller and the process's worker pool (cpu/internal/parallel, shared
//     with the matrix products).
//
//   - dot_general outside fused groups, which runs from the plan's layout
//     (passes.Matmul) as one cpu/gemm call over offset tables worked out at
//     New (matmul.go), bit for bit eval's product.
//
//   - scan, while and cond, which run their nested regions with their
//     sub-plans: the nested arena lives inside the enclosing one at
//     RegionPlan.SubOffset, parameters are views (consts: the operand
//     buffers; carry/state: the op's result buffers, initialised from the
//     operands; xs: the i-th slice of an xs operand, which is contiguous), and
//     region results are copied after each iteration into the carry buffers,
//     the i-th slice of the ys buffers, or the cond results — staging a
//     result through a temporary when its memory overlaps another result's
//     destination (a body returning its carries swapped, say). A result
//     computed in place into its own carry (dynamic_update_slice) is not
//     copied at all.
//
//   - device_put between memory spaces, which is a copy step started on a
//     copy worker and waited for before its result is read or its memory
//     reused, with scan-body copies of xs slices double buffered where the
//     plan reserves their buffer (copy.go; FERRY_ASYNC_COPY=0 copies
//     synchronously).
//
//   - collectives (all_reduce, all_gather, ...; a per-device program of a
//     sharded computation, compiled with passes.Options.BoundAxes), which
//     call the execution's communicator of their axis (Options.Comms) on
//     the calling goroutine; see collective.go.
//
// Numerics are exactly eval's: element values are computed by eval's own
// kernels (eval.Elementwise over blocks) and reductions accumulate in the same
// order and precision.
package cpuexec

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Allocator provides memory for outputs and arenas; the runtime passes its
// device/host pools.
type Allocator interface {
	// Alloc returns at least size bytes (size may be 0) of memory in space,
	// 8-byte aligned, and a function that gives them back. what says what the
	// memory is for ("output 3", "temp arena").
	Alloc(space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error)
}

// Executable is a Program prepared for execution: per region, the buffer of
// every value and the list of steps, and per fusion op its block programs.
// It is immutable after New (but for its pool of frames); Execute may be
// called from several goroutines at once.
type Executable struct {
	prog    *passes.Program
	body    *region
	params  []ir.Type
	results []resultPlan
	copies  bool      // some region copies between memory spaces
	colls   bool      // some region has a collective step
	frames  sync.Pool // *frame of body, kept between executions for reuse
}

// resultPlan says how top-level result i gets its memory (the plan's
// passes.Output) and what its allocation is named.
type resultPlan struct {
	passes.Output
	typ  ir.Type
	what string // "output i", naming its allocation
}

// New prepares p for execution. It checks that the plan covers every value
// that needs memory, that offsets fit the arenas and that aliases refer to
// donated parameters, and compiles every fusion op.
func New(p *passes.Program) (*Executable, error) {
	if p == nil || p.Func == nil || p.Func.Body == nil || p.Plan == nil {
		return nil, fmt.Errorf("cpuexec: incomplete program")
	}
	f := p.Func
	ex, err := passes.Lower(p)
	if err != nil {
		return nil, fmt.Errorf("cpuexec %s: %w", f.Name, err)
	}
	body, err := compileRegion(ex.Top)
	if err != nil {
		return nil, fmt.Errorf("cpuexec %s: %w", f.Name, err)
	}
	e := &Executable{prog: p, body: body, params: f.Body.ParamTypes(), copies: hasStep(body, stepCopy), colls: hasStep(body, stepCollective)}
	for i, o := range ex.Outputs {
		e.results = append(e.results, resultPlan{Output: o, typ: f.Body.Results[i].Type, what: fmt.Sprintf("output %d", i)})
	}
	return e, nil
}

// Program returns the program e executes.
func (e *Executable) Program() *passes.Program { return e.prog }

// HasCollectives reports whether the program holds collective ops, whose
// executions need Options.Comms.
func (e *Executable) HasCollectives() bool { return e.colls }

// Execute runs the program: args are one literal per body parameter (types
// must match, memory space included; donated parameters may be overwritten
// when the plan aliases them). It allocates each result with
// Alloc(space, bytes, "output i") — except aliased results, which reuse the
// donated argument's memory and come with a no-op release — and one arena
// per memory space whose planned size is not zero (Alloc(space, size,
// "temp arena")), runs the steps over views into those buffers, releases the
// arenas, and returns the results and their release funcs. On error
// everything allocated so far is released.
func (e *Executable) Execute(args []*ir.Literal, a Allocator) (outs []*ir.Literal, release []func(), err error) {
	return e.ExecuteWith(args, a, Options{})
}

// ExecuteWith is Execute with options: the communicators and context of a
// program with collectives.
func (e *Executable) ExecuteWith(args []*ir.Literal, a Allocator, opts Options) (outs []*ir.Literal, release []func(), err error) {
	outs, release = make([]*ir.Literal, len(e.results)), make([]func(), len(e.results))
	if err := e.ExecuteIntoWith(args, a, outs, release, opts); err != nil {
		return nil, nil, err
	}
	return outs, release, nil
}

// setOut makes outs[i] a literal of typ over data, in place if it is not nil.
func setOut(outs []*ir.Literal, i int, typ ir.Type, data []byte) {
	if outs[i] == nil {
		outs[i] = &ir.Literal{Type: typ, Data: data}
		return
	}
	outs[i].Type, outs[i].Data = typ, data
}

// NumResults is the number of results of the program.
func (e *Executable) NumResults() int { return len(e.results) }

// ExecuteInto is Execute writing the results and their release funcs into
// outs and release, which must have NumResults elements (so that a caller
// can reuse them); on error both are cleared. A result whose element of
// outs is not nil is written into that literal (its Type and Data are
// overwritten) instead of a new one, so that a caller can provide the
// literals' storage.
func (e *Executable) ExecuteInto(args []*ir.Literal, a Allocator, outs []*ir.Literal, release []func()) error {
	return e.ExecuteIntoWith(args, a, outs, release, Options{})
}

// ExecuteIntoWith is ExecuteInto with options: the communicators and
// context of a program with collectives. When the program has collectives
// and the execution fails, it aborts every communicator of opts.Comms
// first (see Options.Comms).
func (e *Executable) ExecuteIntoWith(args []*ir.Literal, a Allocator, outs []*ir.Literal, release []func(), opts Options) (err error) {
	var relBuf [8]func()
	rels := relBuf[:0] // what to release on error, in allocation order
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("cpuexec %s: internal error: %v", e.prog.Func.Name, p)
		}
		if err != nil {
			for i := len(rels) - 1; i >= 0; i-- {
				rels[i]()
			}
			clear(outs)
			clear(release)
			if e.colls {
				abortComms(opts.Comms, err)
			}
		}
	}()
	if a == nil {
		return fmt.Errorf("cpuexec %s: nil allocator", e.prog.Func.Name)
	}
	if len(args) != len(e.params) {
		return fmt.Errorf("cpuexec %s: takes %d arguments, got %d", e.prog.Func.Name, len(e.params), len(args))
	}
	for i, l := range args {
		if l == nil {
			return fmt.Errorf("cpuexec %s: argument %d is nil", e.prog.Func.Name, i)
		}
		if !l.Type.Equal(e.params[i]) {
			return fmt.Errorf("cpuexec %s: argument %d is %v, want %v", e.prog.Func.Name, i, l.Type, e.params[i])
		}
		if int64(len(l.Data)) != l.Type.Bytes() {
			return fmt.Errorf("cpuexec %s: argument %d of type %v has %d bytes, want %d", e.prog.Func.Name, i, l.Type, len(l.Data), l.Type.Bytes())
		}
	}
	if len(outs) != len(e.results) || len(release) != len(e.results) {
		return fmt.Errorf("cpuexec %s: room for %d and %d results, want %d", e.prog.Func.Name, len(outs), len(release), len(e.results))
	}
	for i, rp := range e.results {
		if rp.Alias >= 0 {
			setOut(outs, i, rp.typ, args[rp.Alias].Data[:rp.typ.Bytes()])
			release[i] = func() {}
			continue
		}
		mem, rel, err := alloc(a, rp.typ.Space, rp.typ.Bytes(), rp.what)
		if err != nil {
			return fmt.Errorf("cpuexec %s: %w", e.prog.Func.Name, err)
		}
		rels = append(rels, rel)
		setOut(outs, i, rp.typ, mem)
		release[i] = rel
	}
	nOut := len(rels)
	var arena [2][]byte
	for sp := range arena {
		size := e.body.plan.Arena[sp]
		if size == 0 {
			continue
		}
		mem, rel, err := alloc(a, ir.MemorySpace(sp), size, "temp arena")
		if err != nil {
			return fmt.Errorf("cpuexec %s: %w", e.prog.Func.Name, err)
		}
		rels = append(rels, rel)
		arena[sp] = mem
	}
	cfg := &defaultCopyConfig
	if e.copies {
		// Only programs that copy read the settings of copies (on every
		// execution, so that a changed environment takes effect).
		if cfg, err = copyConfigFromEnv(); err != nil {
			return fmt.Errorf("cpuexec %s: %w", e.prog.Func.Name, err)
		}
	}
	var env *collEnv
	if e.colls {
		env = &collEnv{comms: opts.Comms, ctx: opts.Context}
		if env.ctx == nil {
			env.ctx = context.Background()
		}
		if err = env.configFromEnv(); err != nil {
			return fmt.Errorf("cpuexec %s: %w", e.prog.Func.Name, err)
		}
	}
	fr := e.getFrame(arena, cfg, env)
	for i, l := range args {
		fr.Bind(i, l.Data)
	}
	for s, sl := range e.body.slots {
		switch sl.Buf.Kind {
		case passes.BufOutput:
			fr.lits[s].Data = outs[sl.Buf.Index].Data
		case passes.BufAlias:
			fr.lits[s].Data = args[sl.Buf.Param].Data[:sl.Bytes]
		}
	}
	fr.refresh()
	err = fr.Run()
	env.stop(err) // no collective writes the arena once it returns
	if err != nil {
		return fmt.Errorf("cpuexec %s: %w", e.prog.Func.Name, err)
	}
	for i, rp := range e.results {
		if rp.Copy {
			copy(outs[i].Data, fr.lits[rp.Slot].Data)
		}
	}
	e.putFrame(fr)
	for i := len(rels) - 1; i >= nOut; i-- {
		rels[i]()
	}
	return nil
}

// getFrame returns a frame of the body over arena: one a finished execution
// left for reuse, or a new one. A frame is used by one execution at a time.
func (e *Executable) getFrame(arena [2][]byte, cfg *copyConfig, env *collEnv) *frame {
	if f, ok := e.frames.Get().(*frame); ok {
		f.bind(arena, cfg, env)
		return f
	}
	return newFrame(e.body, arena, cfg, env)
}

// putFrame keeps a frame whose execution succeeded for the next one (a
// frame of a failed execution is dropped: it may hold copies in flight).
func (e *Executable) putFrame(f *frame) {
	f.unbind()
	e.frames.Put(f)
}

// hasStep reports whether g or a region nested in it has a step of kind k.
func hasStep(g *region, k stepKind) bool {
	for i := range g.steps {
		if g.steps[i].kind == k {
			return true
		}
		for _, sub := range g.steps[i].subs {
			if hasStep(sub, k) {
				return true
			}
		}
	}
	return false
}

// alloc calls a.Alloc and checks the memory it returns.
func alloc(a Allocator, space ir.MemorySpace, size int64, what string) ([]byte, func(), error) {
	mem, rel, err := a.Alloc(space, size, what)
	if err != nil {
		return nil, nil, fmt.Errorf("allocating %s (%d bytes in %v): %w", what, size, space, err)
	}
	if rel == nil {
		rel = func() {}
	}
	if int64(len(mem)) < size {
		rel()
		return nil, nil, fmt.Errorf("allocating %s: got %d bytes, want %d", what, len(mem), size)
	}
	mem = mem[:size:size]
	if size > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%8 != 0 {
		rel()
		return nil, nil, fmt.Errorf("allocating %s: memory is not 8-byte aligned", what)
	}
	return mem, rel, nil
}
