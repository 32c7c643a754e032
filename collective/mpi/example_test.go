package mpi_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"math"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/mpi"
	"github.com/ferryml/ferry/ir"
)

// A sum over the processes of an MPI job, started with mpirun -np N ./prog.
func Example() {
	if !mpi.InMPIJob() {
		return // started without mpirun
	}
	if err := mpi.Init(); err != nil {
		log.Fatal(err)
	}
	defer mpi.Finalize()
	world, err := mpi.World()
	if err != nil {
		log.Fatal(err)
	}
	defer world.Close()
	buf := make([]byte, 4)
	binary.LittleEndian.PutUint32(buf, math.Float32bits(float32(world.Rank()+1)))
	if err := world.AllReduce(context.Background(), collective.Sum, ir.Float32, buf, buf); err != nil {
		log.Fatal(err)
	}
	if world.Rank() == 0 {
		fmt.Println("sum of 1..N:", math.Float32frombits(binary.LittleEndian.Uint32(buf)))
	}
}
