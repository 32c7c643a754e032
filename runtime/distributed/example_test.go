package distributed_test

import (
	"errors"
	"fmt"

	"github.com/ferryml/ferry/runtime/distributed"
)

// Work for each device runs at once, one goroutine each, and the errors
// come back by device.
func ExampleOnEachDevice() {
	sums := make([]int, 4)
	errs := distributed.OnEachDevice(4, func(d int) error {
		for i := range 10 {
			sums[d] += d * i
		}
		if d == 3 {
			return fmt.Errorf("device %d: out of memory", d)
		}
		return nil
	})
	fmt.Println(sums, errors.Join(errs...))
	// Output:
	// [0 45 90 135] device 3: out of memory
}
