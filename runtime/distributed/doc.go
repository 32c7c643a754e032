// Package distributed starts a job of several processes that run one
// sharded program over all their devices (rt.InitDistributed, like
// jax.distributed.initialize), and makes the communicators such a program's
// collectives run over.
//
// Join finds the job's processes (a communicator given in Config, a TCP
// rendezvous of package collective/rendezvous, mpirun through package
// collective/mpi, or the environment) and returns its *Job: this process's
// index, the process count, the devices per process, and the world of
// devices (collective.NewHybrid) from which WorldComms splits a mesh's
// communicators. DeviceComms makes the device communicators (NCCL's, through
// a backend.DeviceCommMaker) of a mesh, exchanging their ids over the
// processes. A nil *Job is a job of one process: every device is local.
//
// Package runtime (rt) is its one user: rt.InitDistributed,
// rt.ShutdownDistributed, rt.ProcessIndex, rt.ProcessCount,
// rt.LocalDevices and rt.ProcessBarrier are the entry points users call.
package distributed
