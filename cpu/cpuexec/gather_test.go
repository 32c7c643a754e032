package cpuexec

import (
	"testing"

	"github.com/ferryml/ferry/ir"
)

// BenchmarkGatherStage reads 1024-element blocks through the index maps of
// the broadcasts that dominate a Transformer step's fused groups: a row
// statistic over 128 columns (stride 0), a 128-vector over rows, a
// softmax row statistic over 64 columns.
func BenchmarkGatherStage(b *testing.B) {
	for _, c := range []struct {
		name        string
		shape, st   []int
		srcLen, cnt int
	}{
		{"row-stat-128", []int{2048, 128}, []int{1, 0}, 2048, 1024},
		{"vector-128", []int{2048, 128}, []int{0, 1}, 128, 1024},
		{"row-stat-64", []int{8192, 64}, []int{1, 0}, 8192, 1024},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := ir.NewStridedView(c.shape, c.st, 0)
			src := make([]uint32, c.srcLen)
			dst := make([]uint32, c.cnt)
			n := c.shape[0] * c.shape[1]
			b.SetBytes(int64(4 * c.cnt))
			lo := 0
			for b.Loop() {
				gatherStage(dst, src, &s, lo, c.cnt)
				lo = (lo + c.cnt) % n
			}
		})
	}
}

// TestGatherStageBroadcast checks gathers through broadcast index maps
// (runs of one value, filled by fillRun) against a per-element reference
// (ir.StridedView.At), for random block positions and lengths.
func TestGatherStageBroadcast(t *testing.T) {
	r := newRand()
	for _, c := range []struct{ shape, st []int }{
		{[]int{37, 5}, []int{1, 0}},
		{[]int{6, 131}, []int{1, 0}},
		{[]int{3, 4, 70}, []int{4, 1, 0}},
		{[]int{9, 17}, []int{0, 1}},
		{[]int{1000}, []int{0}},
	} {
		s := ir.NewStridedView(c.shape, c.st, 0)
		n := 1
		for _, d := range c.shape {
			n *= d
		}
		src := make([]uint32, n)
		for i := range src {
			src[i] = r.Uint32()
		}
		for range 50 {
			lo := r.IntN(n)
			cnt := r.IntN(n - lo + 1)
			dst := make([]uint32, cnt+1)
			dst[cnt] = 7
			gatherStage(dst, src, &s, lo, cnt)
			for k := range cnt {
				if want := src[s.At(lo+k)]; dst[k] != want {
					t.Fatalf("%v %v: [%d] (lo %d) = %d, want %d", c.shape, c.st, k, lo, dst[k], want)
				}
			}
			if dst[cnt] != 7 {
				t.Fatalf("%v %v: wrote past %d elements", c.shape, c.st, cnt)
			}
		}
	}
}
