package runtime_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// memoryReportData returns the JSON a memory report page embeds.
func memoryReportData(page []byte) []byte {
	return regexp.MustCompile(`(?s)id="` + rt.MemoryReportDataID + `">(.*?)</script>`).FindSubmatch(page)[1]
}

// WriteMemoryReportCompare draws a program beside a baseline: here a
// remat variant (its backward pass recomputes tanh) beside the plain
// gradient, both of one tanh layer.
func ExampleCompiled_WriteMemoryReportCompare() {
	x := rt.FromSlice(make([]float32, 16*32), 16, 32)
	loss := func(w *trace.Array) *trace.Array { return trace.Sum(trace.Tanh(trace.MatMul(x, w))) }
	remat := trace.Remat(loss, trace.NothingSaveable)
	w := rt.FromSlice(make([]float32, 32*32), 32, 32)
	compile := func(f func(w *trace.Array) *trace.Array) *rt.Compiled {
		l, err := rt.Lower(trace.Grad(f), w)
		if err != nil {
			panic(err)
		}
		c, err := l.Compile()
		if err != nil {
			panic(err)
		}
		return c
	}
	base, variant := compile(loss), compile(remat)
	var page bytes.Buffer
	if err := variant.WriteMemoryReportCompare(&page, base); err != nil {
		panic(err)
	}
	var data struct {
		Name     string `json:"name"`
		Baseline *struct {
			Name string `json:"name"`
		} `json:"baseline"`
	}
	if err := json.Unmarshal(memoryReportData(page.Bytes()), &data); err != nil {
		panic(err)
	}
	fmt.Println("page with a baseline beside it:", data.Baseline != nil)
	// Output:
	// page with a baseline beside it: true
}

// WriteLiveMemoryReport draws the pools as they are now: here the array
// made just before is among the largest live buffers of device 0's pool.
func ExampleWriteLiveMemoryReport() {
	a := rt.FromSlice(make([]float32, 123457), 123457)
	defer a.Delete()
	var page bytes.Buffer
	if err := rt.WriteLiveMemoryReport(&page); err != nil { // or an *os.File
		panic(err)
	}
	var data struct {
		Pools []struct {
			Platform string `json:"platform"`
			Device   int    `json:"device"`
			Space    string `json:"space"`
			Largest  []struct {
				Type string `json:"type"`
			} `json:"largest"`
		} `json:"pools"`
	}
	if err := json.Unmarshal(memoryReportData(page.Bytes()), &data); err != nil {
		panic(err)
	}
	for _, p := range data.Pools {
		for _, b := range p.Largest {
			if b.Type == "f32[123457]" {
				fmt.Printf("%s:%d %s holds an f32[123457]\n", p.Platform, p.Device, p.Space)
			}
		}
	}
	// Output:
	// cpu:0 device holds an f32[123457]
}

// InitDistributed joins the processes of a job (under mpirun, or named by
// FERRY_COORDINATOR_ADDRESS, FERRY_NUM_PROCESSES and FERRY_PROCESS_ID);
// started alone, the process is a job of one and nothing changes.
func ExampleInitDistributed() {
	if err := rt.InitDistributed(rt.DistributedConfig{}); err != nil {
		panic(err)
	}
	defer rt.ShutdownDistributed()
	fmt.Printf("process %d of %d\n", rt.ProcessIndex(), rt.ProcessCount())
	// Output:
	// process 0 of 1
}
