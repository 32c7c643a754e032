// Command cpupaths prints the kernel paths this host can run, best first
// (the values FERRY_CPU accepts here), separated by spaces.
package main

import (
	"fmt"
	"strings"

	"github.com/ferryml/ferry/cpu/cpufeat"
)

func main() { fmt.Println(strings.Join(cpufeat.Paths(), " ")) }
