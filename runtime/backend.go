package runtime

import (
	"fmt"
	"os"
	goruntime "runtime"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/cpuexec"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// Backend compiles IR functions and holds buffers for one kind of device.
type Backend interface {
	// Name is the platform name: "cpu" or "cuda".
	Name() string
	// Devices lists the backend's devices.
	Devices() []Device
	// FromLiteral copies a host literal into a new buffer in its memory space.
	FromLiteral(l *ir.Literal) (trace.Buffer, error)
	// Compile prepares f for execution.
	Compile(f *ir.Func, opts CompileOptions) (Executable, error)
}

// CompileOptions configure Backend.Compile.
type CompileOptions struct {
	// Donated[i] says parameter i's buffer is donated: the executable may reuse
	// it for a result, and it is unusable after the call.
	Donated []bool
}

// ExecOptions configure one execution.
type ExecOptions struct {
	// DonationSite is the caller's file:line, recorded on donated buffers so
	// that using them later says where they were donated.
	DonationSite string
}

// Executable is a compiled function a backend can run.
type Executable interface {
	// Execute runs the function on buffers of the backend (one per parameter).
	Execute(args []trace.Buffer, opts ExecOptions) ([]trace.Buffer, error)
	// Program is the compiled program: the optimised IR, its buffer plan and
	// its memory analysis.
	Program() *passes.Program
}

// Device is one device of a backend.
type Device struct {
	// Platform is the backend name ("cpu", "cuda").
	Platform string
	// ID is the device's index within its platform.
	ID int
	// Kind describes the hardware.
	Kind string
}

// String formats the device like JAX: CpuDevice(id=0).
func (d Device) String() string {
	return fmt.Sprintf("%s:%d(%s)", d.Platform, d.ID, d.Kind)
}

var (
	backendsMu sync.Mutex
	backends   = map[string]Backend{}
	defaultBE  Backend
)

// RegisterBackend makes a backend available by name. A backend registered by an
// accelerator package (cuda) becomes the default unless FERRY_BACKEND says otherwise.
func RegisterBackend(b Backend) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	backends[b.Name()] = b
	if want := os.Getenv("FERRY_BACKEND"); want == "" || want == b.Name() {
		if defaultBE == nil || b.Name() != "cpu" {
			defaultBE = b
		}
	}
}

// DefaultBackend returns the backend arrays and jitted functions use by default.
func DefaultBackend() Backend {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if defaultBE == nil {
		return backends["cpu"]
	}
	return defaultBE
}

// Devices returns the devices of the default backend.
func Devices() []Device { return DefaultBackend().Devices() }

// cpuBackend compiles IR through the pass pipeline and runs it with the CPU
// executor over memory from the pools.
type cpuBackend struct{}

func (cpuBackend) Name() string { return "cpu" }

func (cpuBackend) Devices() []Device { return []Device{{Platform: "cpu", ID: 0, Kind: "cpu"}} }

func (cpuBackend) FromLiteral(l *ir.Literal) (trace.Buffer, error) {
	if int64(len(l.Data)) != l.Type.Bytes() {
		return nil, fmt.Errorf("literal %v has %d bytes, want %d", l.Type, len(l.Data), l.Type.Bytes())
	}
	b, err := newBuffer(l)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// verifyPasses runs the IR verifier after every pass: always in tests, and when
// FERRY_VERIFY_IR is set.
var verifyPasses = testing.Testing() || os.Getenv("FERRY_VERIFY_IR") != ""

func (cpuBackend) Compile(f *ir.Func, opts CompileOptions) (Executable, error) {
	prog, err := passes.Compile(f, passes.Options{Donated: opts.Donated, Verify: verifyPasses, FusionInPlace: true})
	if err != nil {
		return nil, err
	}
	exe, err := cpuexec.New(prog)
	if err != nil {
		return nil, err
	}
	e := &cpuExecutable{prog: prog, exe: exe, aliasOf: make([]int, len(prog.Func.Body.Results)), alloc: memPools.allocatorFor(prog.Func.Name)}
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
	aliasOf []int             // donated parameter whose memory result i reuses, or -1
	alloc   cpuexec.Allocator // memPools naming allocations after the function
}

func (e *cpuExecutable) Program() *passes.Program { return e.prog }

func (e *cpuExecutable) Execute(args []trace.Buffer, opts ExecOptions) ([]trace.Buffer, error) {
	lits := make([]*ir.Literal, len(args))
	for i, a := range args {
		l, err := a.Literal()
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i, err)
		}
		lits[i] = l
	}
	outs, rels, err := e.exe.Execute(lits, e.alloc)
	goruntime.KeepAlive(lits)
	if err != nil {
		return nil, err
	}
	res := make([]trace.Buffer, len(outs))
	donatedUsed := map[int]bool{}
	for i, o := range outs {
		if j := e.aliasOf[i]; j >= 0 {
			cb, ok := args[j].(*cpuBuffer)
			if !ok {
				return nil, fmt.Errorf("donated argument %d is not a CPU buffer", j)
			}
			_, rel, err := cb.donate(opts.DonationSite)
			if err != nil {
				return nil, fmt.Errorf("donated argument %d: %w", j, err)
			}
			donatedUsed[j] = true
			res[i] = newPoolBuffer(o, rel, "")
			continue
		}
		res[i] = newPoolBuffer(o, rels[i], "")
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

func init() {
	RegisterBackend(cpuBackend{})
	trace.SetExecutor(eagerExecutor{})
}
