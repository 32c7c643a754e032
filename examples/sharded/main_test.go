package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/collective/mpi"
	"github.com/ferryml/ferry/internal/settings"
	rt "github.com/ferryml/ferry/runtime"
)

// inJob is set under mpirun: then every process has 2 devices (or
// FERRY_CPU_DEVICES) and TestMPIModes trains over all of them.
var inJob bool

func TestMain(m *testing.M) {
	devices := 8
	if mpi.InMPIJob() {
		inJob, devices = true, 2
	}
	if !inJob || !settings.CPUDevices.IsSet() {
		if err := rt.SetCPUDeviceCount(devices); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if !inJob {
		os.Exit(m.Run())
	}
	if err := rt.InitDistributed(rt.DistributedConfig{}); err != nil {
		fmt.Fprintln(os.Stderr, "InitDistributed:", err)
		os.Exit(2)
	}
	code := m.Run()
	if err := rt.ShutdownDistributed(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// TestMPIModes trains every mode over the devices of every process of an
// MPI job (see .ci/mpi.sh) and checks the parameters against the one-device
// run of each process:
//
//	go test -c -o /tmp/sharded.test ./examples/sharded
//	mpirun --oversubscribe -np 2 /tmp/sharded.test -test.run MPI
func TestMPIModes(t *testing.T) {
	if !inJob {
		t.Skip("not started by mpirun; run: go test -c -o /tmp/sharded.test ./examples/sharded && mpirun --oversubscribe -np 2 /tmp/sharded.test -test.run MPI")
	}
	n := len(rt.Devices())
	require.Greater(t, rt.ProcessCount(), 1)
	for _, mode := range []string{"dp", "tp", "fsdp"} {
		t.Run(mode, func(t *testing.T) {
			r, err := Run(mode, n, 2, testSizes)
			require.NoError(t, err)
			require.Equal(t, n, r.Devices)
			require.Greater(t, r.MaxAbsParam, 0.0)
			require.LessOrEqual(t, r.MaxAbsDiff, 1e-5*(1+r.MaxAbsParam), "%+v", r)
			require.InDelta(t, r.SingleLoss, r.Loss, 1e-5*(1+r.SingleLoss))
			require.Len(t, r.PeakDeviceBytes, len(rt.LocalDevices()))
		})
	}
}

// testSizes are smaller than Small, for go test.
var testSizes = Sizes{Batch: 32, In: 16, Hidden: 32, Classes: 8, T: 8, D: 32, Heads: 8, FF: 64, Vocab: 32, Layers: 2}

// TestModesMatchOneDevice trains every mode on 2, 4 and 8 devices and
// checks the parameters against the one-device run, and what each mode is
// about: data parallel all-reduces and gathers nothing; the tensor-parallel
// forward pass has one all-reduce per column- then row-parallel pair; FSDP
// holds 1/N of the parameters and optimizer state per device and
// reduce-scatters the gradients.
func TestModesMatchOneDevice(t *testing.T) {
	if inJob {
		t.Skip("in an MPI job: TestMPIModes trains over the job's devices")
	}
	for _, n := range []int{2, 4, 8} {
		for _, mode := range []string{"dp", "tp", "fsdp"} {
			t.Run(fmt.Sprint(mode, n), func(t *testing.T) {
				r, err := Run(mode, n, 2, testSizes)
				require.NoError(t, err)
				require.Equal(t, n, r.Devices)
				require.Greater(t, r.MaxAbsParam, 0.0)
				require.LessOrEqual(t, r.MaxAbsDiff, 1e-5*(1+r.MaxAbsParam), "%+v", r)
				require.InDelta(t, r.SingleLoss, r.Loss, 1e-5*(1+r.SingleLoss))
				require.Len(t, r.PeakDeviceBytes, n)
				switch mode {
				case "dp":
					require.Positive(t, r.Collectives["all_reduce"], "%v", r.Collectives)
					require.Zero(t, r.Collectives["all_gather"], "%v", r.Collectives)
				case "tp":
					require.Equal(t, map[string]int{"all_reduce": 2}, r.ForwardCollectives)
					require.Less(t, r.PerDevice.Argument, r.Single.Argument)
				case "fsdp":
					// The arguments are 1/n of the parameters and state, plus
					// 1/n of the batch and Adam's count.
					require.LessOrEqual(t, r.PerDevice.Argument, (r.ParamBytes+r.StateBytes)/int64(n)+512, "%+v", r)
					require.Positive(t, r.Collectives["reduce_scatter"], "%v", r.Collectives)
					require.Positive(t, r.Collectives["all_gather"], "%v", r.Collectives)
					require.Less(t, r.PerDevice.Total, r.Single.Total)
				}
			})
		}
	}
}

// TestFSDPUnderBudget trains the FSDP model on 4 devices without a budget
// and under budgets per device (-budget) of 0.8 and 0.5 of its per-device
// total: the plan fits the budget, every device's measured peak stays
// within the per-device analysis, and the parameters match the one-device
// run.
func TestFSDPUnderBudget(t *testing.T) {
	if inJob {
		t.Skip("in an MPI job: TestMPIModes trains over the job's devices")
	}
	defer func(f float64) { BudgetFraction = f }(BudgetFraction)
	for _, frac := range []float64{0, 0.8, 0.5} {
		t.Run(fmt.Sprint(frac), func(t *testing.T) {
			BudgetFraction = frac
			r, err := Run("fsdp", 4, 2, testSizes)
			require.NoError(t, err)
			require.LessOrEqual(t, r.MaxAbsDiff, 1e-5*(1+r.MaxAbsParam), "%+v", r)
			require.InDelta(t, r.SingleLoss, r.Loss, 1e-5*(1+r.SingleLoss))
			require.Len(t, r.PeakDeviceBytes, 4)
			// The CPU pools allocate in 64-byte units: the few buffers a
			// step allocates (its arena, the outputs no donated argument
			// takes: the loss) round up, by less than 64 bytes each.
			const rounding = 8 * 64
			for d, p := range r.PeakDeviceBytes {
				require.LessOrEqual(t, p, r.PerDevice.Total+rounding, "device %d's measured peak", d)
			}
			if frac == 0 {
				require.Zero(t, r.Budget)
				return
			}
			require.Equal(t, int64(frac*float64(r.Unconstrained)), r.Budget)
			require.LessOrEqual(t, r.PerDevice.Total, r.Budget, "%+v", r)
		})
	}
}
