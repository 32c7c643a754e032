// Package passes is Ferry's compiler: a fixed table of named passes (Pipeline)
// that turns a traced ir.Func into a Program — the optimised, fused and
// scheduled function, a buffer for every value the executor sees, and the
// memory analysis (XLA's memory_analysis(): argument, output, alias and temp
// bytes per memory space).
//
// Compile clones the function (the traced function is never changed), runs the
// passes in order, verifies the IR (and, once there is one, the buffer plan)
// after every pass when asked to (always inside test binaries), and writes the
// IR after every pass to Options.DumpDir or $FERRY_DUMP_IR.
//
// Sharded functions (values whose types carry an ir.NamedSharding) are first
// split for their mesh: AnalyzeShardings propagates the shardings to every
// value and Partition writes the one program every device runs, with the
// collectives between them; that program then goes through the Pipeline
// like any other (Options.BoundAxes lists its collective axes).
//
// # Buffer plan contract
//
// Program.Plan assigns a Buffer to every value the executor sees (see
// RegionPlan). Beyond the doc comments of the types in program.go, the plan
// follows these rules, which the executor relies on and CheckPlan checks:
//
//   - Every top-level result position i gets a buffer of its own: the value
//     Func.Body.Results[i] maps to BufOutput (or BufAlias) with Index i the
//     first time it is returned. When that is not so — the value is a
//     parameter, or it was already returned at an earlier position — the
//     executor allocates result i itself and copies the value into it.
//   - BufAlias{Param: p, Index: i}: result i is written into the buffer of
//     donated parameter p. Parameter p is dead by the op that defines the
//     result, or that op may write the result in place over p (see below).
//   - In place: a temp result of an elementwise op may have exactly the
//     offset and size of one of its operands (a temp that dies at that op);
//     such ops read element k of every operand before writing element k of
//     any result. So may the result of a dynamic_update_slice and its operand
//     0 (only the window is written). With Options.FusionInPlace, a loop
//     fusion's result may overwrite an operand read only element for element;
//     a fused kernel working block by block must then load a block of its
//     inputs before storing that block of any output. Values never share
//     bytes otherwise while both are live.
//   - Temps of a region are live from the op that defines them (by position in
//     Region.Ops) to their last use; values returned by a nested region live
//     to its end; a value nobody uses still gets bytes while its op runs.
//   - A region op (scan, while, cond) gets a block of the enclosing arena at
//     SubOffset[op], live only while the op runs; each nested plan's offsets
//     are relative to that block.
//
// # How a backend renders the plan
//
// Lower turns a Program into an Exec, the backend-neutral executable plan,
// and a backend is a renderer of it plus a runner: it never walks the IR to
// work out lowering again. Per Block it allocates views of the slots (a
// BufTemp slot is bytes [Offset, Offset+Bytes) of the block's arena; params,
// outputs, aliases and ys slices are bound by the caller), then renders each
// Step by kind: a StepKernel's Kernel programs become its fused code (every
// NodeLeaf/NodeConst reads its operand through the ir.ViewChain of the node,
// ir.StridedView.At or Indices giving the element index; NodeOp nodes apply
// the op table's elementwise op; NodeIndexed nodes read through their
// ir.IndexRule, IndexRule.Source giving the piece and element; Reduces
// accumulate in the layout they state; a KernelOutput group computes its
// product into result DotResult first), a StepMatmul its GEMM with the
// Matmul layout, a StepCopy its copy between spaces, a StepCollective its
// communicator call, a StepOp its Kernel (the op as a group of one, when the
// plan describes it: LowerOp) or the backend's own kernel of the op, and a
// StepLoop a loop over its nested
// Blocks whose runner applies the Loop's Init copies, Params bindings
// (whole buffers, or per-iteration slices of Stride bytes) and Results
// (copied back, by slice for ys, staged when Stage says so, skipped when
// InPlace). A KernelUnsupported group is run by the backend's fallback for
// the fusion op. The reference executor (internal/eval) does not read the
// plan: it is the independent oracle the differential tests compare with.
package passes

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// Pass is one named step of the pipeline.
type Pass struct {
	// Name identifies the pass in Options.Disable and in dump file names.
	Name string
	// Run transforms the state: the IR in State.Func, or the plan.
	Run func(*State) error
	// Required passes cannot be disabled: the program needs them.
	Required bool
	// Doc says in one line what the pass does.
	Doc string
}

