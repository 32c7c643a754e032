package nccl_test

import (
	"fmt"

	"github.com/ferryml/ferry/cuda/nccl"
	"github.com/ferryml/ferry/ir"
)

// One process per GPU: rank 0 makes the id, every process receives it (here
// a stand-in for collective/mpi's Broadcast) and joins; then an all-reduce of
// a device buffer on the backend's compute stream.
func Example() {
	lib, err := nccl.Load()
	if err != nil {
		fmt.Println("no NCCL:", err != nil)
		return
	}
	rank, nranks := 0, 1
	var id nccl.UniqueID
	if rank == 0 {
		if id, err = lib.GetUniqueID(); err != nil {
			fmt.Println(err)
			return
		}
	}
	// ... broadcast id to the other ranks (MPI_Bcast of its 128 bytes) ...
	comm, err := lib.CommInitRank(nranks, id, rank)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer comm.Destroy()
	var grad, sum, stream uintptr // device buffers and CUstream from the CUDA backend
	if err := comm.AllReduce(grad, sum, 1024, ir.Float32, nccl.Sum, stream); err != nil {
		fmt.Println(err)
	}
}
