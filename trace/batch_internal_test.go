package trace

import (
	"testing"

	"github.com/ferryml/ferry/ir"
)

// TestBatchRuleCoverage fails when an op of the op table has no batching
// rule, naming the ops: Vmap of a function using such an op panics with
// "no batching rule". (The per-op checks of the rules against a loop over the
// examples are TestVmapOps in batch_test.go.)
func TestBatchRuleCoverage(t *testing.T) {
	var missing []string
	for _, code := range ir.AllCodes() {
		if batchRules[code] == nil {
			missing = append(missing, code.String())
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d ops have no batching rule in batchRules: %v", len(missing), missing)
	}
}
