package cpu

import (
	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
)

// MemoryMap lists the chunks of the bfc allocator of the pool of space on
// device dev in address order, each used chunk with the allocation holding
// it (backend.MemoryMap); false for the platform allocator.
func (cpuBackend) MemoryMap(dev int, space ir.MemorySpace) ([]backend.Block, bool) {
	p, err := memPools.set().pool(dev, space)
	if err != nil {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bfc == nil {
		return nil, false
	}
	owner := map[*bfcChunk]*allocRecord{}
	for r := range p.l.All() {
		if r.chunk != nil {
			owner[r.chunk] = r
		}
	}
	var out []backend.Block
	for _, reg := range p.bfc.a.Regions() {
		for c := reg.First(); c != nil; c = c.Next() {
			b := backend.Block{Region: reg.ID, Offset: c.Off, Size: c.Size, Free: c.IsFree()}
			if r := owner[c]; r != nil {
				b.What, b.Site = r.What, p.l.Site(r)
				if r.IsArray {
					b.What = r.Type.String()
				}
			}
			out = append(out, b)
		}
	}
	return out, true
}
