package collective_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

// Four virtual devices, one goroutine each, sum their gradients with an
// all-reduce and then gather one row each of a 4×2 array sharded along axis 0.
func Example() {
	ranks, err := collective.NewLocal(4)
	if err != nil {
		panic(err)
	}
	sums := make([][]float32, 4)
	rows := make([][]int32, 4)
	var wg sync.WaitGroup
	for _, c := range ranks {
		wg.Go(func() {
			ctx := context.Background()
			r := c.Rank()

			grad := ir.Scalar(float32(r + 1)).Data // this device's gradient
			sum := make([]byte, 4)
			if err := c.AllReduce(ctx, collective.Sum, ir.Float32, grad, sum); err != nil {
				panic(err)
			}
			sums[r] = ir.ViewBytes[float32](sum)

			shard, _ := ir.LiteralOf(ir.Shape{1, 2}, []int32{int32(10 * r), int32(10*r + 1)})
			full := make([]byte, 4*4*2)
			if err := c.AllGather(ctx, ir.Int32, []int{1, 2}, 0, shard.Data, full); err != nil {
				panic(err)
			}
			rows[r] = ir.ViewBytes[int32](full)
		})
	}
	wg.Wait()
	fmt.Println("sum on every rank:", sums)
	fmt.Println("rank 2 gathered:", rows[2])
	// Output:
	// sum on every rank: [[10] [10] [10] [10]]
	// rank 2 gathered: [0 1 10 11 20 21 30 31]
}

// A 2×4 mesh of 8 devices: MeshAxes gives each device the communicator of
// its row (axis 1) and of its column (axis 0).
func ExampleMeshAxes() {
	ranks, _ := collective.NewLocal(8)
	rowSums := make([]int32, 8)
	colSums := make([]int32, 8)
	var wg sync.WaitGroup
	for _, c := range ranks {
		wg.Go(func() {
			ctx := context.Background()
			row, err := collective.MeshAxes(ctx, c, []int{2, 4}, 1)
			if err != nil {
				panic(err)
			}
			col, err := collective.MeshAxes(ctx, c, []int{2, 4}, 0)
			if err != nil {
				panic(err)
			}
			me, out := ir.Scalar(int32(c.Rank())).Data, make([]byte, 4)
			row.AllReduce(ctx, collective.Sum, ir.Int32, me, out)
			rowSums[c.Rank()] = ir.ViewBytes[int32](out)[0]
			col.AllReduce(ctx, collective.Sum, ir.Int32, me, out)
			colSums[c.Rank()] = ir.ViewBytes[int32](out)[0]
		})
	}
	wg.Wait()
	fmt.Println("row sums:", rowSums)
	fmt.Println("column sums:", colSums)
	// Output:
	// row sums: [6 6 6 6 22 22 22 22]
	// column sums: [4 6 8 10 4 6 8 10]
}

// Two processes of two devices each: here the processes are goroutines
// joined by a Local communicator; under mpirun each process would pass its
// Open MPI communicator instead. Every process calls NewHybrid once and runs
// one goroutine per local device; device d of process p is rank 2p+d of a
// 4-rank world, and a mesh axis can span the processes.
func ExampleNewHybrid() {
	procs, err := collective.NewLocal(2)
	if err != nil {
		panic(err)
	}
	sums := make([]float32, 4)
	cols := make([][]int32, 4)
	var wg sync.WaitGroup
	for _, pc := range procs { // one per process
		wg.Go(func() {
			ctx := context.Background()
			devs, err := collective.NewHybrid(ctx, pc, 2)
			if err != nil {
				panic(err)
			}
			var dw sync.WaitGroup
			for _, c := range devs { // one per local device
				dw.Go(func() {
					r := c.Rank()
					sum := make([]byte, 4)
					if err := c.AllReduce(ctx, collective.Sum, ir.Float32, ir.Scalar(float32(r+1)).Data, sum); err != nil {
						panic(err)
					}
					sums[r] = ir.ViewBytes[float32](sum)[0]
					// The columns of a 2×2 mesh: ranks {0, 2} and {1, 3}, one
					// device in each process.
					col, err := collective.MeshAxes(ctx, c, []int{2, 2}, 0)
					if err != nil {
						panic(err)
					}
					got := make([]byte, 8)
					if err := col.AllGather(ctx, ir.Int32, nil, 0, ir.Scalar(int32(r)).Data, got); err != nil {
						panic(err)
					}
					cols[r] = ir.ViewBytes[int32](got)
				})
			}
			dw.Wait()
		})
	}
	wg.Wait()
	fmt.Println("sum on every rank:", sums)
	fmt.Println("mesh columns:", cols)
	// Output:
	// sum on every rank: [10 10 10 10]
	// mesh columns: [[0 2] [1 3] [0 2] [1 3]]
}
