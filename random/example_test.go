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
	fmt.Println(random.Split(key, 2)) // jax.random.split(jax.random.key(0))
	ks := random.Keys(key, 2)
	k1, k2 := ks[0], ks[1]
	fmt.Println(random.Bits(k1, 3))
	init := rt.Jit(func(k *trace.Array) *trace.Array {
		return random.Uniform(k, ir.Float32, ir.Shape{2, 3}, -1, 1)
	})
	fmt.Println(init(k2))
	fmt.Println(random.Permutation(k2, 8))
	// Output:
	// u32[2,2] [[1797259609 2579123966] [928981903 3453687069]]
	// u32[3] [3617712097 783310428 975722988]
	// f32[2,3] [[-0.98541236 -0.9582176 0.162853] [-0.27632403 -0.55392456 -0.76142335]]
	// i32[8] [0 3 5 1 4 6 2 7]
}

// The original bit layout of JAX before 0.5 (jax_threefry_partitionable=False)
// stays available, for values generated with it.
func ExampleSetPartitionable() {
	prev := random.SetPartitionable(false)
	defer random.SetPartitionable(prev)
	fmt.Println(random.Split(random.NewKey(0), 2))
	// Output:
	// u32[2,2] [[4146024105 967050713] [2718843009 1272950319]]
}