// State is what the passes work on: the function being compiled (a clone of
// the traced one), the options, and what the later passes produce.
type State struct {
	Func    *ir.Func
	Options Options
	// Liveness holds the live intervals of every planned region, made by the
	// liveness pass.
	Liveness map[*ir.Region]*Liveness
	// Program is made by buffer assignment and completed by memory analysis.
	Program *Program
}

// Options configure Compile.
type Options struct {
	// Donated[i] is true when parameter i's buffer may be reused for a result.
	Donated []bool
	// Verify runs ir.Verify after every pass and CheckPlan once there is a
	// plan. It is always on inside test binaries. Backends set it to
	// VerifyFromEnv().
	Verify bool
	// DumpDir, when set, receives the IR after every pass; when empty,
	// $FERRY_DUMP_IR is used. See Compile.
	DumpDir string
	// Disable names passes to skip (for tests and debugging). Naming a
	// required pass or an unknown one is an error.
	Disable []string
	// FusionInPlace lets a loop fusion write a result over an operand that
	// dies at it (same size and space, read only element for element), as
	// elementwise ops and dynamic_update_slice always may. The executor must
	// then compute a whole block before it stores any result's block
	// (eval.EvalOpInto and cpuexec's fused kernels do). Off by default.
	FusionInPlace bool
	// BoundAxes names the axes whose collectives the executor runs (a
	// ShardMap's mesh axes, for its per-device programs). A collective
	// over any other axis has no meaning in the program, and Compile
	// refuses it (ir.UnboundAxisError). Nil for one-device programs.
	BoundAxes []string
	// MemoryPlan, when set, is attached to the program's MemoryAnalysis
	// (and so printed in the dumps): the memory budget's decisions, which
	// the function being compiled already follows.
	MemoryPlan *MemoryPlan
	// NoDump turns the dumps off (the memory budget's trial compiles).
	NoDump bool
	// PrefetchGathers tells the prefetch pass that the executor runs the
	// next iteration's all_gather of a scan's xs slice beside the current
	// iteration (cpuexec does): the pass reserves the gathered buffer for
	// the whole iteration, and the memory analysis counts it.
	PrefetchGathers bool
}

// EnvVerifyIR names the environment variable that, set to any non-empty
// value, makes the backends verify the IR after every pass (Options.Verify).
const EnvVerifyIR = "FERRY_VERIFY_IR"

// VerifyFromEnv reports whether $FERRY_VERIFY_IR is set to a non-empty
// value. Every backend passes it as Options.Verify, so the one setting turns
// verification on whichever backend compiles.
func VerifyFromEnv() bool { return settings.VerifyIR.Get() }

