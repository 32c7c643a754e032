// Command llama7b plans the memory of a Llama-style 7B training step on a
// 24 GiB device without running it, and runs the same model family, small,
// under memory budgets.
//
// The step (forward, next-token loss, gradient, AdamW update, parameters
// and optimizer state donated) of a 7B decoder with grouped-query attention
// (32 layers, width 4096, 32 heads, 8 key/value heads, SwiGLU of 14336, a
// 32000-token vocabulary; bf16 parameters, f32 AdamW moments and no f32
// master copy; one sequence of 2048 tokens) is lowered and compiled with
// abstract arguments (trace.Abstract: no memory is allocated). It prints
// the unconstrained memory analysis by kind (parameters, optimizer state,
// gradients, residuals, the rest of the temporaries), then the plan of
// rt.MemoryBudget for the budget (24 GiB; host memory unbounded): the
// arguments it moves to pinned_host, the residuals it keeps, recomputes,
// offloads or streams, with their bytes, whether it fits, and its step
// estimate at an H100 SXM's datasheet rates (rt.BudgetRates; the table is
// in rates.go) beside the unconstrained step's.
//
// Beside the estimate it prints the host link's share: the bytes the
// plan's program copies each way, and the lower bound any plan meets (the
// state that cannot stay on device crosses in and out each step).
//
//	go run ./examples/llama7b                  # the 7B plan at 24 GiB
//	go run ./examples/llama7b -budget 40GiB -layers 8 -seq 1024
//	go run ./examples/llama7b -json            # the same as one JSON object
//	go run ./examples/llama7b -devices 8       # FSDP over 8 devices, 16 GiB each
//	go run ./examples/llama7b -run             # small model, run under budgets
//	go run ./examples/llama7b -compare         # small model: the plan against hand-written choices
//
// -devices n shards the step FSDP-style over n virtual CPU devices (a mesh
// of one axis; abstract arguments, nothing runs): the stacked blocks split
// after their layer axis, the other parameters and AdamW's moments along
// their first dimension n divides, a global batch of n sequences, one per
// device; inside the layer scan each layer's parameters are all-gathered
// where the block uses them, and their gradients reduced back to the
// split. The AdamW update is one optim.Step over every leaf (elementwise,
// so the new parameters and moments take the donated buffers). It prints
// each device's analysis unconstrained and under the budget per device
// (16 GiB by default), the plan, what a device gathers and reduces over
// the interconnect and copies over the host link, and the step priced at
// an H100 SXM node's rates with NVLink's bus bandwidth for the collectives
// (rates.go).
//
// -compare times, at each budget of -run, the planner's plan against the
// hand-written choices a JAX user would make (a checkpoint policy on the
// layer scan: none, nothing_saveable, dots_saveable, the layer input
// offloaded; the stacked moments, and parameters, kept in pinned_host by
// hand), each compiled once, all called in turn for -rounds rounds in one
// process; at each budget it reports the ratio of the planner's median step
// to the fastest hand-written choice that fits the budget.
//
// -run trains a small member of the family (8 layers, width 512, sequence
// 256, batch 2, f32) for a few steps under budgets from the unconstrained
// total down to the smallest the planner fits, with the CPU backend's device
// pool capped at each budget, and prints the measured device peak, the
// losses against the unconstrained run's, the step time and the planner's
// estimate of it (at rates measured on this machine).
package main

import (
	"encoding/json"
	"flag"
	"log"
	"os"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
)

var (
	budgetFlag  = flag.String("budget", "", "device memory budget, per device with -devices (bytes, or with a unit: 24GiB, 16GB; default 24GiB, with -devices 16GiB)")
	devicesFlag = flag.Int("devices", 0, "plan the step FSDP-sharded over this many virtual devices, one sequence each (0: one device, one sequence)")
	layersFlag  = flag.Int("layers", 32, "decoder layers")
	seqFlag     = flag.Int("seq", 2048, "tokens per sequence")
	jsonFlag    = flag.Bool("json", false, "print the report as JSON")
	runFlag     = flag.Bool("run", false, "run a small model of the family under budgets instead of planning the 7B step")
	updateFlag  = flag.String("update", "layer", "the AdamW update of the stacked blocks: layer (a scan over the layers) or whole (optim.Step over every leaf at once)")
	stepsFlag   = flag.Int("steps", 3, "-run: training steps per budget")
	compareFlag = flag.Bool("compare", false, "time the planner's plan against hand-written choices at each budget of -run (small model)")
	roundsFlag  = flag.Int("rounds", 3, "-compare: timed steps per contender, alternating")
)

func main() {
	flag.Parse()
	if *compareFlag {
		rep, err := compareBudgets(smallSize(), nil, hands(), *roundsFlag)
		if err != nil {
			log.Fatal(err)
		}
		if *jsonFlag {
			printJSON(rep)
			return
		}
		rep.print(os.Stdout)
		return
	}
	if *runFlag {
		rows, err := runBudgets(smallSize(), *stepsFlag)
		if err != nil {
			log.Fatal(err)
		}
		if *jsonFlag {
			printJSON(rows)
			return
		}
		printRuns(os.Stdout, rows)
		return
	}
	b := *budgetFlag
	if b == "" {
		b = "24GiB"
		if *devicesFlag > 0 {
			b = "16GiB"
		}
	}
	budget, err := rt.ParseMemorySize(b)
	if err != nil {
		log.Fatalf("-budget: %v", err)
	}
	if *devicesFlag > 0 {
		sz := Size{Config: llama7B, Seq: *seqFlag, Batch: *devicesFlag, Param: ir.BFloat16}
		sz.Config.Layers = *layersFlag
		r, err := planFSDP(sz, *devicesFlag, budget)
		if err != nil {
			log.Fatal(err)
		}
		if *jsonFlag {
			printJSON(r)
			return
		}
		r.print(os.Stdout)
		return
	}
	sz := Size{Config: llama7B, Seq: *seqFlag, Batch: 1, Param: ir.BFloat16}
	sz.Config.Layers = *layersFlag
	r, err := plan(sz, budget)
	if err != nil {
		log.Fatal(err)
	}
	if *jsonFlag {
		printJSON(r)
		return
	}
	r.print(os.Stdout)
}

func printJSON(v any) {
	e := json.NewEncoder(os.Stdout)
	e.SetIndent("", "  ")
	if err := e.Encode(v); err != nil {
		log.Fatal(err)
	}
}
