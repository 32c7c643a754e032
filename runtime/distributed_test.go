package runtime_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	rt "github.com/ferryml/ferry/runtime"
)

// TestJobOfOneProcess checks that without mpirun a process is a job of one:
// InitDistributed with no communicator changes nothing, and every device is
// local, of process 0.
func TestJobOfOneProcess(t *testing.T) {
	t.Setenv("OMPI_COMM_WORLD_SIZE", "")
	t.Setenv("OMPI_COMM_WORLD_RANK", "")
	t.Setenv("PMIX_RANK", "")
	t.Setenv("PMI_RANK", "")
	withDevices(t, 3)
	require.NoError(t, rt.InitDistributed(rt.DistributedConfig{}))
	require.NoError(t, rt.ShutdownDistributed())
	require.Equal(t, 1, rt.ProcessCount())
	require.Equal(t, 0, rt.ProcessIndex())
	require.Len(t, rt.Devices(), 3)
	require.Equal(t, rt.Devices(), rt.LocalDevices())
	for i, d := range rt.Devices() {
		require.Equal(t, i, d.ID)
		require.Zero(t, d.Process)
	}
}
