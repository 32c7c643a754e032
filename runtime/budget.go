package runtime

import (
	"fmt"
	"strings"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/runtime/budget"
)

// EnvMemoryBudget names the environment variable that gives every jitted
// function without a MemoryBudget option a device memory budget: a byte
// count ("3000000"), with a unit ("64MiB", "1.5GB"; K, M, G and T alone are
// powers of 1024: "512M"), or "device" for the device's capacity (see
// MemoryBudgetDeviceCapacity).
const EnvMemoryBudget = "FERRY_MEMORY_BUDGET"

// budgetDevice is the budget that stands for the device's capacity.
const budgetDevice = settings.BudgetDevice

// MemoryBudget gives the jitted function a device memory budget in bytes:
// the compiler decides, for every value the backward pass needs from the
// forward pass inside a scan (the residuals of scanned layers, stacked over
// the iterations, the layer inputs carried from one iteration to the next
// included), in a function differentiated at the top level (Grad, VJP;
// when it has no scan or other control flow of its own: then its scans'
// bodies are planned), and at the top level around the scans (a value
// computed outside them and read again after one, as a Transformer's
// embeddings: recomputed, if so, from the arguments by the ops between
// them, never by running a scan again), whether to keep it on device,
// recompute it in the backward pass, or offload it to pinned_host and
// prefetch it back (as
// trace.SaveAndOffloadOnlyTheseNames does by hand), choosing the fastest plan
// it finds whose memory analysis (MemoryAnalysis.TotalBytes) fits. It is the
// first answer to running out of device memory: no remat policy to pick, no
// names to place.
//
// What the user wrote still wins: the values of a trace.Checkpoint (Remat)
// are kept, recomputed or offloaded as its policy says (a top level holding
// a checkpoint of the user's is not planned), and arrays placed with
// DevicePut stay where they were put. Stacked weights the caller keeps
// in pinned_host stream into a planned scan one layer at a time (no
// DevicePut needed in the body) and stay there.
//
// When no plan fits with the arguments where the caller put them, the
// planner places the smallest set of arguments it finds in pinned_host and
// plans the residuals again. It chooses among the device arguments the
// program reads only as the xs of scans (the parameters of scanned stacks,
// read by the grad's forward and backward scans), which it streams in like
// the caller's, and optimizer state passed in: a donated argument the
// program reads only elementwise and returns updated at the same position
// among its results (same structure and types: Adam's moments), which the
// program copies to device where it is used, writing the new value to
// pinned_host, where the next call finds it. Those copied least often per
// call come first, and among them the fewest bytes that cover what is over
// the budget. A call passing such an argument on device copies it to
// pinned_host first (once for an array passed again undonated; a donated
// one is consumed); a call passing it in pinned_host (the program's own
// placement) runs the same program. Arguments the caller put in
// pinned_host stay there, and OutSpace wins over the plan for a result. The
// plan lists these arguments (MemoryPlan.HostArguments, actions "host
// argument" and "host state"); other arguments stay where the caller put
// them.
//
// On a sharded function (arguments, results or constraints with a
// NamedSharding) the budget is per device: the planner plans the
// per-device program the partitioner writes (its blocks of the sharded
// residuals, the layers it all-gathers inside a scan under FSDP, the
// gradients it reduce-scatters), whose memory analysis is one device's, and
// every device of the mesh then runs within bytes. The plan's estimate and
// its bytes are one device's too: the per-device program's arithmetic and
// its collectives (priced with BudgetCollectiveBandwidth), a device's share
// of each residual. Placing arguments in
// pinned_host is for one-device programs: a sharded function's arguments
// stay where the caller put them.
//
// The decisions are in (*Compiled).MemoryPlan and the memory analysis (its
// Plan, printed by FERRY_DUMP_IR). A budget no plan fits is an error
// (*MemoryBudgetError) that names the smallest budget the planner reached
// and what fills it. bytes must be positive; MemoryBudgetDeviceCapacity
// budgets the device's capacity instead.
func MemoryBudget(bytes int64) Option {
	return func(o *jitOptions) { o.budget, o.budgetSet = bytes, true }
}