// Pipeline is the compiler: every pass in the order Compile runs them.
var Pipeline = []Pass{
	{Name: "canonicalize", Run: canonicalize, Doc: "exact algebraic identities; reshape, transpose and broadcast chains; identity shape ops"},
	{Name: "constant-fold", Run: constantFold, Doc: "evaluate small all-constant ops; elementwise ops on broadcast scalars stay broadcast scalars"},
	{Name: "dot-layout", Run: dotLayout, Doc: "fold the transposes (and head merges) feeding dot_general into its dimension numbers, so products read operands where they lie"},
	{Name: "cse", Run: cse, Doc: "merge ops with the same code, operands and attributes within a region"},
	{Name: "reduce-scatter", Run: reduceScatter, Doc: "an all_reduce of which a device reads only its own block (a dynamic_slice at axis_index times the block) becomes a reduce_scatter"},
	{Name: "dce", Run: dce, Doc: "remove unused ops, unused scan ys, and unused region operands, recursively"},
	{Name: "scan-sink", Run: scanSink, Doc: "move a cast (or another unary elementwise op) of a scan's stacked output into the body, so the stack is built in its final dtype"},
	{Name: "recompute", Run: recompute, Doc: "copy the elementwise chain of a reduction's operand for the ops that depend on that reduction (softmax, layer norm), so fusion need not store it"},
	{Name: "fusion", Run: fusion, Doc: "loop, input (reduction) and output (matrix product epilogue) fusion into fusion ops"},
	{Name: "schedule", Run: schedule, Doc: "memory-aware order of every region's ops (greedy list scheduling, never worse than the traced order)"},
	{Name: "liveness", Run: liveness, Required: true, Doc: "live interval of every value the executor sees"},
	{Name: "prefetch", Run: prefetch, Doc: "reserve the buffer of a scan body's copy of an xs slice for the whole iteration when that costs no memory, so the executor double buffers it"},
	{Name: "buffer-assignment", Run: assignBuffers, Required: true, Doc: "parameters, outputs, donated aliases; temps packed in one arena per memory space"},
	{Name: "memory-analysis", Run: analyzeMemory, Required: true, Doc: "argument, output, alias and temp bytes per memory space"},
}

// dumpSeq numbers the compilations of this process in dump file names.
var dumpSeq atomic.Int64

// dumpWarned says the failure of a $FERRY_DUMP_IR dump was reported.
var dumpWarned atomic.Bool

