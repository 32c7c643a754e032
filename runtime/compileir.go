package runtime

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// CompileIR compiles f, a function written as IR (built with package ir or
// parsed by ir.Parse) rather than traced from Go, with the default backend,
// as a jitted function is compiled: when a value of f has a sharding (a
// parameter, an annotated op result), f is partitioned over the sharding's
// mesh (passes.Partition) and runs on every device of the mesh. It is for
// tools and tests that generate programs.
//
// f must verify (ir.Verify) and must not be changed afterwards. Call the
// result with one concrete array per parameter of f, of the parameter's
// type, sharding included (lay a sharded parameter's array out with
// DevicePut); the call returns one *trace.Array per result of f, sharded as
// the partitioner lays the result out.
func CompileIR(f *ir.Func) (*Compiled, error) {
	if err := ir.Verify(f); err != nil {
		return nil, fmt.Errorf("rt.CompileIR: %w", err)
	}
	l := &Lowered{Func: f, numArgs: len(f.Body.Params)}
	l.argDefs = make([]*trace.TreeDef, len(f.Body.Params))
	for i := range l.argDefs {
		l.argDefs[i] = arrayDef
	}
	l.outDefs = make([]*trace.TreeDef, len(f.Body.Results))
	for i := range l.outDefs {
		l.outDefs[i] = arrayDef
	}
	exe, err := l.compile()
	if err != nil {
		return nil, fmt.Errorf("rt.CompileIR: @%s: %w", f.Name, err)
	}
	return &Compiled{entry: &entry{lowered: l, exe: exe, outDefs: l.outDefs}}, nil
}
