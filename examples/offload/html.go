package main

import (
	"fmt"
	"os"
	"path/filepath"

	rt "github.com/ferryml/ferry/runtime"
)

// htmlDir is the -html directory: one memory report page per case.
var htmlDir string

// htmlBaseline is the baseline case's program, drawn beside the others.
var htmlBaseline *rt.Compiled

// writeHTML writes the memory report of case name as DIR/name.html when
// -html is set; the cases after the baseline have the baseline's picture
// beside theirs on demand (WriteMemoryReportCompare).
func writeHTML(name string, c *rt.Compiled) error {
	if htmlDir == "" {
		return nil
	}
	if err := os.MkdirAll(htmlDir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(htmlDir, name+".html"))
	if err != nil {
		return err
	}
	switch {
	case name == "baseline":
		htmlBaseline = c
		err = c.WriteMemoryReport(f)
	case htmlBaseline != nil:
		err = c.WriteMemoryReportCompare(f, htmlBaseline)
	default:
		err = c.WriteMemoryReport(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("-html: %s: %w", name, err)
	}
	return nil
}
