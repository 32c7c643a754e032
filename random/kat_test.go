package random_test

import (
	"testing"

	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/stretchr/testify/require"
)

func u32s(v ...uint32) []uint32 { return v }

func TestBlockKAT(t *testing.T) {
	cases := []struct{ k0, k1, x0, x1, y0, y1 uint32 }{
		{0, 0, 0, 0, 0x6b200159, 0x99ba4efe},
		{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x1cb996fc, 0xbb002be7},
		{0x13198a2e, 0x03707344, 0x243f6a88, 0x85a308d3, 0xc4923a9c, 0x483df7a0},
	}
	for _, c := range cases {
		y0, y1 := random.Block(rt.FromSlice(u32s(c.k0), 1), rt.FromSlice(u32s(c.k1), 1), rt.FromSlice(u32s(c.x0), 1), rt.FromSlice(u32s(c.x1), 1))
		require.Equal(t, u32s(c.y0), y0.Uint32s())
		require.Equal(t, u32s(c.y1), y1.Uint32s())
	}
}

func TestSplitMatchesJAX(t *testing.T) {
	defer random.SetPartitionable(random.SetPartitionable(false))
	k := random.NewKey(0)
	require.Equal(t, u32s(0, 0), k.Uint32s())
	require.Equal(t, u32s(4146024105, 967050713, 2718843009, 1272950319), random.Split(k, 2).Uint32s())
}
