// Package rendezvous joins the processes of a job without MPI: a small
// coordinator over TCP (standard library only) through which the processes
// agree on who they are, wait for each other, and pass the few bytes a
// bootstrap needs — device counts, NCCL unique ids (128 bytes each) — like
// the coordination service behind jax.distributed.initialize. It carries no
// array data: Ferry has no network layer of its own, so collectives between
// processes run on MPI (package collective/mpi, under mpirun) or on NCCL
// between GPUs, never here.
//
// # Launching
//
// Start one process per machine (or per GPU), each with the same
// coordinator address and process count and its own id:
//
//	# on node0 (process 0 runs the coordinator on port 29500):
//	FERRY_COORDINATOR_ADDRESS=node0:29500 FERRY_NUM_PROCESSES=2 FERRY_PROCESS_ID=0 ./train
//	# on node1:
//	FERRY_COORDINATOR_ADDRESS=node0:29500 FERRY_NUM_PROCESSES=2 FERRY_PROCESS_ID=1 ./train
//
// [ConfigFromEnv] reads these variables; rt.InitDistributed reads them when
// it is given no configuration and the process is not under mpirun. A
// program may also fill a [Config] itself and call [Join]. Process 0 listens
// on the address's port on every interface (on the address itself when it
// is a loopback address such as 127.0.0.1:29500, for jobs on one machine);
// the others connect to it, retrying until Config.ConnectTimeout (default 5
// minutes), so the processes may start in any order.
//
// # The job
//
// The coordinator admits the processes and checks that they form one job:
// a process told another FERRY_NUM_PROCESSES or another Config.Job, an id
// out of range or an id claimed twice makes Join fail in every process that
// reached the coordinator, with an error wrapping [ErrJob] that names the
// processes and their addresses. When some process has not arrived within
// the connect timeout, the others fail with [ErrTimeout] naming it.
//
// # The communicators
//
// Join returns a [Comm] over the job's processes, ranked by process id; it
// implements [collective.Communicator] for what a bootstrap needs: Barrier,
// Broadcast and flat AllGather (a nil shape) of at most [MaxBytes] per rank,
// Split (the coordinator forms the groups, so a program can give each group
// of processes — one per mesh axis, say — its own NCCL id), Abort and
// Close. Every collective is one message from each member to the
// coordinator, which checks that the members called the same collective
// with the same arguments (else [collective.ErrMismatch] on every member, as
// with collective.Local; one member's invalid arguments give every member
// [collective.ErrInvalid]) and answers each. AllReduce, ReduceScatter,
// AllToAll, CollectivePermute, AllGather with a shape, and buffers over
// MaxBytes return at once, on every rank, an error wrapping
// [ErrDataCollective] and collective.ErrInvalid: "the TCP rendezvous carries
// only barriers and ids; collectives between processes on the CPU backend
// need MPI (launch under mpirun) or NCCL on GPUs".
//
// # Failures
//
// A failure anywhere fails the whole job, never a hang: every pending and
// later call of every communicator of the job, in every process, returns an
// error wrapping [collective.ErrAborted] that names the call, the process
// and the cause, and the cause's sentinel:
//
//   - a process that dies (its connection ends without Close):
//     [ErrProcessLost], "process 2 is gone: its connection to the
//     coordinator ended without Close ...". A process that closes while
//     others still wait for it in a collective is reported the same way.
//   - a collective still incomplete FERRY_COLLECTIVE_TIMEOUT after its first
//     member called it (read by Join with [collective.TimeoutFromEnv];
//     default 5m, 0 or off for none; the coordinator times collectives with
//     process 0's setting): [ErrTimeout], naming the collective and the
//     processes that had not called it.
//   - [Comm.Abort], or a context done while a process waits: the process's
//     reason, passed on by the coordinator.
//   - losing process 0, which runs the coordinator: [ErrProcessLost] in
//     every other process.
//
// Process 0 must outlive the others' use of the job: its Close waits until
// every other process has closed (or died, or the timeout passed).
package rendezvous
