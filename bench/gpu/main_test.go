package main

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// The traced transformer step returns, first, one result per donated
// parameter with that parameter's type (the benchmark feeds result k back
// as donated argument k), then the scalar loss; the initial literals match
// the parameters; and the pass pipeline compiles it with donation.
func TestTransformerStep(t *testing.T) {
	f, donated, lits, err := transformerStep()
	if err != nil {
		t.Fatal(err)
	}
	ps, rs := f.Body.Params, f.Body.Results
	var idx []int
	for i, d := range donated {
		if d {
			idx = append(idx, i)
		}
	}
	c := transformerConfig
	if len(idx) == 0 || len(rs) != len(idx)+1 {
		t.Fatalf("%d donated parameters, %d results", len(idx), len(rs))
	}
	for k, i := range idx {
		if !rs[k].Type.Equal(ps[i].Type) {
			t.Fatalf("result %d is %v, donated parameter %d is %v", k, rs[k].Type, i, ps[i].Type)
		}
	}
	if loss := rs[len(rs)-1].Type; loss.Rank() != 0 || loss.DType != ir.Float32 {
		t.Fatalf("last result %v, want the f32 loss", loss)
	}
	for i, l := range lits {
		if !l.Type.Equal(ps[i].Type) {
			t.Fatalf("literal %d is %v, parameter %v", i, l.Type, ps[i].Type)
		}
	}
	// x and y follow the donated leaves.
	x := ps[len(idx)].Type
	if x.DType != ir.Int32 || !x.Shape.Equal(ir.Shape{c.Batch, c.Seq}) {
		t.Fatalf("x is %v, want i32[%d,%d]", x, c.Batch, c.Seq)
	}
	prog, err := passes.Compile(f, passes.Options{Donated: donated})
	if err != nil {
		t.Fatal(err)
	}
	if prog.Analysis.AliasBytes == 0 {
		t.Error("no donated buffer reused")
	}
}
