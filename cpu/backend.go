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
	for _, d := range prog.Donated {
		e.donates = e.donates || d
	}
	return e, nil
}

type cpuExecutable struct {
	prog    *passes.Program
	exe     *cpuexec.Executable
	aliasOf []int  // donated parameter whose memory result i reuses, or -1
	donates bool   // some parameter is donated
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
		if r != nil && r.addr == addr {
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
// Delete or a donation in another goroutine does not free them under it.
func (e *cpuExecutable) Execute(args []ir.Buffer, opts backend.ExecOptions) (res []ir.Buffer, err error) {
	if e.exe.HasCollectives() {
		defer func() {
			if err != nil {
				// The executor aborts on its own errors; these are the
				// ones before it runs (a second Abort changes nothing).
				for _, c := range opts.Comms {
					if c != nil {
						c.Abort(err)
					}
				}
			}
		}()
	}
	dev := opts.Device
	if n := memPools.NumDevices(); dev < 0 || dev >= n {
		return nil, deviceError(dev, n)
	}
	for i, arg := range args {
		if d := bufferDevice(arg); d != dev {
			return nil, fmt.Errorf("argument %d (%v) is on cpu:%d, but the call runs on cpu:%d", i, arg.Type(), d, dev)
		}
	}
	a := execAllocs.Get().(*execAlloc)
	a.exe, a.dev = e, dev
	defer func() {
		a.releaseAll()
		a.exe = nil
		execAllocs.Put(a)
	}()
	for i, arg := range args {
		var l *ir.Literal
		if cb, ok := arg.(*cpuBuffer); ok {
			l, err = cb.heldLiteral() // the caller holds it (backend.HoldArgs)
		} else {
			l, err = arg.Literal()
		}
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i, err)
		}
		if cb, ok := arg.(*cpuBuffer); ok {
			if i < len(e.prog.Donated) && e.prog.Donated[i] {
				gemm.Forget(l.Data) // the call may write over it
			} else {
				cb.markReadOnly() // products may keep it packed
			}
		}
		a.lits = append(a.lits, l)
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
	outs := a.outs
	res = opts.Results[:0]
	if cap(res) < len(outs) {
		res = make([]ir.Buffer, len(outs))
	}
	res = res[:len(outs)]
	var donatedUsed []bool
	if e.donates {
		donatedUsed = make([]bool, len(args))
	}
	for i, o := range outs {
		b := a.bufs[i]
		if j := e.aliasOf[i]; j >= 0 {
			cb, ok := args[j].(*cpuBuffer)
			if !ok {
				return nil, fmt.Errorf("donated argument %d is not a CPU buffer", j)
			}
			_, rec, rel, err := cb.handOver(opts.DonationSite)
			if err != nil {
				return nil, fmt.Errorf("donated argument %d: %w", j, err)
			}
			donatedUsed[j] = true
			if rec != nil {
				rec.setArray(o.Type, "")
				res[i] = b.wrapRecord(rec)
			} else {
				res[i] = b.wrapLiteral(rel)
			}
			continue
		}
		if rec := a.claim(o.Data); rec != nil {
			rec.setArray(o.Type, "")
			res[i] = b.wrapRecord(rec)
		} else {
			res[i] = b.wrapLiteral(nil) // no memory (a zero-size result)
		}
	}
	for j, d := range e.prog.Donated {
		if d && !donatedUsed[j] {
			if cb, ok := args[j].(*cpuBuffer); ok {
				cb.markDonated(opts.DonationSite)
			}
		}
	}
	return res, nil
}

// bufferDevice is the device of a buffer (backend.BufferDevice, without an
// interface conversion for the CPU backend's own buffers).
func bufferDevice(b ir.Buffer) int {
	if cb, ok := b.(*cpuBuffer); ok {
		return int(cb.dev)
	}
	d, _ := backend.BufferDevice(b)
	return d
}

func init() {
	backend.Register(cpuBackend{})
}
