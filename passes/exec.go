package passes

import "github.com/ferryml/ferry/ir"

// Exec is the backend-neutral executable plan of a Program (Lower makes it):
// per region, the buffer of every value a backend sees (slots), the steps in
// execution order, the expression tree of every fused group over views of
// its operands, and the per-iteration bindings of every loop. A backend
// renders it (to machine code, Go closures or CUDA C) and runs it; it never
// walks the IR to work out lowering again. The plan holds no notion of any
// backend: no vector widths, block sizes, threads or streams (its schedule
// speaks of queues, which a backend maps onto its streams or workers).
type Exec struct {
	// Top is the block of the function body.
	Top *Block
	// Outputs[i] says how result i of the function gets its memory.
	Outputs []Output
}

// Output is how one result of the function gets its memory.
type Output struct {
	// Slot is the top block's slot of the value returned.
	Slot int
	// Alias is the donated parameter whose memory the result takes over
	// (the slot's buffer is BufAlias), or -1.
	Alias int
	// Copy says that the value is not computed into the result's own
	// buffer (it is a parameter, a temporary, or another result's value):
	// the result gets memory of its own, and the value is copied into it
	// once the block has run.
	Copy bool
}

// Block is one region as a backend runs it: its slots (every value with a
// buffer: the region's parameters first, then the results of its steps in
// order), the slots of its parameters and results, and its steps.
type Block struct {
	// Region is the IR region the block runs; Plan its buffer plan.
	Region *ir.Region
	Plan   *RegionPlan
	// Slots lists every value of the region that has a buffer. Steps, Params
	// and Results refer to values by their index in Slots.
	Slots []Slot
	// SlotOf is the slot index of each value of Slots.
	SlotOf map[*ir.Value]int
	// Params[i] is the slot of region parameter i; Results[j] the slot of
	// region result j.
	Params, Results []int
	// Derived[i] lists the slots other than Params[i] planned in parameter
	// i's memory (results written in place into a donated parameter, or
	// into a carry: BufParam buffers of values defined by an op). They are
	// views of the same bytes as the parameter, re-pointed when it is.
	Derived [][]int
	// YsSlots lists, in a scan body, the slots planned as BufSlice: values
	// computed straight into the running iteration's slice of a ys result.
	YsSlots []YsSlot
	// Steps are the region's ops in execution order.
	Steps []Step
	// Schedule says on which queue each step runs and what it waits for
	// (see Schedule).
	Schedule Schedule
}

// Slot is one value with a buffer.
type Slot struct {
	Value *ir.Value
	// Buf is where the value lives (a BufParam buffer for parameters the
	// plan omits).
	Buf Buffer
	// Bytes is the size of the value's type; a view of the buffer of this
	// many bytes is the value.
	Bytes int64
}

// YsSlot is a value of a scan body computed in place into a ys slice.
type YsSlot struct {
	Slot   int // the value's slot
	Result int // the body result (≥ num_carry) whose ys slice holds it
}

// StepKind says what a step does.
type StepKind uint8

// Step kinds.
const (
	// StepOp is a single op outside a fused group (every op that is not
	// one of the kinds below). Step.Op is the op; Step.Kernel describes it
	// as a group of one op when the kernel form can (LowerOp), and is nil
	// for the others (sort, gather, scatter, arg reductions, the dynamic
	// and piecewise structural ops), which a backend runs by a kernel of
	// its own.
	StepOp StepKind = iota + 1
	// StepKernel is a fused group (a fusion op): Step.Kernel is its
	// expression tree.
	StepKernel
	// StepMatmul is a dot_general outside a fused group: Step.Matmul is its
	// layout.
	StepMatmul
	// StepCopy is a device_put between two memory spaces (Step.From to
	// Step.To): a copy a backend may overlap with compute, waited for
	// before its result is read or its memory reused.
	StepCopy
	// StepCollective is a collective op over the execution's communicator
	// of the op's axis.
	StepCollective
	// StepLoop is a scan, while or cond: Step.Loop holds its nested blocks
	// and bindings.
	StepLoop
)

// String names the kind as the text form prints it.
func (k StepKind) String() string {
	switch k {
	case StepOp:
		return "op"
	case StepKernel:
		return "kernel"
	case StepMatmul:
		return "matmul"
	case StepCopy:
		return "copy"
	case StepCollective:
		return "collective"
	case StepLoop:
		return "loop"
	}
	return "step?"
}

// Step is one op of a block.
type Step struct {
	Kind StepKind
	// Op is the IR op the step runs.
	Op *ir.Op
	// Args are the slots of the op's operands, Outs of its results.
	Args, Outs []int
	// Kernel is the fused group of a StepKernel, and of a StepOp the kernel
	// form describes (LowerOp: a lone elementwise op, reduction, view op or
	// iota as a group of one op); nil for any other StepOp.
	Kernel *Kernel
	// Matmul is the layout of a StepMatmul.
	Matmul *Matmul
	// Loop is the loop of a StepLoop.
	Loop *Loop
	// From and To are the memory spaces of a StepCopy.
	From, To ir.MemorySpace
	// Collective is the layout of a StepCollective.
	Collective *Collective
}

