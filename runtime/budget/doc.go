// Package budget is the memory budget's planner (rt.MemoryBudget): given a
// device byte budget, it decides for every value the backward pass reads
// from the forward pass (the residuals of scan bodies and of functions
// differentiated at the top level) whether to keep it on device, recompute
// it or offload it to pinned_host, and, when no such plan fits, which
// arguments to place in pinned_host.
//
// It sees the function only through Function: a retrace under a
// trace.RematPlanner (with some argument leaves as pinned_host parameters)
// and the compile of that trace to a passes.Program, whose memory analysis
// says whether a plan fits. It prices plans with Rates the caller measures.
// Plan returns the fastest trace it found that fits, with its
// passes.MemoryPlan, or an *Error naming the smallest budget it reached.
//
// The search: it traces the function with every residual kept, compiles it
// and reads the memory analysis; over the budget, it orders the residuals
// the backward pass reads by estimated cost per byte saved (recompute: the
// op's arithmetic at the rates, none for a view of the scope's inputs,
// which is never offloaded; offload: the transfers to pinned_host and
// back, less what the scan's compute hides, the link's two directions
// overlapping unless the copies share the cores), takes the cheapest option for
// each in that order, and searches (by bisection over that order, re-tracing
// and compiling each try) for the shortest prefix that fits. Recomputing a
// value can make its operands residuals: they join the order.
// The top level around the scans has residuals too (toplevel.go): values
// computed outside the scans and read again after one. The planner finds
// them in each trace, rewrites the top level for the ones it offloads or
// recomputes (from the arguments, by the ops between them), and orders
// them with the others as the candidates of one more scope.
//
// A sharded function is planned and priced per device: the per-device
// program's arithmetic and collectives (perdevice.go), each residual's
// share of a device.
//
// MaxCompiles bounds the tries of one bisection. When no plan of the
// residuals fits, arguments move to pinned_host: the fewest copies per byte
// first, the first ones covering the bytes over the budget with the fewest
// bytes, and a bisection over that order finds the shortest prefix whose
// smallest plan fits.
//
// Package runtime (rt) is its one user: rt.MemoryBudget, rt.Jit and
// (*rt.Compiled).MemoryPlan are the entry points users call.
package budget
