// Package collective runs collectives (all-reduce, all-gather, reduce-scatter,
// all-to-all, collective permute, broadcast, barrier) over a group of ranks,
// the devices of a sharded computation.
//
// [Communicator] is the interface every engine implements; each rank holds its
// own Communicator and calls the same collectives in the same order with its
// own buffers. [Local] is the in-process engine (virtual CPU devices: ranks are
// goroutines sharing memory); engines for Open MPI between processes and NCCL
// between GPUs implement the same interface in their own packages, and
// collective/rendezvous joins processes without MPI over TCP for a
// bootstrap only (barriers and small ids such as NCCL's; no array data). [Hybrid]
// spreads the ranks over processes: one rank per device of every process,
// the processes joined by another engine's communicator (see [NewHybrid]).
//
// Buffers are []byte holding elements of an ir.DType, row-major. Collectives
// that cut arrays into per-rank blocks (AllGather, ReduceScatter, AllToAll)
// take the array's shape and the axis of the blocks, so a sharded dimension is
// gathered or scattered in place without a transpose. Sub-groups (the ranks
// along one mesh axis) come from [Communicator.Split], [SplitGroups] (XLA's
// replica_groups) or [MeshAxes].
//
// Each Communicator runs one collective at a time. To overlap a collective
// with compute, call it from another goroutine; to keep several collectives
// in flight, give each stream its own duplicate communicator, made with
// Split(ctx, 0, c.Rank()).
//
// Reductions are deterministic and give bit-identical results on every rank;
// Local's order is rank order (see [Local]). Mismatched calls are errors on
// every rank, not hangs; a context that ends while a rank waits, or
// [Communicator.Abort], wakes every rank with an error.
package collective
