package eval

import (
	"strings"
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
	ir.ShardingConstraint:  testShardingConstraint,
	ir.Scan:                testScan,
	ir.While:               testWhile,
	ir.Cond:                testCond,
	ir.Fusion:              testFusion,
}

// testCollective checks that eval refuses a collective op with the error
// naming its axis and location: collectives have no meaning on one device
// (trace.Vmap rewrites them into ordinary ops; ShardMap's per-device programs
// will run them through package collective, not through eval).
func testCollective(t *testing.T, code ir.Code) {
	f := ir.NewFunc(code.String())
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 2, 4))
	attrs := ir.Attrs{"axis": "batch", "size": 2}
	args := []*ir.Value{x}
	switch code {
	case ir.AllReduce:
		attrs["reduction"] = "sum"
	case ir.AllGather, ir.ReduceScatter:
		attrs["dimension"] = 0
	case ir.AllToAll:
		attrs["split_dimension"], attrs["concat_dimension"] = 1, 0
	case ir.CollectivePermute:
		attrs["pairs"] = []int{0, 1}
	case ir.AxisIndex:
		args = nil
	}
	op, err := f.Body.AddOp(code, args, attrs)
	if err != nil {
		t.Fatal(err)
	}
	op.Loc = "model.go:3"
	f.Body.Results = op.Results
	markTested(t, f)
	lit := ir.NewLiteral(ir.TypeOf(ir.Float32, 2, 4))
	_, err = Run(f, []*ir.Literal{lit})
	if err == nil || !strings.Contains(err.Error(), `unbound axis name "batch"`) || !strings.Contains(err.Error(), "model.go:3") {
		t.Errorf("%v: got error %v, want one naming the unbound axis and the location", code, err)
	}
}

func init() {
	for _, c := range ir.AllCodes() {
		if c.IsCollective() {
			opTests[c] = func(t *testing.T) { testCollective(t, c) }
		}
	}
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
