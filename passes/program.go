package passes

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// Program is what the pipeline produces from a traced function: the optimised,
// scheduled function (Func.Body.Ops is the execution order; fused groups are
// `fusion` ops), the buffer plan of its body, and the memory analysis.
type Program struct {
	Func     *ir.Func
	Plan     *RegionPlan
	Analysis MemoryAnalysis
	// Donated[i] is true when parameter i was donated (its buffer may be
	// reused for a result).
	Donated []bool
}

// BufferKind says where a value's bytes live.
type BufferKind uint8

// Buffer kinds.
const (
	// BufParam is an argument buffer; Buffer.Index is the parameter index.
	// Inside a nested region, a parameter is a view the executor provides (a
	// const or carry buffer of the enclosing op, or one slice of an xs).
	BufParam BufferKind = iota + 1
	// BufOutput is a result buffer the runtime allocates for result
	// Buffer.Index of the function.
	BufOutput
	// BufAlias is a donated parameter (Buffer.Param) reused as result Buffer.Index.
	BufAlias
	// BufTemp lives in the region's arena of Buffer.Space at Buffer.Offset.
	BufTemp
	// BufSlice is, inside a scan body, the slice of the running iteration in
	// the ys result buffer of the enclosing scan op that body result
	// Buffer.Index (≥ num_carry) fills: the value is computed straight into
	// the stacked output, and the executor's copy of that result after the
	// iteration is a no-op. It takes no arena space.
	BufSlice
)

// String names the kind.
func (k BufferKind) String() string {
	switch k {
	case BufParam:
		return "param"
	case BufOutput:
		return "output"
	case BufAlias:
		return "alias"
	case BufTemp:
		return "temp"
	case BufSlice:
		return "slice"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Buffer is where one value lives.
type Buffer struct {
	Kind   BufferKind
	Space  ir.MemorySpace
	Offset int64 // BufTemp: byte offset in the arena of Space
	Size   int64 // bytes
	Index  int   // BufParam: parameter index; BufOutput, BufAlias, BufSlice: result index
	Param  int   // BufAlias: the donated parameter index
}

// RegionPlan assigns a buffer to every value of one region that is visible at
// that level: parameters and results of ops in Region.Ops (values inside a
// fusion op's region get none: the fused kernel keeps them in registers or
// small blocks).
//
// Region ops (scan, while, cond) carry one plan per nested region in Sub. The
// arena of a nested plan is carved out of the enclosing arena at SubOffset[op]
// (per memory space) and is live while the op runs. The executor passes nested
// region parameters as views (consts: the operand buffers; carry: the op's
// carry result buffers; x: one slice of an xs operand) and copies nested region
// results where they belong after each iteration (carry, ys slice, cond
// results), going through a temporary copy when results and parameters overlap.
// A scan body result that is a y, defined by an op of the body and returned
// once, is planned as BufSlice: it is computed in place in its ys slice.
type RegionPlan struct {
	Region *ir.Region
	Values map[*ir.Value]Buffer
	// Arena is the number of bytes of this region's arena per memory space
	// (indexed by ir.MemorySpace), nested arenas included.
	Arena [2]int64
	// Sub holds the plans of nested regions, in the op's region order.
	Sub map[*ir.Op][]*RegionPlan
	// SubOffset is where each region op's nested arenas start, per space; the
	// nested regions of one op share that space (only one runs at a time).
	SubOffset map[*ir.Op][2]int64
}

// MemoryAnalysis has the meaning of XLA's memory_analysis(), in bytes. Device
// figures count device memory; Host figures count pinned_host memory.
type MemoryAnalysis struct {
	ArgumentBytes int64 // device-resident parameters
	OutputBytes   int64 // device-resident results
	AliasBytes    int64 // donated device parameters reused for results
	TempBytes     int64 // the device arena

	HostArgumentBytes int64
	HostOutputBytes   int64
	HostAliasBytes    int64
	HostTempBytes     int64

	// Plan is what a memory budget decided (rt.MemoryBudget), or nil.
	Plan *MemoryPlan
}

// TotalBytes is device temp + argument + output − alias, XLA's total.
func (m MemoryAnalysis) TotalBytes() int64 {
	return m.TempBytes + m.ArgumentBytes + m.OutputBytes - m.AliasBytes
}

// HostTotalBytes is the same total for pinned_host memory.
func (m MemoryAnalysis) HostTotalBytes() int64 {
	return m.HostTempBytes + m.HostArgumentBytes + m.HostOutputBytes - m.HostAliasBytes
}

// String formats every figure, device then host, each in the unit that suits
// its size (B, KiB, MiB or GiB): "device: temp 1.50 KiB, argument 24 B, output
// 12 B, alias 0 B, total 1.54 KiB; host: temp 0 B, ...", followed by the
// memory plan's lines when there is one.
func (m MemoryAnalysis) String() string {
	if m.Plan != nil {
		p := m.Plan
		m.Plan = nil
		return m.String() + "\n" + p.String()
	}
	return fmt.Sprintf("device: temp %s, argument %s, output %s, alias %s, total %s; host: temp %s, argument %s, output %s, alias %s, total %s",
		byteUnits(m.TempBytes), byteUnits(m.ArgumentBytes), byteUnits(m.OutputBytes), byteUnits(m.AliasBytes), byteUnits(m.TotalBytes()),
		byteUnits(m.HostTempBytes), byteUnits(m.HostArgumentBytes), byteUnits(m.HostOutputBytes), byteUnits(m.HostAliasBytes), byteUnits(m.HostTotalBytes()))
}

// byteUnits prints n bytes as "24 B" below 1 KiB, else with two decimals in
// the largest binary unit (KiB, MiB, GiB) it reaches.
func byteUnits(n int64) string {
	abs := n
	if abs < 0 {
		abs = -abs
	}
	switch {
	case abs >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case abs >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case abs >= 1<<10:
		return fmt.Sprintf("%.2f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
