package main

import (
	"fmt"
	"io"

	"github.com/ferryml/ferry/cuda"
	"github.com/ferryml/ferry/cuda/nccl"
)

// libraryReport is what -case probe found: one line per library, and the
// libraries that the driver's presence says should load but did not.
type libraryReport struct {
	Lines   []string
	Missing []string
	Driver  bool
}

// probeLibraries loads the driver, NVRTC, cuBLASLt and NCCL as the backend
// would. With a driver present, a GPU machine is expected to have the other
// three (the CUDA wheels of its Python, or the toolkit): each that does not
// load is missing, with every path searched.
func probeLibraries() libraryReport {
	info := cuda.Probe()
	var r libraryReport
	r.Driver = info.Driver.Path != ""
	ncclLine := "NCCL: "
	lib, err := nccl.Load()
	if err != nil {
		ncclLine += "not loaded: " + err.Error()
	} else {
		ncclLine += lib.Path
	}
	r.Lines = append(r.Lines,
		"CUDA driver: "+info.Driver.String(), "NVRTC: "+info.NVRTC.String(),
		"cuBLASLt: "+info.CublasLt.String(), ncclLine)
	if !r.Driver {
		return r
	}
	for _, l := range []struct {
		name string
		ok   bool
		why  string
	}{
		{"NVRTC", info.NVRTC.Path != "", fmt.Sprint(info.NVRTC.Err)},
		{"cuBLASLt", info.CublasLt.Path != "", fmt.Sprint(info.CublasLt.Err)},
		{"NCCL", err == nil, fmt.Sprint(err)},
	} {
		if !l.ok {
			r.Missing = append(r.Missing, fmt.Sprintf("%s: the CUDA driver loaded but %s did not: %s", l.name, l.name, l.why))
		}
	}
	return r
}

// printProbe writes the report and says whether every expected library
// loaded (no driver: nothing is expected, and the caller fails on that
// separately).
func printProbe(w io.Writer, r libraryReport) bool {
	for _, l := range r.Lines {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "search path: %v\n", cuda.SearchDirs())
	for _, m := range r.Missing {
		fmt.Fprintln(w, "MISSING", m)
	}
	return r.Driver && len(r.Missing) == 0
}
