package dynlib_test

import (
	"fmt"

	"github.com/ferryml/ferry/internal/dynlib"
)

// A library that is not found is an error listing every place looked in.
func ExampleOpen() {
	_, err := dynlib.Open(dynlib.Spec{
		Prefix:  "demo",
		Pattern: "libferry-missing.so*",
		Dirs:    []string{"/nonexistent/lib"},
	})
	fmt.Println(err)
	// Output:
	// demo: cannot load libferry-missing.so*; looked in:
	//   /nonexistent/lib/libferry-missing.so*: no match (no such directory)
}
