//go:build unix

package checkpoint_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/collective/rendezvous"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
)

// jobKillEnv makes TestKilledJobSave a process of the job it launches:
// "victim:N:dir:seed", the process victim killing itself at its Nth step
// of writing (N = 0: none).
const jobKillEnv = "FERRY_CKPT_JOB_KILL"

// jobSave is one process of TestKilledJobSave's job of 2 processes of 8
// CPU devices each, joined over TCP: it saves step 2 sharded over the 16
// devices of the job.
func jobSave(t *testing.T, v string) {
	parts := strings.Split(v, ":")
	require.Len(t, parts, 4)
	victim, _ := strconv.Atoi(parts[0])
	n, _ := strconv.Atoi(parts[1])
	seed, err := strconv.ParseUint(parts[3], 10, 64)
	require.NoError(t, err)
	require.NoError(t, rt.InitDistributed(rt.DistributedConfig{}))
	require.Len(t, rt.Devices(), 16)
	if rt.ProcessIndex() == victim {
		count := 0
		checkpoint.SetStepHook(func(step string) {
			if count++; count == n {
				fmt.Printf("process %d killed at %q\n", victim, step)
				p, _ := os.FindProcess(os.Getpid())
				_ = p.Kill()
				select {}
			}
		})
	}
	m16 := mesh(t, []int{16}, []string{"x"})
	m28 := mesh(t, []int{2, 8}, []string{"x", "y"})
	meshes := []*ir.Mesh{m16, m28, m28, m28, nil, m28, nil}
	specs := []ir.PartitionSpec{ir.P("x"), ir.P("y"), ir.P("", "y"), ir.P(), nil, ir.P("", "x"), nil}
	err = checkpoint.SaveSharded(parts[2], place(t, stepValues(seed, 2), meshes, specs), map[string]string{"step": "2"})
	if err != nil {
		fmt.Printf("process %d: save failed: %v\n", rt.ProcessIndex(), err)
	} else {
		fmt.Printf("process %d: save completed\n", rt.ProcessIndex())
	}
	_ = rt.ShutdownDistributed()
}

// runJob runs a job of 2 processes (this test binary again) saving step 2
// into dir, process victim killed at its nth step, and returns their
// outputs.
func runJob(t *testing.T, dir string, seed uint64, victim, n int) [2]string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // process 0 listens there
	var outs [2]string
	var errs [2]error
	var wg sync.WaitGroup
	for p := range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKilledJobSave$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d:%s:%d", jobKillEnv, victim, n, dir, seed),
			rendezvous.AddressEnv+"="+addr, rendezvous.NumProcessesEnv+"=2", rendezvous.ProcessIDEnv+"="+strconv.Itoa(p),
			collective.TimeoutEnv+"=1m", "OMPI_COMM_WORLD_SIZE=", "OMPI_COMM_WORLD_RANK=", "PMIX_RANK=", "PMI_RANK=")
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := cmd.CombinedOutput()
			outs[p], errs[p] = string(out), err
		}()
	}
	wg.Wait()
	for p := range 2 {
		killed := strings.Contains(outs[p], fmt.Sprintf("process %d killed at", p))
		if killed {
			var ee *exec.ExitError
			require.True(t, errors.As(errs[p], &ee), "process %d: %v\n%s", p, errs[p], outs[p])
			ws, ok := ee.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "process %d: %v\n%s", p, errs[p], outs[p])
		}
	}
	return outs
}

// TestKilledJobSave kills one process of a job of 2 (joined over TCP) at
// each step of its part of a sharded save of step 2 over a checkpoint of
// step 1: the other process's save fails or completes, and the directory
// then loads step 1 or step 2, values and metadata alike, never a mix of
// the two; the next save leaves only its own files.
func TestKilledJobSave(t *testing.T) {
	if v := settings.CkptJobKill.Get(); v != "" {
		jobSave(t, v)
		return
	}
	if inJob {
		t.Skip("one process")
	}
	if testing.Short() {
		t.Skip("launches jobs of 2 processes")
	}
	seed := testSeed(t)
	for _, victim := range []int{1, 0} {
		committed := false
		for n := 1; ; n++ {
			require.Less(t, n, 40, "the save never completed")
			dir := t.TempDir()
			require.NoError(t, saveStep(t, "sharded", dir, seed, 1))
			outs := runJob(t, dir, seed, victim, n)
			completed := !strings.Contains(outs[victim], "killed at")
			if completed {
				require.Contains(t, outs[0], "process 0: save completed", outs[0])
				require.Contains(t, outs[1], "process 1: save completed", outs[1])
			} else {
				require.Contains(t, outs[1-victim], fmt.Sprintf("process %d: save", 1-victim), "the other process did not return: %s", outs[1-victim])
			}
			values, meta, err := loadStep(t, "sharded", dir, seed)
			require.NoError(t, err, "process %d killed at step %d:\n%s\n%s", victim, n, outs[0], outs[1])
			require.Contains(t, []int{1, 2}, values, "process %d killed at step %d: loaded values of no save", victim, n)
			require.Equal(t, strconv.Itoa(values), meta, "process %d killed at step %d: values of step %d, metadata of step %s", victim, n, values, meta)
			require.False(t, committed && values == 1, "step 1 loaded after an earlier kill point loaded step 2")
			committed = values == 2
			line := func(p int) string {
				for _, l := range strings.Split(outs[p], "\n") {
					if strings.HasPrefix(l, fmt.Sprintf("process %d", p)) {
						return l
					}
				}
				return "no word"
			}
			t.Logf("kill point %d of process %d: %s; %s; loaded step %d", n, victim, line(victim), line(1-victim), values)

			require.NoError(t, saveStep(t, "sharded", dir, seed, 3))
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			idx, err := checkpoint.ReadIndex(dir)
			require.NoError(t, err)
			require.Len(t, entries, 2, "the next save left files of earlier ones")
			require.Equal(t, idx.Files[0].Name, entries[1].Name())
			if completed {
				require.True(t, committed)
				break
			}
		}
	}
}
