package random_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Keys are split, never reused; the same key always gives the same values,
// eagerly or jitted, and the values match jax.random for the same key.
func Example() {
	key := random.NewKey(0)
	fmt.Println(random.Split(key, 2)) // jax.random.split(PRNGKey(0))
	ks := random.Keys(key, 2)
	k1, k2 := ks[0], ks[1]
	fmt.Println(random.Bits(k1, 3))
	init := rt.Jit(func(k *trace.Array) *trace.Array {
		return random.Uniform(k, ir.Float32, ir.Shape{2, 3}, -1, 1)
	})
	fmt.Println(init(k2))
	fmt.Println(random.Permutation(k2, 8))
	// Output:
	// u32[2,2] [[4146024105 967050713] [2718843009 1272950319]]
	// u32[3] [2384771982 2983891053 1278412471]
	// f32[2,3] [[-0.8552129 -0.9593463 -0.84563637] [0.7573583 -0.67085457 -0.7965734]]
	// i32[8] [3 6 4 1 2 5 0 7]
}
