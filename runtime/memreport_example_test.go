package runtime_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// WriteMemoryReport writes one HTML page to open in a browser; its data is
// JSON in the element with id rt.MemoryReportDataID. Here the page goes to
// a buffer and the example reads the data back: a 64×64 matrix product and
// its sum need two 16 KiB arguments, a 4-byte result and one 16 KiB temp.
func ExampleCompiled_WriteMemoryReport() {
	x := rt.FromSlice(make([]float32, 64*64), 64, 64)
	low, err := rt.Lower(func(a, b *trace.Array) *trace.Array { return trace.Sum(trace.MatMul(a, b)) }, x, x)
	if err != nil {
		panic(err)
	}
	c, err := low.Compile()
	if err != nil {
		panic(err)
	}
	var page bytes.Buffer
	if err := c.WriteMemoryReport(&page); err != nil { // or an *os.File: f, _ := os.Create("mem.html")
		panic(err)
	}
	m := regexp.MustCompile(`(?s)id="` + rt.MemoryReportDataID + `">(.*?)</script>`).FindSubmatch(page.Bytes())
	var data struct {
		Spaces []struct {
			Space     string `json:"space"`
			PeakBytes int64  `json:"peak_bytes"`
			Buffers   []struct {
				Value, Kind, Type string
			} `json:"buffers"`
		} `json:"spaces"`
	}
	if err := json.Unmarshal(m[1], &data); err != nil {
		panic(err)
	}
	for _, s := range data.Spaces {
		fmt.Printf("%s: peak %d bytes\n", s.Space, s.PeakBytes)
		for _, b := range s.Buffers {
			fmt.Printf("  %-8s %s\n", b.Kind, b.Type)
		}
	}
	// Output:
	// device: peak 49156 bytes
	//   argument f32[64,64]
	//   argument f32[64,64]
	//   temp     f32[64,64]
	//   output   f32[]
}
