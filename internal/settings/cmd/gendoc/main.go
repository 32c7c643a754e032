// Command gendoc writes the table of internal/settings into the settings
// page (docs/settings.md), between its markers; the rest of the page is
// kept.
//
//	go run ./internal/settings/cmd/gendoc -w docs/settings.md   # rewrite the page
//	go run ./internal/settings/cmd/gendoc                        # print the table
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ferryml/ferry/internal/settings"
)

func main() {
	page := flag.String("w", "", "rewrite the table section of this Markdown `file`")
	flag.Parse()
	if *page == "" {
		fmt.Print(settings.Markdown())
		return
	}
	old, err := os.ReadFile(*page)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
	out, err := settings.UpdateDoc(old)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gendoc: %s: %v\n", *page, err)
		os.Exit(1)
	}
	if err := os.WriteFile(*page, out, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
}
