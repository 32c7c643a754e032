package runtime

import (
	"fmt"
	"sync"

	"github.com/ferryml/ferry/ir"
)

// cpuBuffer is a host literal; it can be deleted (donated or freed).
type cpuBuffer struct {
	mu      sync.Mutex
	lit     *ir.Literal
	typ     ir.Type
	deleted string
}

func newCPUBuffer(l *ir.Literal) *cpuBuffer { return &cpuBuffer{lit: l, typ: l.Type} }

func (b *cpuBuffer) Type() ir.Type { return b.typ }

func (b *cpuBuffer) Literal() (*ir.Literal, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lit == nil {
		return nil, fmt.Errorf("array %v was %s", b.typ, b.deleted)
	}
	return b.lit, nil
}
