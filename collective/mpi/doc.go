// Package mpi is the Open MPI engine of package collective: a
// [collective.Communicator] whose ranks are the processes of an MPI job.
// libmpi is loaded at run time with purego (no cgo, no MPI headers or
// compiler wrappers at build time): a program built with CGO_ENABLED=0 runs
// wherever Open MPI 4 or later is installed (Debian: openmpi-bin and
// libopenmpi-dev; the library is libmpi.so.40).
//
// # Launching
//
// Start one process per rank with mpirun; each calls Init, World, the same
// collectives in the same order, and Finalize:
//
//	mpirun -np 4 ./prog              # 4 processes on this machine
//	mpirun -np 16 --hostfile hosts ./prog
//	mpirun --oversubscribe -np 8 ./prog   # more ranks than cores
//
// (as root add --allow-run-as-root). [InMPIJob] tells whether the process was
// started so; a process started alone is an MPI job of one (a singleton).
//
// # Environment
//
//   - FERRY_MPI_LIB: the path of libmpi, tried before the system loader's
//     libmpi.so.40 and libmpi.so (see [Load]; a [LoadError] lists every
//     attempt).
//   - FERRY_COLLECTIVE_TIMEOUT: how long a collective waits for the other
//     ranks, a Go duration (default 5m, [DefaultTimeout]; 0 or off: no
//     limit). See Failures.
//   - FERRY_MPI_LIVENESS: how the processes watch each other for death
//     (default on; off, or the silence bound as a Go duration). See
//     Failures and [LivenessEnv].
//   - FERRY_MPI_REDUCE: native (default) or ordered, how reductions of the
//     dtypes MPI has are computed (see Reductions).
//   - FERRY_MPI_SPIN (default 1ms) and FERRY_MPI_MAX_SLEEP (default 1ms):
//     how long a waiting rank polls while yielding before it sleeps between
//     polls, and the longest sleep (see below).
//
// # Threads
//
// [Init] requests MPI_THREAD_MULTIPLE and refuses a library that provides
// less ([ErrThreadLevel]): several goroutines of a process (one per local
// device) call MPI at once, each on its own communicator. As for every
// Communicator, one communicator is used by one goroutine at a time; for
// concurrent streams make duplicates with Split(ctx, 0, c.Rank()). MPI is
// initialized and finalized on one OS thread kept for that.
//
// # How the collectives run
//
// Every call begins with an exchange of a small descriptor of each rank's
// call (collective, dtype, op, shape, axes, root, pairs, and its argument
// error if any) — point-to-point messages to and from every other rank in
// groups of up to 64 ranks, so that a rank that times out knows which ranks
// never joined, and one MPI_Iallgather in larger groups — so that mismatched calls return
// [collective.ErrMismatch] and one rank's invalid arguments return
// [collective.ErrInvalid] on every rank, like collective.Local, instead of
// hanging or corrupting memory. Then the transfer runs with MPI's
// non-blocking collectives (MPI_Iallreduce, MPI_Iallgather,
// MPI_Ireduce_scatter_block, MPI_Ialltoall, MPI_Ibcast; MPI_Isend and
// MPI_Irecv for CollectivePermute), polled with MPI_Testall. Between polls
// the goroutine yields (runtime.Gosched) for the first millisecond, then
// sleeps, 10µs at first and doubling up to a millisecond, so the goroutines
// sharing the process, and ranks sharing cores, make progress. Open MPI's
// non-blocking collectives advance only inside MPI calls, so the first
// millisecond of polling is what keeps small collectives fast (tens of
// microseconds rather than milliseconds). Barrier is the
// descriptor exchange alone. AllGather, ReduceScatter and AllToAll work on
// any axis: MPI moves contiguous blocks, so blocks along an inner axis are
// gathered into (or cut out of) a scratch buffer in row-major order.
//
// # Reductions
//
// Sum and Prod of f32, f64, i32, i64, u32 and u8, and Max and Min of the
// integers, use MPI's reduction: its order is Open MPI's (chosen by the
// message and group sizes), the result is the same on every rank, but float
// sums need not have collective.Local's bits with more than two ranks. f16,
// bf16 and bool (MPI has no such types), and float Max and Min (MPI's do not
// propagate NaN), are reduced here in rank order by collective.Reduce,
// Local's own kernel: AllReduce cuts the elements into one block per rank,
// MPI_Ialltoallv brings every rank's copy of block r to rank r, which
// reduces it, and MPI_Iallgatherv shares the reduced blocks; ReduceScatter
// needs only the MPI_Ialltoall. f16 and bf16 accumulate in float32 and round
// once, and the result has Local's bits. FERRY_MPI_REDUCE=ordered does the
// same for every dtype, so that a job of N processes gives the bits of N
// virtual devices in one process, at the price of doing the arithmetic
// outside MPI.
//
// # Failures
//
// A collective that has not completed after FERRY_COLLECTIVE_TIMEOUT, or whose
// context is done first, gives up: it marks its World failed and returns an
// error wrapping [collective.ErrAborted] and [ErrTimeout] (or ctx.Err()),
// naming the collective, the communicator's rank and size, the process and
// the timeout. Every later call on a communicator of that World returns
// ErrAborted. The reason is also sent to the other processes (a receive is
// kept posted on a private duplicate of MPI_COMM_WORLD and polled while a
// rank waits), so their pending and later calls fail at once with the
// message of the rank that gave up, rather than each waiting for its own
// timeout. [Comm.Abort] does the same on demand. The buffers of an abandoned
// collective stay pinned and may still be written by MPI: after a timeout
// the job should end.
//
// When a process dies (a crash, a kill, an exit without Finalize), mpirun
// by default ends the whole job: it kills the other processes and prints
// "mpirun noticed that process rank R with PID P on node N exited on signal
// S", exiting non-zero; the survivors print nothing more. Under mpirun
// --enable-recovery the survivors keep running, and a liveness side channel
// names the dead process within milliseconds, whatever the timeout: the
// first World of each process opens a TCP connection to process 0 (process
// 0 listens on a free port of every interface and broadcasts its addresses
// over MPI), and both ends send a heartbeat byte and, on Finalize, a bye.
// A connection that ends without the bye (the kernel closes a killed
// process's sockets) or stays silent longer than the silence bound (30 s,
// or half of FERRY_COLLECTIVE_TIMEOUT when that is shorter, at least 5 s: a
// host down, a network cut) loses its process: every pending and later
// collective of every World returns an error wrapping
// collective.ErrAborted and [ErrProcessLost] that names it by rank, host and
// pid ("process 2 of 3 (host node1, pid 4242) died: its liveness connection
// to process 0 ended without Finalize (EOF)"). Process 0 sees the others'
// deaths and passes them on by the abort message; the others see process
// 0's. World fails on every process, naming the processes, when one cannot
// connect to process 0; FERRY_MPI_LIVENESS=off turns the connections off
// (process 0's setting decides), and then a dead process is found by the
// timeout: the collective waiting for it fails after
// FERRY_COLLECTIVE_TIMEOUT (default 5 minutes) with the timeout error above,
// which names the ranks that never joined the collective ("rank(s) [2] of 3
// did not join it (still busy elsewhere, or dead)", or, for a rank that
// sent its part and died, "sent their part but never took this rank's"; in
// groups of over 64 ranks it cannot say which), or says "every rank joined
// it, but the transfer did not finish" for a death mid-transfer.
// MPI errors are returned as errors (communicators use MPI_ERRORS_RETURN),
// not fatal.
//
// Split calls MPI_Comm_split, which blocks; it runs only after the
// descriptor exchange has shown that every rank called Split, so it waits
// for no absent rank.
package mpi
