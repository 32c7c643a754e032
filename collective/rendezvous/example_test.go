package rendezvous_test

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/ferryml/ferry/collective/rendezvous"
	"github.com/ferryml/ferry/ir"
)

// Each process of a job calls Join with the coordinator's address, the
// process count and its own id — usually from the environment:
//
//	FERRY_COORDINATOR_ADDRESS=node0:29500 FERRY_NUM_PROCESSES=2 FERRY_PROCESS_ID=0 ./prog   # on node0
//	FERRY_COORDINATOR_ADDRESS=node0:29500 FERRY_NUM_PROCESSES=2 FERRY_PROCESS_ID=1 ./prog   # on node1
//
// with cfg, _, err := rendezvous.ConfigFromEnv(). Here the two processes
// are goroutines of one program, on a port of 127.0.0.1; process 0 makes an
// id (an NCCL unique id is 128 bytes) and broadcasts it.
func ExampleJoin() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	addr := ln.Addr().String()
	out := make([]string, 2)
	var wg sync.WaitGroup
	for p := range 2 {
		cfg := rendezvous.Config{CoordinatorAddress: addr, NumProcesses: 2, ProcessID: p}
		if p == 0 {
			cfg.Listener = ln // process 0 runs the coordinator
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			c, err := rendezvous.Join(ctx, cfg)
			if err != nil {
				out[p] = err.Error()
				return
			}
			defer c.Close()
			id := make([]byte, 128)
			if c.Rank() == 0 {
				copy(id, "an id made by process 0")
			}
			if err := c.Broadcast(ctx, ir.Uint8, 0, id); err != nil {
				out[p] = err.Error()
				return
			}
			out[p] = fmt.Sprintf("process %d of %d has %q", c.Rank(), c.Size(), id[:23])
		}()
	}
	wg.Wait()
	fmt.Println(out[0])
	fmt.Println(out[1])
	// Output:
	// process 0 of 2 has "an id made by process 0"
	// process 1 of 2 has "an id made by process 0"
}
