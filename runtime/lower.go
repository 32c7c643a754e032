package runtime

import (
	"fmt"
	goruntime "runtime"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// Lowered is a traced function: its IR and what is needed to call it.
type Lowered struct {
	// Func is the traced IR. Its parameters are the array leaves of the
	// arguments in order, then the arrays the function captured (closed over).
	Func    *ir.Func
	numArgs int
	consts  []*trace.Array
	nilArgs []bool
	donated []bool
	argDefs []*trace.TreeDef // tree structure of each argument, for messages
	outDefs []*trace.TreeDef
	plan    *passes.MemoryPlan // the memory budget's plan, or nil
	noDump  bool               // never written to FERRY_DUMP_IR (rate probes)
	planned Executable         // the planner's executable of this trace, for the next compile
	// hostArgs marks the argument leaves the memory budget's planner placed
	// in pinned_host (nil: none); hostCopies keeps their copies.
	hostArgs   []bool
	hostCopies hostCopies
}

// Lower traces fn for the given arguments (trees of arrays) without running it:
//
//	l, err := rt.Lower(f, x, y)
//	if err != nil { ... }
//	fmt.Println(l.IR())    // the traced IR
//	c, err := l.Compile() // the executable: c.MemoryAnalysis(), c.Call(x, y)
//
// A function that does not trace (a shape error, say) is an error here, with
// the Go file:line that caused it.
func Lower(fn any, args ...any) (*Lowered, error) {
	var j *Jitted[any]
	var err error
	func() {
		defer trace.Recover(&err)
		j = NewJitted[any](fn)
	}()
	if err != nil {
		return nil, err
	}
	return j.Lower(args...)
}

// IR returns the IR text of the traced function.
func (l *Lowered) IR() string { return l.Func.String() }

// CostAnalysis returns the arithmetic of one call of the traced function
// (passes.Cost, counted as XLA's cost_analysis()): its DotFlops are the
// model FLOPs of a training step, before any remat.
func (l *Lowered) CostAnalysis() passes.Cost { return passes.CostAnalysis(l.Func) }

// String returns the IR text.
func (l *Lowered) String() string { return l.IR() }

// Captured returns the arrays the function closed over; they are passed as the
// trailing parameters of Func.
func (l *Lowered) Captured() []*trace.Array { return l.consts }

// Compile compiles the traced function with the default backend. Donated
// arguments it cannot reuse are reported once per Compile as a warning (see
// SetWarnings).
func (l *Lowered) Compile() (*Compiled, error) {
	if err := ir.Verify(l.Func); err != nil {
		return nil, fmt.Errorf("rt.Compile: %w", err)
	}
	exe, err := l.compile()
	if err != nil {
		return nil, err
	}
	return &Compiled{entry: &entry{lowered: l, exe: exe, outDefs: l.outDefs}}, nil
}

// Compiled is an executable for one input signature.
type Compiled struct {
	entry *entry
}

// Lowered returns what this executable was compiled from.
func (c *Compiled) Lowered() *Lowered { return c.entry.lowered }

// Call runs the executable on arguments with the signature it was lowered for.
func (c *Compiled) Call(args ...any) (outs []any, err error) {
	defer trace.Recover(&err)
	leaves, _, err := flattenArgs(args)
	if err != nil {
		return nil, err
	}
	return c.entry.run(leaves, "")
}

// CallOn is Call on device dev (one of Devices()), whatever its arguments:
// uncommitted arguments are copied there for the call, arguments committed
// to another device are an error, and the results are committed to dev. It
// runs a program with no arguments on a device other than the default.
func (c *Compiled) CallOn(dev Device, args ...any) (outs []any, err error) {
	defer trace.Recover(&err)
	id, err := checkDevice("Compiled.CallOn", DefaultBackend(), dev)
	if err != nil {
		return nil, err
	}
	leaves, _, err := flattenArgs(args)
	if err != nil {
		return nil, err
	}
	return c.entry.runOn(leaves, "", id)
}

// MemoryAnalysis returns the compiled program's memory needs, with the meaning
// of XLA's memory_analysis(): argument, output, alias and temp bytes per memory
// space; TotalBytes() is device temp + argument + output − alias.
func (c *Compiled) MemoryAnalysis() passes.MemoryAnalysis { return c.entry.exe.Program().Analysis }

// CostAnalysis returns the arithmetic of one call of the compiled program
// (passes.Cost, counted as XLA's cost_analysis()), including what the
// compiler recomputes for remat.
func (c *Compiled) CostAnalysis() passes.Cost { return passes.CostAnalysis(c.entry.exe.Program().Func) }

// HostSteps lists the steps of the compiled program that an accelerator
// backend runs on the host instead of the device (with the reason and, for
// nested bodies, their region path), or nil when every step runs on the
// backend's device: always nil on the CPU backend, whose device is the host.
func (c *Compiled) HostSteps() []string {
	if h, ok := c.entry.exe.(interface{ HostSteps() []string }); ok {
		return h.HostSteps()
	}
	return nil
}

// OptimizedIR returns the IR after the compiler's passes (fused groups,
// schedule), and PlanString the buffer plan.
func (c *Compiled) OptimizedIR() string { return c.entry.exe.Program().Func.String() }

// Program returns the compiled program (optimised IR, buffer plan, analysis).
func (c *Compiled) Program() *passes.Program { return c.entry.exe.Program() }

// appendBuffers checks the leaves against the parameters and appends the
// buffers to pass to bufs: the leaves, then the captured arrays.
func (l *Lowered) appendBuffers(bufs []trace.Buffer, leaves []*trace.Array) ([]trace.Buffer, error) {
	if len(leaves) != l.numArgs {
		return nil, trace.Errorf("rt.Jit", "%s: got %d array arguments, compiled for %d", l.Func.Name, len(leaves), l.numArgs)
	}
	params := l.Func.Body.Params
	for i, a := range leaves {
		if a.IsTraced() {
			return nil, trace.Errorf("rt.Jit", "%s: argument leaf %d is a tracer", l.Func.Name, i)
		}
		if a.IsAbstract() {
			return nil, trace.Errorf("rt.Jit", "%s: argument leaf %d (%v) is abstract (trace.Abstract): lower and compile it, but call with concrete arrays", l.Func.Name, i, a.Type())
		}
		if want := params[i].Type; !a.HasType(want) {
			if i < len(l.hostArgs) && l.hostArgs[i] && a.Space() == ir.Device {
				if t := a.Type(); t.Space == ir.Device {
					t.Space = ir.PinnedHost
					if t.Equal(want) {
						h, err := l.toHost(i, a, i < len(l.donated) && l.donated[i])
						if err != nil {
							return nil, trace.Errorf("rt.Jit", "%s: moving argument leaf %d to pinned_host, where the memory budget's plan places it: %v", l.Func.Name, i, err)
						}
						bufs = append(bufs, h.Buffer())
						continue
					}
				}
			}
			return nil, trace.Errorf("rt.Jit", "%s: argument leaf %d is %v, compiled for %v", l.Func.Name, i, a.Type(), want)
		}
		bufs = append(bufs, a.Buffer())
	}
	for _, c := range l.consts {
		if c.IsTraced() {
			return nil, trace.Errorf("rt.Jit", "%s: captured a tracer of an enclosing trace", l.Func.Name)
		}
		bufs = append(bufs, c.Buffer())
	}
	return bufs, nil
}

// leafName describes buffer i of a call ("argument 2", "leaf 1 of argument
// 0", "captured array 0") for messages.
func (l *Lowered) leafName(i int) string {
	if i >= l.numArgs {
		return fmt.Sprintf("captured array %d", i-l.numArgs)
	}
	return argLeafName(l.argDefs, i)
}

func reflectFuncForPC(pc uintptr) string {
	if f := goruntime.FuncForPC(pc); f != nil {
		return f.Name()
	}
	return ""
}
