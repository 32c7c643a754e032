package passes

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// TestGreedyCopiesOutEarly: when a device→host copy and another op free the
// same device bytes, the copy runs first (it allocates no device memory and
// can overlap with compute); the traced order would run the add first.
func TestGreedyCopiesOutEarly(t *testing.T) {
	f, err := ir.Parse(`func @f(%0: f32[256]) -> (f32[256]{pinned_host}, f32[]) {
  %1 = neg(%0) : f32[256]
  %2 = exp(%0) : f32[256]
  %3 = tanh(%1) : f32[256]
  %4 = add(%2, %3) : f32[256]
  %5 = reduce_sum(%4) {axes=[0]} : f32[]
  %6 = device_put(%2) {space=#pinned_host} : f32[256]{pinned_host}
  return %6, %5
}`)
	require.NoError(t, err)
	var got []string
	for _, op := range greedyOrder(f.Body, true) {
		got = append(got, op.Result().String())
	}
	require.Equal(t, []string{"%1", "%3", "%2", "%6", "%4", "%5"}, got)
}

// TestGreedyCopyInWithReader: a host→device copy is emitted with its first
// reader, and the bytes it allocates count in that reader's score: the
// product that reads the copy allocates a full array net, so the sum that
// allocates a scalar runs first.
func TestGreedyCopyInWithReader(t *testing.T) {
	f, err := ir.Parse(`func @f(%0: f32[256], %1: f32[256]{pinned_host}) -> (f32[], f32[]) {
  %2 = device_put(%1) {space=#device} : f32[256]
  %3 = mul(%2, %0) : f32[256]
  %4 = reduce_sum(%3) {axes=[0]} : f32[]
  %5 = reduce_sum(%0) {axes=[0]} : f32[]
  return %4, %5
}`)
	require.NoError(t, err)
	var got []string
	for _, op := range greedyOrder(f.Body, true) {
		got = append(got, op.Result().String())
	}
	require.Equal(t, []string{"%5", "%2", "%3", "%4"}, got)
}
