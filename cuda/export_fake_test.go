//go:build linux && (amd64 || arm64)

package cuda

import "testing"

// FakeRanksForTest gives the external tests (package cuda_test, which may
// import cuda/nccl) n backends over one fake driver that runs the kernels
// it launches (see fakeRanks).
func FakeRanksForTest(t *testing.T, n int) []*Backend {
	_, bs, _ := fakeRanks(t, n)
	return bs
}

// ComputeStreamForTest returns b's compute stream (a CUstream).
func (b *Backend) ComputeStreamForTest() uintptr { return b.streams[Compute] }

// CollectiveStreamForTest returns b's collective stream (a CUstream).
func (b *Backend) CollectiveStreamForTest() uintptr { return b.streams[Coll] }
