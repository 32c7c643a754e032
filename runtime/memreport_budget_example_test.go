package runtime_test

import (
	"bytes"
	"encoding/json"
	"fmt"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The page of a program compiled under a memory budget shows the budget
// (a line on the device chart and in the title) and the planner's decision
// for each residual; beside the same function compiled without a budget,
// the titles tell the two apart. The page's data has the plan too.
func ExampleCompiled_WriteMemoryReport_budget() {
	type W struct{ W1, W2 *trace.Array }
	grad := func(w W, x *trace.Array) W {
		return trace.Grad(func(w W) *trace.Array {
			y, _ := trace.ScanTree(func(x *trace.Array, w W) (*trace.Array, struct{}) {
				return trace.MatMul(trace.Tanh(trace.MatMul(x, w.W1)), w.W2), struct{}{}
			}, x, w)
			return trace.Sum(y)
		})(w)
	}
	w := W{W1: rt.FromSlice(make([]float32, 4*32*64), 4, 32, 64), W2: rt.FromSlice(make([]float32, 4*64*32), 4, 64, 32)}
	x := rt.FromSlice(make([]float32, 128*32), 128, 32)
	compile := func(opts ...rt.Option) *rt.Compiled {
		l, err := rt.NewJitted(grad, append(opts, rt.WithName("step"))...).Lower(w, x)
		if err != nil {
			panic(err)
		}
		c, err := l.Compile()
		if err != nil {
			panic(err)
		}
		return c
	}
	plain := compile()
	c := compile(rt.MemoryBudget(400 << 10))

	var page bytes.Buffer
	if err := c.WriteMemoryReportCompare(&page, plain); err != nil { // or an *os.File
		panic(err)
	}
	var data struct {
		Title  string `json:"title"`
		Budget struct {
			Label     string `json:"label"`
			Decisions []struct {
				Residual, Decision string
				Bytes              int64
				Seconds            float64
			} `json:"decisions"`
		} `json:"budget"`
		Baseline struct {
			Title string `json:"title"`
		} `json:"baseline"`
	}
	if err := json.Unmarshal(memoryReportData(page.Bytes()), &data); err != nil {
		panic(err)
	}
	fmt.Println(data.Title)
	fmt.Println(data.Baseline.Title)
	fmt.Println("one decision per value of c.MemoryPlan():", len(data.Budget.Decisions) == len(c.MemoryPlan().Values))
	// Output:
	// step — budget 400 KiB
	// step — no budget
	// one decision per value of c.MemoryPlan(): true
}
