package passes_test

import (
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// An iota of a float dtype split along its counted dimension holds, on
// every device, exactly the values of the whole iota: each index rounded
// once to the dtype. bf16 and f16 do not hold every device offset (bf16
// rounds 3·141 = 423 to 424), so an offset added in the dtype gave other
// values (found by the sharded differential test, internal/testkit/difftest).
func TestPartitionIotaFloatOffset(t *testing.T) {
	src := `func @f() -> (bf16[1128]@S[{x,y}], f16[4,4104]@S[{},{x,y}], f32[16,8]@S[x,y]) {
  %0 = iota() {dim=0, dtype=bf16, shape=[1128]} : bf16[1128]@S[{x,y}]
  %1 = iota() {dim=1, dtype=f16, shape=[4,4104]} : f16[4,4104]@S[{},{x,y}]
  %2 = iota() {dim=0, dtype=f32, shape=[16,8]} : f32[16,8]@S[x,y]
  return %0, %1, %2
}`
	src = shardMacro.ReplaceAllString(src, "{sharding<"+shardMesh+", $1>}")
	f := parse(t, src)
	part, err := passes.Partition(f)
	require.NoError(t, err)
	whole := ir.Clone(f)
	stripShardings(whole.Body)
	want, err := eval.Run(whole, nil)
	require.NoError(t, err)
	got := spmdRun(t, part, whole, nil)
	for i := range want {
		for j := range want[i].Type.Size() {
			require.Equal(t, want[i].Float64At(j), got[i].Float64At(j), "result %d (%v) element %d\nper device:\n%s", i, want[i].Type, j, part.Func)
		}
	}
}
