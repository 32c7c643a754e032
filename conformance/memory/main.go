// Command memory compares Ferry's memory analysis (rt.Compiled.MemoryAnalysis)
// with XLA:CPU's (jax.jit(f).lower(*args).compile().memory_analysis()) for
// programs written identically in Go (programs.go) and in Python
// (xla_memory.py), with abstract arguments on both sides.
//
//	go run ./conformance/memory          # a table
//	go run ./conformance/memory -json    # one JSON array of rows
//	go run ./conformance/memory -xla gpu.json   # XLA's figures from a file
//
// XLA's figures are read from testdata/xla_memory.json (embedded), which
// xla_memory.py --write regenerates and .ci/xlamem.sh checks, or from the
// file -xla names: on a GPU machine, `python xla_memory.py --platform cuda
// --json > gpu.json` gives XLA:GPU's, and FERRY_BACKEND=cuda compiles Ferry's
// side with the CUDA backend, so the table compares the two on that GPU.
package main

import (
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"

	_ "github.com/ferryml/ferry/cuda" // FERRY_BACKEND=cuda compiles on the GPU
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
)

//go:embed testdata/xla_memory.json
var xlaJSON []byte

// XLA is one program's memory analysis by XLA:CPU, in bytes.
type XLA struct {
	Temp           int64 `json:"temp"`
	Argument       int64 `json:"argument"`
	Output         int64 `json:"output"`
	Alias          int64 `json:"alias"`
	HostTemp       int64 `json:"host_temp"`
	HostArgument   int64 `json:"host_argument"`
	HostOutput     int64 `json:"host_output"`
	HostAlias      int64 `json:"host_alias"`
	OutputLeaves   int   `json:"output_leaves"`
	ArgumentLeaves int   `json:"argument_leaves"`
}

// OutputArrays is XLA's output size without the tuple index table (8 bytes
// per output leaf) that XLA counts when a program has several outputs: the
// bytes of the output arrays, Ferry's OutputBytes.
func (x XLA) OutputArrays() int64 {
	if x.OutputLeaves > 1 {
		return x.Output - 8*int64(x.OutputLeaves)
	}
	return x.Output
}

// XLAFile is testdata/xla_memory.json.
type XLAFile struct {
	JAX      string         `json:"jax"`
	JAXLib   string         `json:"jaxlib"`
	Platform string         `json:"platform"`
	Programs map[string]XLA `json:"programs"`
}

// loadXLA reads XLA's figures from path, or the embedded
// testdata/xla_memory.json when path is "".
func loadXLA(path string) (XLAFile, error) {
	var f XLAFile
	data, name := xlaJSON, "testdata/xla_memory.json"
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return f, err
		}
		name = path
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return f, fmt.Errorf("%s: %w", name, err)
	}
	return f, nil
}

// Row is one program of the report.
type Row struct {
	Program        string  `json:"program"`
	Temp           int64   `json:"temp_bytes"`
	Argument       int64   `json:"argument_bytes"`
	Output         int64   `json:"output_bytes"`
	Alias          int64   `json:"alias_bytes"`
	HostTemp       int64   `json:"host_temp_bytes"`
	XLATemp        int64   `json:"xla_temp_bytes"`
	XLAArgument    int64   `json:"xla_argument_bytes"`
	XLAOutput      int64   `json:"xla_output_bytes"` // without the tuple index table
	XLAAlias       int64   `json:"xla_alias_bytes"`
	XLAHostTemp    int64   `json:"xla_host_temp_bytes"`
	TempRatio      float64 `json:"temp_ratio"` // Ferry temp / XLA temp (0 when both are 0)
	KnownGap       string  `json:"known_gap,omitempty"`
	FerryNumLeaves int     `json:"-"`
}

// analyse compiles p with abstract arguments and returns Ferry's analysis.
func analyse(p program) (passes.MemoryAnalysis, error) {
	c, err := compile(p)
	if err != nil {
		return passes.MemoryAnalysis{}, err
	}
	return c.MemoryAnalysis(), nil
}

// compile lowers and compiles p with abstract arguments.
func compile(p program) (*rt.Compiled, error) {
	opts := []rt.Option{rt.WithName(p.name)}
	if len(p.donate) > 0 {
		opts = append(opts, rt.Donate(p.donate...))
	}
	low, err := rt.NewJitted[any](p.fn, opts...).Lower(p.args()...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.name, err)
	}
	c, err := low.Compile()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.name, err)
	}
	return c, nil
}

