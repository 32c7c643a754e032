package runtime

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/ferryml/ferry/internal/memview"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/passes"
)

// EnvMemoryReport names the directory where every compiled program writes
// its memory report (Compiled.WriteMemoryReport), like FERRY_DUMP_IR.
const EnvMemoryReport = "FERRY_MEMORY_REPORT"

// MemoryReportDataID is the id of the <script type="application/json">
// element of a memory report that holds the data it draws.
const MemoryReportDataID = memview.DataID

// WriteMemoryReport writes the compiled program's memory viewer: one
// self-contained HTML page (inline SVG and script; nothing is loaded from
// the network) that draws, per memory space (device, pinned_host), every
// buffer of the buffer plan as a bar over the schedule — x the step of the
// program, scan bodies once per iteration; y the byte address: arguments,
// result buffers, then the arena at its planned offsets — coloured by kind
// (argument, output, temp, donated, offloaded, prefetched), with the bytes
// in use per step and the peak marked. Hovering or clicking a bar shows the
// value's op, dtype and shape, the Go file:line that made it and its first
// and last use; the memory analysis is beside it. The data is embedded as
// JSON in the element with id MemoryReportDataID.
//
// The page's title names the function with its memory budget
// ("main_gradFn — budget 48 MiB", or "main_gradFn — no budget"). A program
// compiled under MemoryBudget draws the budget as a labelled line on its
// device chart, and below the charts lists the plan (MemoryPlan) as the
// planner reported it: each residual (its checkpoint name, or the op and
// Go file:line that made it, and its type), the decision (kept,
// recomputed, offloaded, streamed; or an argument placed in pinned_host),
// its bytes and the seconds the planner estimated it adds (with the
// recomputation's FLOPs, or the transfers the compute does not hide), and
// totals per decision. The data has the plan under "budget".
func (c *Compiled) WriteMemoryReport(w io.Writer) error {
	return writeMemoryReport(w, c.Program(), nil)
}

// WriteMemoryReportCompare is WriteMemoryReport with the picture of
// baseline (the same function compiled without remat or offload, or
// without a memory budget, say) beside it on demand: a button on the page,
// or #baseline at the end of its address, shows it, and the analysis table
// compares the two. The titles tell them apart by their budgets
// ("main_gradFn — budget 48 MiB, beside main_gradFn — no budget"); a
// budget is drawn on both device charts (on the other one's marked as the
// budgeted program's), and each program's plan, if it has one, is listed.
func (c *Compiled) WriteMemoryReportCompare(w io.Writer, baseline *Compiled) error {
	if baseline == nil {
		return fmt.Errorf("rt.WriteMemoryReportCompare: no baseline program")
	}
	return writeMemoryReport(w, c.Program(), baseline.Program())
}

func writeMemoryReport(w io.Writer, p, baseline *passes.Program) error {
	d, err := memview.Build(p)
	if err != nil {
		return err
	}
	if baseline != nil {
		if d.Baseline, err = memview.Build(baseline); err != nil {
			return err
		}
	}
	return memview.WriteProgramPage(w, d)
}

// WriteLiveMemoryReport writes a page that draws the live memory pools of
// every backend that reports its memory (the data of
// SaveDeviceMemoryProfile and MemoryStats): per device and memory space, the
// largest live buffers with the Go line that made each, and the free memory
// inside the reserved memory — its largest block and the other, fragmented
// blocks — with the headroom under the pool's limit. Like WriteMemoryReport
// it is one self-contained HTML file with its data as JSON in the element
// with id MemoryReportDataID.
func WriteLiveMemoryReport(w io.Writer) error {
	return memview.WriteLivePage(w, memview.LivePools())
}

// memoryReportSeq numbers the reports FERRY_MEMORY_REPORT writes.
var memoryReportSeq atomic.Int64

// maybeWriteMemoryReport writes, when FERRY_MEMORY_REPORT names a
// directory, the report of a compiled program as NNN-<func>.memory.html
// (NNN counting the reports of the process, <func> the function's name made
// safe as FERRY_DUMP_IR does). A failure is a warning, not an error.
func maybeWriteMemoryReport(name string, p *passes.Program) {
	dir := settings.MemoryReport.Get()
	if dir == "" || p == nil {
		return
	}
	err := func() error {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		file := filepath.Join(dir, fmt.Sprintf("%03d-%s.memory.html", memoryReportSeq.Add(1)-1, passes.FileName(name)))
		f, err := os.Create(file)
		if err != nil {
			return err
		}
		if err := writeMemoryReport(f, p, nil); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}()
	if err != nil {
		warn(fmt.Sprintf("%s: %s: %v", name, EnvMemoryReport, err))
	}
}
