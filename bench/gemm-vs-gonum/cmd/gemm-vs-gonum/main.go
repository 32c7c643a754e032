// Command gemm-vs-gonum prints Ferry's and gonum's Sgemm GFLOP/s for square
// sizes, measured in the same run, with all cores and with one.
package main

import (
	"flag"
	"fmt"
	"runtime"

	gemmcmp "github.com/ferryml/ferry/bench/gemm-vs-gonum"
)

func main() {
	rounds := flag.Int("rounds", 5, "interleaved rounds per size (the best is kept)")
	flag.Parse()
	sizes := []int{256, 512, 1024, 2048}
	fmt.Println("| n | threads | kernel | ferry GFLOP/s | gonum GFLOP/s | ratio |")
	fmt.Println("| --- | --- | --- | --- | --- | --- |")
	for _, threads := range []int{runtime.GOMAXPROCS(0), 1} {
		for _, r := range gemmcmp.Compare(sizes, threads, *rounds) {
			fmt.Printf("| %d | %d | %s | %.1f | %.1f | %.1f× |\n", r.N, r.Threads, r.Kernel, r.Ferry, r.Gonum, r.Ratio)
		}
	}
}