// ratio is a/b, 0 when both are 0 and +Inf when only b is.
func ratio(a, b int64) float64 {
	switch {
	case a == 0 && b == 0:
		return 0
	case b == 0:
		return inf
	}
	return float64(a) / float64(b)
}

var inf = func() float64 { var z float64; return 1 / z }()

// rows analyses every program selected by only (all when empty) and pairs it
// with XLA's figures.
func rows(x XLAFile, only func(string) bool) ([]Row, error) {
	var out []Row
	for _, p := range programs() {
		if only != nil && !only(p.name) {
			continue
		}
		xm, ok := x.Programs[p.name]
		if !ok {
			return nil, fmt.Errorf("%s: not in testdata/xla_memory.json (regenerate it with xla_memory.py --write)", p.name)
		}
		m, err := analyse(p)
		if err != nil {
			return nil, err
		}
		out = append(out, Row{
			Program: p.name, Temp: m.TempBytes, Argument: m.ArgumentBytes, Output: m.OutputBytes, Alias: m.AliasBytes, HostTemp: m.HostTempBytes,
			XLATemp: xm.Temp, XLAArgument: xm.Argument, XLAOutput: xm.OutputArrays(), XLAAlias: xm.Alias, XLAHostTemp: xm.HostTemp,
			TempRatio: ratio(m.TempBytes, xm.Temp), KnownGap: knownGaps[p.name],
		})
	}
	return out, nil
}

func mib(b int64) string { return fmt.Sprintf("%.2f", float64(b)/(1<<20)) }

func printTable(x XLAFile, rs []Row) {
	fmt.Printf("Ferry's memory analysis vs XLA's on %s (jax %s, jaxlib %s), MiB\n\n", x.Platform, x.JAX, x.JAXLib)
	fmt.Println("| program | Ferry temp | XLA temp | temp ratio | argument (both) | output (Ferry / XLA) | alias (Ferry / XLA) |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range rs {
		arg := mib(r.Argument)
		if r.Argument != r.XLAArgument {
			arg += " / " + mib(r.XLAArgument) + " (differ)"
		}
		note := ""
		if r.KnownGap != "" {
			note = " †"
		}
		fmt.Printf("| %s%s | %s | %s | %s | %s | %s / %s | %s / %s |\n", r.Program, note, mib(r.Temp), mib(r.XLATemp), ratioString(r.TempRatio),
			arg, mib(r.Output), mib(r.XLAOutput), mib(r.Alias), mib(r.XLAAlias))
	}
	var gaps []string
	for _, r := range rs {
		if r.KnownGap != "" {
			gaps = append(gaps, fmt.Sprintf("† %s: %s", r.Program, r.KnownGap))
		}
	}
	sort.Strings(gaps)
	if len(gaps) > 0 {
		fmt.Println()
		fmt.Println(strings.Join(gaps, "\n"))
	}
}

func ratioString(r float64) string {
	switch {
	case r == 0:
		return "—"
	case r == inf:
		return "∞"
	}
	return fmt.Sprintf("%.2f", r)
}

func main() {
	asJSON := flag.Bool("json", false, "print one JSON array of rows")
	run := flag.String("run", "", "only programs whose name contains this")
	peak := flag.Bool("peak", false, "print the optimised IR and the device peak's live set of each selected program")
	xlaPath := flag.String("xla", "", "read XLA's figures from this JSON file (xla_memory.py --json) instead of testdata/xla_memory.json")
	flag.Parse()
	x, err := loadXLA(*xlaPath)
	if err != nil {
		log.Fatal(err)
	}
	var only func(string) bool
	if *run != "" {
		only = func(n string) bool { return strings.Contains(n, *run) }
	}
	if *peak {
		for _, p := range programs() {
			if only != nil && !only(p.name) {
				continue
			}
			c, err := compile(p)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Printf("== %s\n%s\n%s\n", p.name, c.OptimizedIR(), passes.PeakLive(c.Program(), ir.Device))
		}
		return
	}
	rs, err := rows(x, only)
	if err != nil {
		log.Fatal(err)
	}
	if *asJSON {
		for i := range rs {
			if rs[i].TempRatio == inf {
				rs[i].TempRatio = -1 // JSON has no infinity: -1 means XLA's temp is 0 and Ferry's is not
			}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rs); err != nil {
			log.Fatal(err)
		}
		return
	}
	printTable(x, rs)
}