// Compile runs the pipeline on a clone of f (f is never changed) and returns
// the program. f must verify; len(opts.Donated) must not exceed the number of
// parameters.
//
// When opts.DumpDir (or else $FERRY_DUMP_IR) names a directory, Compile creates
// it and writes the input as NNN-<func>-00-input.ir and the IR after each pass
// as NNN-<func>-PP-<pass>.ir, where NNN counts the compilations of the process
// and PP is the pass's 1-based position in Pipeline. After buffer assignment
// and memory analysis the file ends with the plan (PlanString) as // comments,
// so every file still parses. Last, NNN-<func>-PP-exec.plan holds the text
// form of the executable plan (Lower, Exec.String), PP one past the last pass. A dump that cannot be written fails the compile
// for opts.DumpDir; for $FERRY_DUMP_IR it is a warning on standard error
// (once per process) and the compile goes on without dumping.
func Compile(f *ir.Func, opts Options) (*Program, error) {
	if err := ir.Verify(f); err != nil {
		return nil, fmt.Errorf("passes: input: %w", err)
	}
	if err := checkBoundAxes(f, opts.BoundAxes); err != nil {
		return nil, fmt.Errorf("passes: %w", err)
	}
	if len(opts.Donated) > len(f.Body.Params) {
		return nil, fmt.Errorf("passes: %d donation flags for %d parameters", len(opts.Donated), len(f.Body.Params))
	}
	disabled := map[string]bool{}
	for _, name := range opts.Disable {
		i := slices.IndexFunc(Pipeline, func(p Pass) bool { return p.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("passes: cannot disable unknown pass %q", name)
		}
		if Pipeline[i].Required {
			return nil, fmt.Errorf("passes: pass %q is required and cannot be disabled", name)
		}
		disabled[name] = true
	}
	verify := opts.Verify || testing.Testing()
	st := &State{Func: ir.Clone(f), Options: opts}
	st.Options.Donated = make([]bool, len(f.Body.Params))
	copy(st.Options.Donated, opts.Donated)

	dir, fromEnv := opts.DumpDir, false
	if dir == "" {
		dir, fromEnv = settings.DumpIR.Get(), true
	}
	if opts.NoDump {
		dir = ""
	}
	var d *dumper
	// dumpFailed handles a failed dump: an error for Options.DumpDir; for
	// $FERRY_DUMP_IR, a debugging aid, a warning (once per process) and no
	// more dumps of this compile, which goes on.
	dumpFailed := func(err error) error {
		if !fromEnv {
			return err
		}
		if !dumpWarned.Swap(true) {
			fmt.Fprintf(os.Stderr, "ferry: warning: FERRY_DUMP_IR=%s: %v; compiling without dumping the IR\n", dir, err)
		}
		d = nil
		return nil
	}
	if dir != "" {
		d = &dumper{dir: dir, seq: dumpSeq.Add(1) - 1, name: FileName(f.Name)}
		if err := d.write(0, "input", st, false); err != nil {
			if err := dumpFailed(err); err != nil {
				return nil, err
			}
		}
	}
	for i, p := range Pipeline {
		if disabled[p.Name] {
			continue
		}
		if err := p.Run(st); err != nil {
			return nil, fmt.Errorf("passes: %s: %w", p.Name, err)
		}
		if verify {
			if err := ir.Verify(st.Func); err != nil {
				return nil, fmt.Errorf("passes: after %s: %w", p.Name, err)
			}
			if st.Program != nil && st.Program.Plan != nil {
				if err := CheckPlan(st.Program); err != nil {
					return nil, fmt.Errorf("passes: after %s: %w", p.Name, err)
				}
			}
		}
		if d != nil {
			if err := d.write(i+1, p.Name, st, st.Program != nil && st.Program.Plan != nil); err != nil {
				if err := dumpFailed(err); err != nil {
					return nil, err
				}
			}
		}
	}
	if st.Program == nil {
		return nil, fmt.Errorf("passes: the pipeline made no program")
	}
	if d != nil {
		if err := d.writeExec(len(Pipeline)+1, st.Program); err != nil {
			if err := dumpFailed(err); err != nil {
				return nil, err
			}
		}
	}
	st.Program.Analysis.Plan = opts.MemoryPlan
	return st.Program, nil
}

type dumper struct {
	dir  string
	seq  int64
	name string
}

func (d *dumper) write(idx int, pass string, st *State, plan bool) error {
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return fmt.Errorf("passes: dump: %w", err)
	}
	var b strings.Builder
	b.WriteString(st.Func.String())
	if plan {
		b.WriteString("\n// buffer plan after ")
		b.WriteString(pass)
		b.WriteString(":\n")
		text := st.Program.PlanString()
		if a := st.Program.Analysis; a != (MemoryAnalysis{}) {
			a.Plan = st.Options.MemoryPlan
			text += a.String() + "\n"
		}
		for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			b.WriteString("// ")
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	name := fmt.Sprintf("%03d-%s-%02d-%s.ir", d.seq, d.name, idx, pass)
	if err := os.WriteFile(filepath.Join(d.dir, name), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("passes: dump: %w", err)
	}
	return nil
}

// writeExec writes the executable plan of p (Lower), or why there is none,
// as NNN-<func>-PP-exec.plan.
func (d *dumper) writeExec(idx int, p *Program) error {
	var text string
	if ex, err := Lower(p); err != nil {
		text = fmt.Sprintf("no executable plan: %v\n", err)
	} else {
		text = ex.String()
	}
	name := fmt.Sprintf("%03d-%s-%02d-exec.plan", d.seq, d.name, idx)
	if err := os.WriteFile(filepath.Join(d.dir, name), []byte(text), 0o644); err != nil {
		return fmt.Errorf("passes: dump: %w", err)
	}
	return nil
}

// FileName makes a function name safe as part of a file name, as the
// FERRY_DUMP_IR files name it: letters, digits, '_', '.' and '-' are kept,
// every other character becomes '_', at most 64 bytes, "func" for "".
// FERRY_MEMORY_REPORT names its files the same way.
func FileName(s string) string {
	if s == "" {
		return "func"
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > 64 {
		out = out[:64]
	}
	return out
}

// checkBoundAxes returns the error of the first collective of f (regions
// included) whose axis is not in bound.
func checkBoundAxes(f *ir.Func, bound []string) error {
	var err error
	f.Body.Walk(func(op *ir.Op) {
		if err == nil && op.Code.IsCollective() && !slices.Contains(bound, op.Attrs.String("axis")) {
			err = fmt.Errorf("%s: %w", op.Describe(), ir.UnboundAxisError(op))
		}
	})
	return err
}
