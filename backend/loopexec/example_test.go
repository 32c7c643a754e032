package loopexec_test

import (
	"fmt"

	"github.com/ferryml/ferry/backend/loopexec"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// bytesMem is memory of byte slices.
type bytesMem struct{}

func (bytesMem) Slice(l []byte, off, n int64) []byte { return l[off : off+n] }
func (bytesMem) Copy(dst, src []byte, n int64) error { copy(dst[:n], src[:n]); return nil }
func (bytesMem) Stage(_ int, src []byte, n int64) ([]byte, error) {
	return append([]byte(nil), src[:n]...), nil
}
func (bytesMem) Predicate(l []byte) (bool, error) { return l[0] != 0, nil }

// sumBody is a scan body: carry c, xs slice x; it returns c+x as the carry
// and as the ys.
type sumBody struct{ c, x, out []byte }

func (b *sumBody) Bind(j int, l []byte) {
	if j == 0 {
		b.c = l
	} else {
		b.x = l
	}
}
func (b *sumBody) BindNext(int, []byte, bool) {}
func (b *sumBody) BindYs(int, []byte)         {}
func (b *sumBody) Run() error                 { b.out[0] = b.c[0] + b.x[0]; return nil }
func (b *sumBody) Result(int) ([]byte, error) { return b.out, nil }
func (b *sumBody) End(bool) error             { return nil }

// A running sum as a scan: the runner binds the carry and each xs slice,
// runs the body, and copies its result into the carry and the ys slice.
func ExampleRun() {
	b := &passes.Block{Slots: []passes.Slot{{Bytes: 1}}, Results: []int{0, 0}}
	lp := &passes.Loop{Code: ir.Scan, Length: 4, Carry: 1, Blocks: []*passes.Block{b},
		Init:    []passes.Move{{Arg: 0, Out: 0}},
		Params:  []passes.ParamBind{{Kind: passes.BindOut, Out: 0}, {Kind: passes.BindSlice, Arg: 1, Stride: 1}},
		Results: []passes.ResultBind{{Out: 0}, {Out: 1, Stride: 1}}}
	op := &ir.Op{Results: []*ir.Value{{Type: ir.TypeOf(ir.Uint8)}, {Type: ir.TypeOf(ir.Uint8, 4)}}}
	st := &passes.Step{Kind: passes.StepLoop, Op: op, Loop: lp}
	carry, ys := []byte{0}, make([]byte, 4)
	body := &sumBody{out: []byte{0}}
	err := loopexec.Run(st, bytesMem{}, [][]byte{{10}, {1, 2, 3, 4}}, [][]byte{carry, ys}, func(int) loopexec.Block[[]byte] { return body })
	fmt.Println(carry, ys, err)
	// Output: [20] [11 13 16 20] <nil>
}
