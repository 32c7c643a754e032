// Package backend is what Ferry's runtime sees of a backend: the Backend,
// Executable and Device interfaces, the registry of backends, the errors
// every backend's buffers return (ErrDeleted, ErrDonated), and the
// per-memory-space statistics a backend reports (Memory). The CPU backend
// (package cpu) and the CUDA backend (package cuda) are peers: both
// implement it and register themselves; runtime's MemoryStats, LiveArrays
// and memory profile ask every registered backend that implements Memory.
//
// The contract is written over ir's types only (ir.Buffer, ir.Holder): a
// backend need not import the tracer.
//
// Users normally reach this through runtime's aliases (runtime.Backend,
// runtime.RegisterBackend, ...).
package backend

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Backend compiles IR functions and holds buffers for one kind of device.
type Backend interface {
	// Name is the platform name: "cpu" or "cuda".
	Name() string
	// Devices lists the backend's devices.
	Devices() []Device
	// FromLiteral copies a host literal into a new buffer in its memory space.
	FromLiteral(l *ir.Literal) (ir.Buffer, error)
	// Compile prepares f for execution.
	Compile(f *ir.Func, opts CompileOptions) (Executable, error)
}

// CompileOptions configure Backend.Compile.
type CompileOptions struct {
	// Donated[i] says parameter i's buffer is donated: the executable may reuse
	// it for a result, and it is unusable after the call.
	Donated []bool
	// BoundAxes names the collective axes the program may use: the
	// "axis" strings of its collective ops (a mesh axis name, or several
	// joined by commas, "x,y"), for a per-device program of a sharded
	// computation (passes.Options.BoundAxes). A collective over any other
	// axis makes Compile fail. Nil for programs without collectives.
	BoundAxes []string
	// MemoryPlan is the memory budget's plan the function follows, for the
	// memory analysis and the dumps (passes.Options.MemoryPlan); NoDump
	// turns the dumps off for a trial compile.
	MemoryPlan *passes.MemoryPlan
	NoDump     bool
}

// ExecOptions configure one execution.
type ExecOptions struct {
	// DonationSite is the caller's file:line, recorded on donated buffers so
	// that using them later says where they were donated.
	DonationSite string
	// Results, if its capacity suffices, holds the returned results (its
	// elements are overwritten), so that a caller can reuse one slice.
	// Backends may ignore it.
	Results []ir.Buffer
	// Device is the index (Device.ID) of the device to run on: every
	// argument must be on it (DeviceBuffer) and the results are allocated
	// there. 0, the default device, is the only device of a single-device
	// backend.
	Device int
	// Commit makes the results committed to Device (DeviceBuffer): the
	// runtime sets it when an argument was committed.
	Commit bool
	// Comms holds this device's communicator for each collective axis
	// string of the program (the "axis" attribute of its collective ops,
	// as listed in CompileOptions.BoundAxes): the device's rank in the
	// group along those mesh axes. Every device of the group runs the
	// same program at the same time, each with its own communicators. Nil
	// for programs without collectives. An execution that fails aborts
	// these communicators (collective.Communicator.Abort), so that the
	// other devices' collectives return an error instead of waiting
	// forever; they are then unusable.
	Comms map[string]collective.Communicator
	// DeviceComms holds this device's device-memory communicator for each
	// collective axis string of the program, as Comms does, for backends
	// whose collectives run on device memory on their own streams (the
	// CUDA backend, through NCCL); such a backend ignores Comms. An
	// execution that fails, or whose Context ends while it waits for the
	// collectives, aborts them (DeviceCommunicator.Abort).
	DeviceComms map[string]DeviceCommunicator
	// Context bounds the execution's waits for other devices in
	// collectives (nil: context.Background()): when it is done, the
	// waiting collective aborts the communicators and the execution
	// returns an error.
	Context context.Context
}

// Executable is a compiled function a backend can run.
type Executable interface {
	// Execute runs the function on buffers of the backend (one per parameter).
	Execute(args []ir.Buffer, opts ExecOptions) ([]ir.Buffer, error)
	// Program is the compiled program: the optimised IR, its buffer plan and
	// its memory analysis.
	Program() *passes.Program
}

// Device is one device of a backend.
type Device struct {
	// Platform is the backend name ("cpu", "cuda").
	Platform string
	// ID is the device's index within its platform (in a job of several
	// processes, its global index: see Process).
	ID int
	// Kind describes the hardware.
	Kind string
	// Process is the index of the process holding the device in a job of
	// several processes (rt.InitDistributed), where ID is the global device
	// ID (process·devices per process + the device's index in its process);
	// 0 in a job of one.
	Process int
}

// String formats the device as platform:id(kind), e.g. "cpu:0(cpu)".
func (d Device) String() string {
	return fmt.Sprintf("%s:%d(%s)", d.Platform, d.ID, d.Kind)
}

var (
	mu        sync.Mutex
	backends  = map[string]Backend{}
	defaultBE Backend
)

// EnvBackend names the environment variable that picks the default backend.
const EnvBackend = "FERRY_BACKEND"

// Register makes a backend available by name, replacing one of the same
// name. A backend other than "cpu" becomes the default unless FERRY_BACKEND
// names another; "cpu" is the default when nothing else is registered.
func Register(b Backend) {
	mu.Lock()
	defer mu.Unlock()
	backends[b.Name()] = b
	if want := settings.Backend.Get(); want == "" || want == b.Name() {
		if defaultBE == nil || b.Name() != "cpu" {
			defaultBE = b
		}
	}
}

// Default returns the backend arrays and jitted functions use by default.
func Default() Backend {
	mu.Lock()
	defer mu.Unlock()
	if defaultBE == nil {
		return backends["cpu"]
	}
	return defaultBE
}

// Lookup returns the backend registered under name, or nil.
func Lookup(name string) Backend {
	mu.Lock()
	defer mu.Unlock()
	return backends[name]
}

// All returns the registered backends sorted by name.
func All() []Backend {
	mu.Lock()
	defer mu.Unlock()
	out := make([]Backend, 0, len(backends))
	for _, b := range backends {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// Unregister removes b if it is the backend registered under its name; when
// it was the default, the default becomes another registered backend other
// than "cpu" that FERRY_BACKEND allows, or "cpu".
func Unregister(b Backend) {
	mu.Lock()
	defer mu.Unlock()
	if backends[b.Name()] != b {
		return
	}
	delete(backends, b.Name())
	if defaultBE != b {
		return
	}
	defaultBE = nil
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	want := settings.Backend.Get()
	for _, n := range names {
		if n != "cpu" && (want == "" || want == n) {
			defaultBE = backends[n]
			return
		}
	}
	if want == "" || want == "cpu" {
		defaultBE = backends["cpu"]
	}
}
