package loopexec_test

import (
	"bytes"
	"testing"

	"github.com/ferryml/ferry/backend/loopexec"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// mem is byte-slice memory with a staging buffer per result.
type mem struct{ stage map[int][]byte }

func (m *mem) Slice(l []byte, off, n int64) []byte { return l[off : off+n] }
func (m *mem) Copy(dst, src []byte, n int64) error {
	copy(dst[:n], src[:n])
	return nil
}
func (m *mem) Stage(j int, src []byte, n int64) ([]byte, error) {
	m.stage[j] = append([]byte(nil), src[:n]...)
	return m.stage[j], nil
}
func (m *mem) Predicate(l []byte) (bool, error) { return l[0] != 0, nil }

// swapBody is a scan body of two carries c0, c1 (2 bytes each) and an xs
// slice x (2 bytes): it computes ys y = c0·x into its slice and c0 += x in
// place, and returns (c1, c0) as the carries, each in the other's
// destination (both staged). It records the next slices it is given.
type swapBody struct {
	params [3][]byte
	ys     []byte
	next   [][]byte
}

func (b *swapBody) Bind(j int, l []byte) { b.params[j] = l }
func (b *swapBody) BindNext(j int, l []byte, ok bool) {
	if j == 2 && ok {
		b.next = append(b.next, append([]byte(nil), l...))
	}
}
func (b *swapBody) BindYs(j int, l []byte) { b.ys = l }
func (b *swapBody) Run() error {
	c0, x := b.params[0], b.params[2]
	for i := range 2 {
		b.ys[i] = c0[i] * x[i]
		c0[i] += x[i]
	}
	return nil
}
func (b *swapBody) Result(j int) ([]byte, error) {
	return [][]byte{b.params[1], b.params[0], b.ys}[j], nil
}
func (b *swapBody) End(bool) error { return nil }

// block is a passes.Block with 3 results of 2 bytes each (the sizes the
// runner reads).
func block() *passes.Block {
	v := &ir.Value{Type: ir.TypeOf(ir.Uint8, 2)}
	return &passes.Block{Slots: []passes.Slot{{Value: v, Bytes: 2}}, Results: []int{0, 0, 0}}
}

// A reverse scan with a staged swap of carries, an in-place ys, and next slices
// for prefetches: the runner's carries, ys and next slices are those of a
// direct loop over the definition.
func TestScan(t *testing.T) {
	rng := testseed.Rand(t, 1)
	const n = 4
	xs := make([]byte, 2*n)
	init := make([]byte, 4)
	for i := range xs {
		xs[i] = byte(rng.IntN(5))
	}
	for i := range init {
		init[i] = byte(rng.IntN(5))
	}
	op := &ir.Op{Results: []*ir.Value{{Type: ir.TypeOf(ir.Uint8, 2)}, {Type: ir.TypeOf(ir.Uint8, 2)}, {Type: ir.TypeOf(ir.Uint8, n, 2)}}}
	lp := &passes.Loop{Code: ir.Scan, Length: n, Reverse: true, Carry: 2, Blocks: []*passes.Block{block()},
		Init:    []passes.Move{{Arg: 0, Out: 0}, {Arg: 1, Out: 1}},
		Params:  []passes.ParamBind{{Kind: passes.BindOut, Out: 0}, {Kind: passes.BindOut, Out: 1}, {Kind: passes.BindSlice, Arg: 2, Stride: 2}},
		Results: []passes.ResultBind{{Out: 0, Stage: true}, {Out: 1, Stage: true}, {Out: 2, Stride: 2, InPlace: true}}}
	st := &passes.Step{Kind: passes.StepLoop, Op: op, Loop: lp}
	outs := [][]byte{make([]byte, 2), make([]byte, 2), make([]byte, 2*n)}
	body := &swapBody{}
	m := &mem{stage: map[int][]byte{}}
	err := loopexec.Run(st, m, [][]byte{init[:2], init[2:], xs}, outs, func(int) loopexec.Block[[]byte] { return body })
	require.NoError(t, err)
	c0, c1 := append([]byte(nil), init[:2]...), append([]byte(nil), init[2:]...)
	ys := make([]byte, 2*n)
	var next [][]byte
	for it := range n {
		i := n - 1 - it
		x := xs[2*i : 2*i+2]
		s := []byte{c0[0] + x[0], c0[1] + x[1]}
		ys[2*i], ys[2*i+1] = c0[0]*x[0], c0[1]*x[1]
		c0, c1 = c1, s
		if it+1 < n {
			next = append(next, xs[2*(i-1):2*i])
		}
	}
	require.Equal(t, [][]byte{c0, c1, ys}, outs)
	require.Equal(t, next, body.next)
	require.Len(t, m.stage, 2, "the swapped carries are staged")
}

// predBlock returns a fixed boolean.
type predBlock struct {
	ran *string
	tag string
	out []byte
}

func (b predBlock) Bind(int, []byte)           {}
func (b predBlock) BindNext(int, []byte, bool) {}
func (b predBlock) BindYs(int, []byte)         {}
func (b predBlock) Run() error                 { *b.ran += b.tag; return nil }
func (b predBlock) Result(int) ([]byte, error) { return b.out, nil }
func (b predBlock) End(bool) error             { return nil }

// A cond runs the branch its predicate picks and copies that branch's
// result into the op's.
func TestCond(t *testing.T) {
	for _, pred := range []bool{true, false} {
		var ran string
		blk := &passes.Block{Slots: []passes.Slot{{Bytes: 1}}, Results: []int{0}}
		lp := &passes.Loop{Code: ir.Cond, Blocks: []*passes.Block{blk, blk}, Results: []passes.ResultBind{{Out: 0}}}
		st := &passes.Step{Kind: passes.StepLoop, Op: &ir.Op{}, Loop: lp}
		out := []byte{0}
		p := []byte{0}
		if pred {
			p[0] = 1
		}
		branches := []predBlock{{&ran, "T", []byte{7}}, {&ran, "F", []byte{9}}}
		err := loopexec.Run(st, &mem{}, [][]byte{p}, [][]byte{out}, func(k int) loopexec.Block[[]byte] { return branches[k] })
		require.NoError(t, err)
		want, wantOut := "F", byte(9)
		if pred {
			want, wantOut = "T", 7
		}
		require.Equal(t, want, ran)
		require.True(t, bytes.Equal([]byte{wantOut}, out))
	}
}