// Matmul is the layout of a dot_general: the dimension numbers of its
// operands (see ir.DotGeneral). A result has the batch dimensions, then the
// lhs free dimensions, then the rhs free ones.
type Matmul struct {
	LhsBatch, RhsBatch, LhsContract, RhsContract []int
	// Batch, M, N and K are the products of the batch, lhs free, rhs free
	// and contracted dimensions.
	Batch, M, N, K int
	// Lhs and Rhs say where the operands' matrices lie (Lhs: M×K, rows
	// over its free dimensions and columns over its contracting ones, in
	// order; Rhs: K×N).
	Lhs, Rhs MatrixLayout
}

// KernelMode is the shape of a fused group's computation.
type KernelMode uint8

// Kernel modes.
const (
	// KernelUnsupported is a group the plan does not describe as an
	// expression tree (Kernel.Why says why); a backend runs the fusion op
	// by other means (its region, op by op).
	KernelUnsupported KernelMode = iota
	// KernelLoop: elementwise ops over views; every result is an
	// expression tree over the iteration space of its size.
	KernelLoop
	// KernelInput: reductions are roots (KernelProgram.Reduces), besides
	// elementwise results.
	KernelInput
	// KernelOutput: one dot_general (Kernel.Dot) computed into the buffer of
	// result Kernel.DotResult, then the elementwise epilogue over it (the
	// NodeDot node reads the product).
	KernelOutput
)

// String names the mode.
func (m KernelMode) String() string {
	switch m {
	case KernelLoop:
		return "loop"
	case KernelInput:
		return "input"
	case KernelOutput:
		return "output"
	}
	return "unsupported"
}

// Kernel is a fused group as an expression tree: per iteration-space size,
// a program of nodes over views of the group's operands, and the results
// (and reductions) it computes. Broadcasts, transposes, slices and reshapes
// inside the group are no nodes: they are composed into the views of the
// leaves they read (ir.ViewChain).
type Kernel struct {
	// Op is the fusion op.
	Op   *ir.Op
	Mode KernelMode
	// Why says why a KernelUnsupported group is not described.
	Why string
	// Programs holds one program per iteration-space size, in the order of
	// the results that first need it.
	Programs []*KernelProgram
	// Dot is the product of a KernelOutput group, DotArgs the fusion
	// operands it multiplies, Matmul its layout, and DotResult the fusion
	// result whose buffer holds the product before the epilogue overwrites
	// it element for element.
	Dot       *ir.Op
	DotArgs   [2]int
	DotResult int
	Matmul    *Matmul
	// ElemOnly[p] reports whether operand p is read only element for
	// element (identity views in the program of its own size, and not a
	// product operand): a loop group may then write a result over it block
	// by block, reading a block before storing it.
	ElemOnly []bool
}

// KernelProgram computes the results of a group that share one
// iteration-space size (and the reductions over operands of that size).
// Nodes are in dependency order: a node's Args come before it.
type KernelProgram struct {
	// Size is the number of elements of the iteration space.
	Size  int
	Nodes []Node
	// Results lists the fusion results this program computes, each the
	// value of one node at every position.
	Results []KernelResult
	// Reduces lists the reductions whose operand has Size elements.
	Reduces []Reduce
}

// KernelResult is a fusion result computed by a program node.
type KernelResult struct {
	Result int // fusion result index
	Node   int // node index in the program
}

// NodeKind says what a node is.
type NodeKind uint8

// Node kinds.
const (
	// NodeLeaf reads fusion operand Node.Operand through Node.View.
	NodeLeaf NodeKind = iota + 1
	// NodeConst reads Node.Data (a constant, or the vector of an iota along
	// its dimension) through Node.View.
	NodeConst
	// NodeOp is an elementwise op (Code, Attrs) over its Args.
	NodeOp
	// NodeDot is the product of a KernelOutput group, read in place at the
	// iteration index from the buffer of result Kernel.DotResult.
	NodeDot
	// NodeIndexed reads fusion operands through Node.Index, the index rule
	// of an element-moving op no view expresses (ir.IndexRuleOf:
	// dynamic_slice, dynamic_update_slice, concatenate, pad, gather), at
	// the element Node.View maps the iteration index to; operand k of the
	// rule is fusion operand Node.Operands[k]. Only the kernel of such an op
	// alone (LowerOp) has one.
	NodeIndexed
)