// BudgetRates gives the memory budget's planner the rates to price plans
// with, instead of those it measures on this machine (or
// FERRY_BUDGET_RATES): matmul FLOP/s of matrix products, elementwise FLOP/s
// of the rest of the arithmetic, and bandwidth bytes/s of device↔pinned_host
// copies one way. A plan (and its MemoryPlan's step estimate) can so be made
// for another machine: a program compiled with abstract arguments for a
// GPU's rates, say. Each rate must be positive. The machine they describe
// copies beside its compute (a GPU's copy engines), unless
// BudgetCopiesOverlap(false) says otherwise.
func BudgetRates(matmul, elementwise, bandwidth float64) Option {
	return func(o *jitOptions) {
		o.rates = &budget.Rates{Flop: matmul, Elem: elementwise, Bandwidth: bandwidth}
	}
}

// BudgetCollectiveBandwidth gives the memory budget's planner the bus
// bandwidth of a sharded function's collectives, bytes/s (NCCL's busbw:
// an all-gather or reduce-scatter of S bytes over n devices takes
// S·(n−1)/n / bandwidth, an all-reduce twice that), so that its step
// estimate prices the per-device program's collectives beside its
// arithmetic (after it, when copies run on the cores that compute; see
// BudgetCopiesOverlap). Without it the collectives are not priced. It must
// be positive.
func BudgetCollectiveBandwidth(bandwidth float64) Option {
	return func(o *jitOptions) { o.collective = &bandwidth }
}

// BudgetCopiesOverlap tells the memory budget's planner whether
// device↔pinned_host copies run beside the arithmetic (true: a GPU's copy
// engines, so a scan's offload transfers cost only what its compute does
// not hide) or on the cores that compute (false: every offloaded byte costs
// its copies out and back in full). Without it the planner asks the default
// backend (a backend with a method CopiesOverlapCompute() bool answers it;
// the CPU backend, whose pinned_host is emulated in host memory, copies on
// the cores that compute, and other backends are taken to overlap), and
// takes rates given with BudgetRates to overlap. Overlapping copies also
// overlap each other: the host link is full duplex (PCIe, NVLink-C2C; CUDA
// copies to the device and to the host on separate streams), so the
// estimate pays the larger of a step's copies in and out rather than their
// sum. It changes the step estimate and so which plan wins.
func BudgetCopiesOverlap(overlap bool) Option {
	return func(o *jitOptions) { o.overlap = &overlap }
}

// MemoryBudgetDeviceCapacity is MemoryBudget of the default device's memory:
// its allocator's limit (MemStats.Limit, else Capacity; on the CPU backend
// FERRY_DEVICE_MEMORY sets it). With unlimited device memory there is
// nothing to fit and the function compiles as without a budget.
func MemoryBudgetDeviceCapacity() Option {
	return func(o *jitOptions) { o.budget, o.budgetSet = budgetDevice, true }
}

// ParseMemoryBudget parses a FERRY_MEMORY_BUDGET value: a positive byte
// count with an optional unit (as ParseMemorySize, and K, M, G, T alone as
// powers of 1024), or "device" for the device's capacity (returned as -1).
func ParseMemoryBudget(s string) (int64, error) {
	if strings.TrimSpace(s) == "" {
		return 0, &settings.Error{Name: EnvMemoryBudget, Value: s, Want: settings.MemoryBudget.Want}
	}
	return settings.MemoryBudget.Parse(s)
}

// resolveBudget returns the jitted function's device budget in bytes, or 0
// when it has none.
func (o *jitOptions) resolveBudget() (int64, error) {
	b := o.budget
	if o.probe {
		return 0, nil
	}
	if r := o.rates; r != nil && !(r.Flop > 0 && r.Elem > 0 && r.Bandwidth > 0) {
		return 0, fmt.Errorf("BudgetRates(%g, %g, %g): every rate must be positive", r.Flop, r.Elem, r.Bandwidth)
	}
	if c := o.collective; c != nil && !(*c > 0) {
		return 0, fmt.Errorf("BudgetCollectiveBandwidth(%g): the bandwidth must be positive", *c)
	}
	if !o.budgetSet {
		v, set, err := settings.MemoryBudget.Lookup()
		if err != nil || !set {
			return 0, err
		}
		b = v
	}
	switch {
	case b == budgetDevice:
		st := MemoryStats(ir.Device)
		if st.Limit > 0 {
			return st.Limit, nil
		}
		return st.Capacity, nil
	case b <= 0:
		return 0, fmt.Errorf("MemoryBudget(%d): the budget must be a positive number of bytes (MemoryBudgetDeviceCapacity for the device's capacity)", b)
	}
	return b, nil
}
