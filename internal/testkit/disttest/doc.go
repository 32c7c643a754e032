// Package disttest tests rt.InitDistributed: sharded jitted functions over
// the devices of several processes of an MPI job give the results of one
// process. Its tests named TestMPI* run under mpirun and skip otherwise
// (see .ci/mpi.sh):
//
//	go test -c -o /tmp/dist.test ./internal/testkit/disttest
//	FERRY_CPU_DEVICES=2 mpirun --oversubscribe -np 2 /tmp/dist.test -test.run MPI
//
// The same checks run in one process on virtual devices under plain go test.
package disttest
