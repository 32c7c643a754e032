package cpuexec

import (
	"github.com/ferryml/ferry/cpu/vmath"
)

// compileChain compiles the block program's f32 op chain (p.code) to
// machine code with vmath.CompileChain, where the CPU and the JIT switch
// (FERRY_CPU_JIT) allow: every op's result stays in registers while later
// ops read it and only the values read outside the chain (results and
// reduction operands) are stored. Invariant nodes (computed once per worker,
// their block filled with one value) are passed as uniform inputs. It
// returns nil when the chain cannot be compiled: vmath.RunProgram and the
// kernels run the program then.
func compileChain(p *blockProg) *vmath.Chain {
	if p.code == nil || !vmath.JITAvailable() {
		return nil
	}
	keep := make([]bool, len(p.nodes))
	for _, rn := range p.results {
		keep[rn[1]] = true
	}
	for _, fr := range p.reduces {
		keep[fr.node] = true
	}
	code := make([]vmath.Instr, len(p.code))
	for i, in := range p.code {
		in.Op &^= vmath.AccA | vmath.AccB | vmath.NoStore
		if !keep[in.Dst] {
			in.Op |= vmath.NoStore
		}
		code[i] = in
	}
	uniform := make([]bool, len(p.nodes))
	for i := range p.nodes {
		uniform[i] = p.nodes[i].invariant
	}
	ch, err := vmath.CompileChain(code, len(p.nodes), uniform)
	if err != nil {
		return nil
	}
	return ch
}
