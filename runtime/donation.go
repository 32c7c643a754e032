package runtime

import (
	"fmt"
	"log"
	"strings"
	"sync/atomic"

	"github.com/ferryml/ferry/passes"
)

// warnFunc holds the warning handler (see SetWarnings); a nil func silences.
var warnFunc atomic.Pointer[func(string)]

func init() {
	def := func(msg string) { log.Print("ferry: " + msg) }
	warnFunc.Store(&def)
}

// SetWarnings sets where the runtime's warnings go and returns the handler it
// replaces. A warning is something worth knowing that is not an error: today,
// a compile that could not reuse some donated buffers ("some donated buffers
// were not usable: ..."), said once per compiled signature, like JAX. By
// default warnings are written to standard error through the log package
// (prefixed "ferry: "); rt.SetWarnings(nil) silences them, and a function
// captures them (to a test, a logger of your own, or a counter).
func SetWarnings(handler func(msg string)) (previous func(msg string)) {
	var p *func(string)
	if handler != nil {
		p = &handler
	}
	if old := warnFunc.Swap(p); old != nil {
		return *old
	}
	return nil
}

// warn passes msg to the warning handler, if any.
func warn(msg string) {
	if h := warnFunc.Load(); h != nil {
		(*h)(msg)
	}
}

// compile compiles the traced function with the default backend, warns
// about donated arguments the executable does not reuse and writes the
// memory report when FERRY_MEMORY_REPORT asks for it (not for the memory
// budget's rate probes).
func (l *Lowered) compile() (Executable, error) {
	exe := l.planned // the memory budget's planner compiled it already
	l.planned = nil
	if exe == nil {
		var err error
		if exe, err = compileFunc(DefaultBackend(), l.Func, CompileOptions{Donated: l.donated, MemoryPlan: l.plan, NoDump: l.noDump}); err != nil {
			return nil, err
		}
	}
	if msg := unusedDonations(l, exe.Program()); msg != "" {
		warn(msg)
	}
	if !l.noDump { // the budget's rate probes are not the user's programs
		maybeWriteMemoryReport(l.Func.Name, exe.Program())
	}
	return exe, nil
}

// unusedDonations describes the donated array arguments of l that no result of
// prog reuses, or returns "" when every donated buffer is reused. Each is
// named by its argument's position and its path in the argument's tree
// (args[1].Layers[0].W), with its type and why it could not be reused.
func unusedDonations(l *Lowered, prog *passes.Program) string {
	if prog == nil || prog.Plan == nil {
		return ""
	}
	body := prog.Func.Body
	reused := map[int]bool{}
	for _, v := range body.Results {
		if b, ok := prog.Plan.Values[v]; ok && b.Kind == passes.BufAlias {
			reused[b.Param] = true
		}
	}
	names := l.leafNames()
	var unused []string
	for i, d := range l.donated {
		if !d || reused[i] || i >= len(body.Params) || i >= len(names) {
			continue
		}
		p := body.Params[i]
		if p.Type.Bytes() == 0 {
			continue // nothing to reuse
		}
		why := "no result has its size and memory space"
		for _, v := range body.Results {
			if v.Type.Bytes() == p.Type.Bytes() && v.Type.Space == p.Type.Space {
				why = "the results of its size are taken or computed while it is still read"
				break
			}
		}
		unused = append(unused, fmt.Sprintf("%s %v (%s)", names[i], p.Type, why))
	}
	if len(unused) == 0 {
		return ""
	}
	return fmt.Sprintf("%s: some donated buffers were not usable: %s", l.Func.Name, strings.Join(unused, ", "))
}

// leafNames names every array leaf of the arguments by position and tree
// path: args[0], args[1].W, args[2][3].
func (l *Lowered) leafNames() []string {
	names := make([]string, 0, l.numArgs)
	for i, d := range l.argDefs {
		for _, p := range d.Paths() {
			switch {
			case p == "", strings.HasPrefix(p, "["):
				names = append(names, fmt.Sprintf("args[%d]%s", i, p))
			default:
				names = append(names, fmt.Sprintf("args[%d].%s", i, p))
			}
		}
	}
	for len(names) < l.numArgs { // no tree structure recorded
		names = append(names, fmt.Sprintf("leaf %d", len(names)))
	}
	return names
}
