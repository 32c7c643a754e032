package runtime

import (
	"fmt"
	"os"
	"sync"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
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
	Compile(f *ir.Func) (Executable, error)
}

// Executable is a compiled function a backend can run.
type Executable interface {
	// Execute runs the function on buffers of the backend (one per parameter).
	Execute(args []trace.Buffer) ([]trace.Buffer, error)
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

// cpuBackend executes IR with the reference executor.
type cpuBackend struct{}

func (cpuBackend) Name() string { return "cpu" }

func (cpuBackend) Devices() []Device { return []Device{{Platform: "cpu", ID: 0, Kind: "cpu"}} }

func (cpuBackend) FromLiteral(l *ir.Literal) (trace.Buffer, error) {
	if int64(len(l.Data)) != l.Type.Bytes() {
		return nil, fmt.Errorf("literal %v has %d bytes, want %d", l.Type, len(l.Data), l.Type.Bytes())
	}
	return newCPUBuffer(l.Clone()), nil
}

func (cpuBackend) Compile(f *ir.Func) (Executable, error) { return &cpuExecutable{f: f}, nil }

type cpuExecutable struct{ f *ir.Func }

func (e *cpuExecutable) Execute(args []trace.Buffer) ([]trace.Buffer, error) {
	lits := make([]*ir.Literal, len(args))
	for i, a := range args {
		l, err := a.Literal()
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i, err)
		}
		lits[i] = l
	}
	outs, err := eval.Run(e.f, lits)
	if err != nil {
		return nil, err
	}
	res := make([]trace.Buffer, len(outs))
	for i, o := range outs {
		res[i] = newCPUBuffer(o)
	}
	return res, nil
}

func init() {
	RegisterBackend(cpuBackend{})
	trace.SetExecutor(eagerExecutor{})
}