// Node is one node of a KernelProgram.
type Node struct {
	Kind  NodeKind
	DType ir.DType
	// Operand is the fusion operand a NodeLeaf reads (-1 otherwise).
	Operand int
	// Data is the row-major bytes a NodeConst reads; Iota says they are
	// the vector of an iota (element i is i converted to DType, as eval
	// converts it).
	Data []byte
	Iota bool
	// View maps the iteration flat index to the flat element index of the
	// leaf's operand or data (empty: the identity).
	View ir.ViewChain
	// Index and Operands are a NodeIndexed's rule and the fusion operand
	// of each operand of the rule.
	Index    *ir.IndexRule
	Operands []int
	// Code and Attrs are a NodeOp's op; Args its operand nodes.
	Code  ir.Code
	Attrs ir.Attrs
	Args  []int
	// Invariant nodes have the same value at every position (constant
	// views, and ops over invariant nodes only).
	Invariant bool
}

// Reduce is one reduction of a KernelInput group.
type Reduce struct {
	// Code is reduce_sum, reduce_max, reduce_min or reduce_prod; or, in
	// the kernel of an arg_max or arg_min alone (LowerOp), that op, whose
	// output is the index (of dtype DType) of the first maximum or
	// minimum, a NaN winning.
	Code ir.Code
	// Node is the operand's node; Result the fusion result it produces.
	Node, Result int
	DType        ir.DType
	// Trailing reports that the reduced axes are the trailing ones (size-1
	// axes aside): output o reduces the PerOutput consecutive operand
	// elements from o·PerOutput.
	Trailing bool
	// Leading reports that the reduced axes come before every kept axis:
	// operand flat index i goes into output i mod Outputs.
	Leading bool
	// PerOutput is the number of elements reduced into each output, Outputs
	// the number of outputs.
	PerOutput, Outputs int
	// Out maps the operand flat index to the output flat index it goes
	// into (any layout).
	Out ir.StridedView
}

// Loop is a scan, while or cond with its nested blocks and the bindings a
// runner applies around every run of them, all planned once.
//
// A scan runs Blocks[0] Length times (in reverse when Reverse); a while runs
// Blocks[0] (the condition) and, while its result 0 is true, Blocks[1] (the
// body); a cond runs Blocks[0] when operand 0 is true, Blocks[1] otherwise.
// Before the loop the Init copies are made; before each run of a block its
// parameters are bound by Params; after each run of the block that produces
// the op's results (scan and while: the body; cond: the branch that ran),
// its results are put where Results says.
type Loop struct {
	// Code is ir.Scan, ir.While or ir.Cond.
	Code ir.Code
	// Blocks are the nested blocks, in the op's region order.
	Blocks []*Block
	// SubOffset is where the nested arenas start in the enclosing block's
	// arena, per memory space; every block of the loop starts there.
	SubOffset [2]int64
	// Consts and Carry count the op's constant and carried operands (scan
	// and while; 0 for cond).
	Consts, Carry int
	// Length and Reverse are a scan's iteration count and direction.
	Length  int
	Reverse bool
	// Init lists the copies made before the loop: op operand Arg into op
	// result Out (the initial carries).
	Init []Move
	// Params binds every parameter of the blocks, in parameter order.
	Params []ParamBind
	// Results says where each result of the producing block goes, in result
	// order.
	Results []ResultBind
}

// Move is a copy of an op operand (Arg, an index into Step.Args) into an op
// result (Out, an index into Step.Outs).
type Move struct{ Arg, Out int }

// BindKind says what memory a nested block's parameter is.
type BindKind uint8

// Bind kinds.
const (
	// BindArg: the whole buffer of op operand Arg (consts; cond operands).
	BindArg BindKind = iota + 1
	// BindOut: the whole buffer of op result Out (carries and while state,
	// updated in place iteration by iteration).
	BindOut
	// BindSlice: iteration i's slice of op operand Arg (a scan's xs): Stride
	// bytes from i·Stride, where i counts down in a reversed scan.
	BindSlice
)

// ParamBind binds one parameter of a nested block.
type ParamBind struct {
	Kind BindKind
	// Arg is the op operand (BindArg, BindSlice), Out the op result
	// (BindOut); both index Step.Args and Step.Outs.
	Arg, Out int
	// Stride is the bytes of one slice (BindSlice).
	Stride int64
}

// ResultBind says where one result of a nested block goes after each run.
type ResultBind struct {
	// Out is the op result it is copied into (an index into Step.Outs).
	Out int
	// Stride is non-zero for a scan's ys: the result is copied into
	// iteration i's slice of Out, Stride bytes from i·Stride.
	Stride int64
	// InPlace reports that the value was computed in its destination (a
	// BufSlice ys value, or a carry updated in its own buffer): no copy is
	// needed, though a copy of the same bytes onto themselves is harmless.
	InPlace bool
	// Stage reports that the result's memory is another result's
	// destination (a carry returned in another carry's position): it must
	// be read into a staging buffer before any destination is written.
	Stage bool
}
