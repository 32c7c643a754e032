package cpu

import (
	"fmt"
	"github.com/ferryml/ferry/internal/scratch"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/cpu/cpuexec"
	"github.com/ferryml/ferry/cpu/gemm"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// cpuBackend compiles IR through the pass pipeline and runs it with the CPU
// executor over memory from the pools.
type cpuBackend struct{}

func (cpuBackend) Name() string { return "cpu" }

// Devices lists the virtual devices cpu:0 to cpu:N-1 (N is
// MemoryConfig.Devices, FERRY_CPU_DEVICES; 1 by default).
func (cpuBackend) Devices() []backend.Device {
	out := make([]backend.Device, memPools.NumDevices())
	for i := range out {
		out[i] = backend.Device{Platform: "cpu", ID: i, Kind: "cpu"}
	}
	return out
}

// FromLiteral copies a host literal into a new buffer on device 0, not
// committed to it.
func (cpuBackend) FromLiteral(l *ir.Literal) (ir.Buffer, error) {
	if int64(len(l.Data)) != l.Type.Bytes() {
		return nil, fmt.Errorf("literal %v has %d bytes, want %d", l.Type, len(l.Data), l.Type.Bytes())
	}
	b, err := newBuffer(l)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// FromLiteralOn copies a host literal into a new buffer on device dev,
// committed to it (backend.Placer).
func (cpuBackend) FromLiteralOn(l *ir.Literal, dev int) (ir.Buffer, error) {
	if n := memPools.NumDevices(); dev < 0 || dev >= n {
		return nil, deviceError(dev, n)
	}
	b, err := newBufferOn(l, dev, true, 3)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// verifyPasses runs the IR verifier after every pass: always in tests, and when
// FERRY_VERIFY_IR is set.
var verifyPasses = testing.Testing() || passes.VerifyFromEnv()

func (cpuBackend) Compile(f *ir.Func, opts backend.CompileOptions) (backend.Executable, error) {
	prog, err := passes.Compile(f, passes.Options{Donated: opts.Donated, Verify: verifyPasses, FusionInPlace: true, PrefetchGathers: true, BoundAxes: opts.BoundAxes, MemoryPlan: opts.MemoryPlan, NoDump: opts.NoDump})
	if err != nil {
		return nil, err
	}
	exe, err := cpuexec.New(prog)
	if err != nil {
		return nil, err
	}
	suffix := ""
	if prog.Func.Name != "" {
		suffix = " of " + prog.Func.Name
	}
	e := &cpuExecutable{prog: prog, exe: exe, aliasOf: make([]int, len(prog.Func.Body.Results)), suffix: suffix}
	for i, v := range prog.Func.Body.Results {
		e.aliasOf[i] = -1
		if b, ok := prog.Plan.Values[v]; ok && b.Kind == passes.BufAlias && b.Index == i {
			e.aliasOf[i] = b.Param
		}
	}
	return e, nil
}

type cpuExecutable struct {
	prog    *passes.Program
	exe     *cpuexec.Executable
	aliasOf []int  // donated parameter whose memory result i reuses, or -1
	suffix  string // " of name": names allocations after the function
	namesMu sync.Mutex
	names   atomic.Pointer[[]allocName] // the names made so far (copied on write)
}

// allocName is what an executor allocates memory for ("output 0") and the
// name the pools record ("output 0 of train_step").
type allocName struct{ what, name string }

// name is what with the function's name appended, made once per what so
// that an allocation's record costs no string concatenation.
func (e *cpuExecutable) name(what string) string {
	if e.suffix == "" {
		return what
	}
	if names := e.names.Load(); names != nil {
		for _, n := range *names {
			if n.what == what {
				return n.name
			}
		}
	}
	e.namesMu.Lock()
	defer e.namesMu.Unlock()
	var names []allocName
	if p := e.names.Load(); p != nil {
		names = *p
	}
	for _, n := range names {
		if n.what == what {
			return n.name
		}
	}
	name := what + e.suffix
	if len(names) < maxAllocNames {
		names = append(slices.Clip(names), allocName{what, name})
		e.names.Store(&names)
	}
	return name
}

// maxAllocNames bounds an executable's cache of allocation names.
const maxAllocNames = 64

func (e *cpuExecutable) Program() *passes.Program { return e.prog }

// execAlloc is the pools as the allocator of one execution: it names
// allocations after the function (" of name" appended to what: "output 0 of
// train_step", "temp arena of train_step"), hands out uninitialised memory
// (AllocUninit: executors write every byte of an output or arena value
// before reading it) and keeps the records of what it hands out, so that the
// execution's results become buffers without looking their memory up and
// its release functions allocate nothing. Its owner releases the records:
// the results' with the results, everything else (the arenas) when the
// execution returns, and all of them when it fails.
type execAlloc struct {
	exe  *cpuExecutable
	dev  int // the device whose pools it allocates from
	recs []*allocRecord
	lits []*ir.Literal // the execution's arguments
	outs []*ir.Literal // its results: the literals of bufs
	bufs []*cpuBuffer  // the results' buffers, made before the execution
	rels []func()      // their release functions (noRelease)
	// call is the execution's envelope: its arguments, checked.
	call backend.Call[*cpuBuffer]
}

var execAllocs = sync.Pool{New: func() any { return new(execAlloc) }}

func (a *execAlloc) Alloc(space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error) {
	rec, mem, err := memPools.alloc(a.dev, space, size, a.exe.name(what), false, true, 3)
	if err != nil {
		return nil, nil, err
	}
	if rec != nil {
		a.recs = append(a.recs, rec)
	}
	return mem, noRelease, nil
}

func noRelease() {}

// claim returns the record of memory mem and forgets it (nil if mem is not
// memory the execution allocated).
func (a *execAlloc) claim(mem []byte) *allocRecord {
	if len(mem) == 0 {
		return nil
	}
	addr := addrOf(mem)
	for i, r := range a.recs {
		if r != nil && r.Addr == addr {
			a.recs[i] = nil
			return r
		}
	}
	return nil
}

// releaseAll releases the records not claimed and empties a.
func (a *execAlloc) releaseAll() {
	for _, r := range a.recs {
		if r != nil {
			r.release()
		}
	}
	scratch.ClearSmall(a.recs)
	scratch.ClearSmall(a.lits)
	scratch.ClearSmall(a.outs)
	scratch.ClearSmall(a.bufs)
	a.recs, a.lits, a.outs, a.bufs = a.recs[:0], a.lits[:0], a.outs[:0], a.bufs[:0]
}

// Execute runs the program on device opts.Device, where every argument must
// be; the results are allocated there, committed to it if opts.Commit. The
// collectives of a per-device program use opts.Comms and opts.Context; when
// such an execution fails, it aborts opts.Comms (backend.ExecOptions). The
// caller holds the arguments while it runs (backend.HoldArgs), so that a
// Delete or a donation in another goroutine does not free them under it;
// backend.Call checks them and settles the donated ones.
func (e *cpuExecutable) Execute(args []ir.Buffer, opts backend.ExecOptions) (res []ir.Buffer, err error) {
	if e.exe.HasCollectives() {
		defer func() {
			if err != nil {
				// The executor aborts on its own errors; these are the
				// ones before it runs.
				backend.AbortComms(opts, err)
			}
		}()
	}
	dev := opts.Device
	if n := memPools.NumDevices(); dev < 0 || dev >= n {
		return nil, deviceError(dev, n)
	}
	a := execAllocs.Get().(*execAlloc)
	a.exe, a.dev = e, dev
	defer func() {
		a.call.End(err)
		a.releaseAll()
		a.exe = nil
		execAllocs.Put(a)
	}()
	if err := a.call.Start(cpuTarget{}, e.prog.Func.Body.Params, e.prog.Donated, args, dev, opts.DonationSite); err != nil {
		return nil, err
	}
	for i, cb := range a.call.Args {
		if i < len(e.prog.Donated) && e.prog.Donated[i] {
			gemm.Forget(cb.lit.Data) // the call may write over it
		} else {
			cb.markReadOnly() // products may keep it packed
		}
		a.lits = append(a.lits, &cb.lit)
	}
	holdEvent(HoldEventRun)
	n := e.exe.NumResults()
	a.outs, a.rels = slices.Grow(a.outs[:0], n)[:n], slices.Grow(a.rels[:0], n)[:n]
	a.bufs = slices.Grow(a.bufs[:0], n)[:n]
	for i := range a.bufs {
		// The executor writes each result into its buffer's literal.
		a.bufs[i] = &cpuBuffer{dev: uint16(dev), committed: opts.Commit}
		a.outs[i] = &a.bufs[i].lit
	}
	err = e.exe.ExecuteIntoWith(a.lits, a, a.outs, a.rels, cpuexec.Options{Comms: opts.Comms, Context: opts.Context})
	goruntime.KeepAlive(a.lits)
	if err != nil {
		return nil, err
	}
	res = backend.Results(opts, n)
	for i, o := range a.outs {
		if res[i], err = e.wrapResult(a, i, o, opts.DonationSite); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// wrapResult makes result i of an execution, whose literal is o, a buffer:
// in the memory of the donated argument it reuses, taken over from that
// argument, or in the memory the execution allocated for it.
func (e *cpuExecutable) wrapResult(a *execAlloc, i int, o *ir.Literal, site string) (ir.Buffer, error) {
	b := a.bufs[i]
	if j := e.aliasOf[i]; j >= 0 {
		if a.call.Imported(j) {
			return nil, fmt.Errorf("donated argument %d is not a CPU buffer", j)
		}
		_, rec, rel, err := a.call.Args[j].handOver(site)
		if err != nil {
			return nil, fmt.Errorf("donated argument %d: %w", j, err)
		}
		if rec != nil {
			rec.setArray(o.Type, "")
			return b.wrapRecord(rec), nil
		}
		return b.wrapLiteral(rel), nil
	}
	if rec := a.claim(o.Data); rec != nil {
		rec.setArray(o.Type, "")
		return b.wrapRecord(rec), nil
	}
	return b.wrapLiteral(nil), nil // no memory (a zero-size result)
}

// cpuTarget is the CPU backend to the envelope of its executions
// (backend.ExecTarget).
type cpuTarget struct{}

func (cpuTarget) Platform() string { return "cpu" }

func (cpuTarget) Own(b ir.Buffer) (*cpuBuffer, bool) {
	cb, ok := b.(*cpuBuffer)
	return cb, ok
}

// Import wraps another backend's contents l without copying them: the
// execution reads l in place and the buffer frees nothing.
func (cpuTarget) Import(l *ir.Literal, dev int) (*cpuBuffer, error) {
	return &cpuBuffer{lit: *l, dev: uint16(dev)}, nil
}

func (cpuTarget) Placed(b *cpuBuffer) (int, bool)         { return int(b.dev), true }
func (cpuTarget) State(b *cpuBuffer) *backend.BufferState { return &b.st }
func (cpuTarget) Free(b *cpuBuffer)                       { b.free() }

func init() {
	backend.Register(cpuBackend{})
}
