package eval

import (
	"testing"

	"github.com/ferryml/ferry/ir"
)

// opTests maps every op code to the test that checks its kernel against an
// independent reference.
var opTests = map[ir.Code]func(*testing.T){
	ir.Constant:            testConstant,
	ir.Iota:                testIota,
	ir.Select:              testSelect,
	ir.Convert:             testConvert,
	ir.BitcastConvert:      testBitcast,
	ir.BroadcastInDim:      testBroadcastInDim,
	ir.Reshape:             testReshape,
	ir.Transpose:           testTranspose,
	ir.Slice:               testSlice,
	ir.DynamicSlice:        testDynamicSlice,
	ir.DynamicUpdateSlice:  testDynamicUpdateSlice,
	ir.Concatenate:         testConcatenate,
	ir.Pad:                 testPad,
	ir.Gather:              testGather,
	ir.ScatterAdd:          testScatterAdd,
	ir.ArgMax:              func(t *testing.T) { testArg(t, ir.ArgMax) },
	ir.ArgMin:              func(t *testing.T) { testArg(t, ir.ArgMin) },
	ir.DotGeneral:          testDot,
	ir.Sort:                testSort,
	ir.DevicePut:           testDevicePut,
	ir.CheckpointName:      testCheckpointName,
	ir.OptimizationBarrier: testOptimizationBarrier,
	ir.Scan:                testScan,
	ir.While:               testWhile,
	ir.Cond:                testCond,
	ir.Fusion:              testFusion,
}

func init() {
	for c := range unaryCases {
		opTests[c] = func(t *testing.T) { testUnary(t, c) }
	}
	for c := range binaryCases {
		opTests[c] = func(t *testing.T) { testBinary(t, c) }
	}
	for c := range compareRefs {
		opTests[c] = func(t *testing.T) { testCompare(t, c) }
	}
	for _, c := range []ir.Code{ir.ReduceSum, ir.ReduceMax, ir.ReduceMin, ir.ReduceProd} {
		opTests[c] = func(t *testing.T) { testReduce(t, c) }
	}
}

// TestOps walks every op code: each must have a test, and that test must
// actually execute the op.
func TestOps(t *testing.T) {
	for _, c := range ir.AllCodes() {
		fn, ok := opTests[c]
		if !ok {
			t.Errorf("op %v has no eval test", c)
			continue
		}
		t.Run(c.String(), func(t *testing.T) {
			t.Parallel()
			fn(t)
			if !t.Failed() && !ranCode(t, c) {
				t.Errorf("the test of %v never ran it", c)
			}
		})
	}
}
