package mpi

import (
	"context"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

const (
	u64 = ir.Int64
	i32 = ir.Int32
)

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func TestMPISmoke(t *testing.T) {
	w := jobWorld(t)
	b := alloc(8)
	*(*float64)(ptr(b)) = float64(w.Rank() + 1)
	if err := w.AllReduce(context.Background(), collective.Sum, ir.Float64, b, b); err != nil {
		t.Fatal(err)
	}
	n := w.Size()
	if got := *(*float64)(ptr(b)); got != float64(n*(n+1)/2) {
		t.Fatalf("sum %v", got)
	}
}
