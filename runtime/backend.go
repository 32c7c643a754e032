package runtime

import (
	"github.com/ferryml/ferry/backend"
	_ "github.com/ferryml/ferry/cpu" // registers the CPU backend
	"github.com/ferryml/ferry/trace"
)

// Backend compiles IR functions and holds buffers for one kind of device
// (backend.Backend).
type Backend = backend.Backend

// CompileOptions configure Backend.Compile (backend.CompileOptions).
type CompileOptions = backend.CompileOptions

// ExecOptions configure one execution (backend.ExecOptions).
type ExecOptions = backend.ExecOptions

// Executable is a compiled function a backend can run (backend.Executable).
type Executable = backend.Executable

// Device is one device of a backend (backend.Device).
type Device = backend.Device

// RegisterBackend makes a backend available by name. A backend registered by an
// accelerator package (cuda) becomes the default unless FERRY_BACKEND says otherwise.
func RegisterBackend(b Backend) { backend.Register(b) }

// DefaultBackend returns the backend arrays and jitted functions use by default.
func DefaultBackend() Backend { return backend.Default() }

// Devices returns the devices of the default backend: after
// InitDistributed, those of every process of the job, indexed by global
// device ID (LocalDevices lists this process's).
func Devices() []Device { return globalDevices(DefaultBackend()) }

func init() {
	trace.SetExecutor(eagerExecutor{})
}
