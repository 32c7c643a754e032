package collective

import (
	"bytes"
	"context"
	"testing"

	"github.com/ferryml/ferry/ir"
)

// TestReduceMatchesLocal: Reduce over the ranks' buffers in rank order gives
// the bits of Local's AllReduce, for every dtype and op.
func TestReduceMatchesLocal(t *testing.T) {
	r := newRand(t)
	for _, n := range []int{1, 3, 4} {
		for _, dt := range ir.AllDTypes {
			for op := Sum; op <= Min; op++ {
				elems := 1 + r.IntN(3000)
				sends := make([][]byte, n)
				for i := range sends {
					sends[i] = alloc(elems * dt.Size())
					for j := range sends[i] {
						sends[i][j] = byte(r.Uint32())
					}
				}
				got := alloc(elems * dt.Size())
				if err := Reduce(op, dt, got, sends...); err != nil {
					t.Fatal(err)
				}
				recvs := make([][]byte, n)
				noErrors(t, ranks(t, n, func(ctx context.Context, c *Local) error {
					recvs[c.Rank()] = alloc(elems * dt.Size())
					return c.AllReduce(ctx, op, dt, sends[c.Rank()], recvs[c.Rank()])
				}))
				if !bytes.Equal(got, recvs[0]) {
					t.Fatalf("n=%d %v %v: Reduce differs from Local's AllReduce", n, dt, op)
				}
			}
		}
	}
	if err := Reduce(Sum, ir.Float32, make([]byte, 8), make([]byte, 4)); err == nil {
		t.Fatal("Reduce accepted buffers of different lengths")
	}
}
