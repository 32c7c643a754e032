package passes

import (
	"fmt"
	"strings"
)

// String is the plan's text form, for tests and FERRY_DUMP_IR: per block its
// slots (value, type, buffer), then its steps, one per line as
// "outs = kind op(args)", with a kernel's programs (nodes with their views)
// and a loop's bindings and nested blocks indented below; then the results
// that take over a donated parameter or are copies.
func (e *Exec) String() string {
	var p execPrinter
	p.block(e.Top, 0)
	for i, o := range e.Outputs {
		switch {
		case o.Alias >= 0:
			p.line(0, "result %d = s%d in donated param %d", i, o.Slot, o.Alias)
		case o.Copy:
			p.line(0, "result %d = copy of s%d", i, o.Slot)
		}
	}
	return p.String()
}

// execPrinter writes the text form.
type execPrinter struct{ strings.Builder }

func (p *execPrinter) line(depth int, format string, args ...any) {
	p.WriteString(strings.Repeat("  ", depth))
	fmt.Fprintf(p, format, args...)
	p.WriteByte('\n')
}

func slotList(s []int) string {
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = fmt.Sprintf("s%d", x)
	}
	return strings.Join(parts, ", ")
}

func (p *execPrinter) block(b *Block, d int) {
	p.line(d, "block params(%s) results(%s) arena %d/%d", slotList(b.Params), slotList(b.Results), b.Plan.Arena[0], b.Plan.Arena[1])
	for s, sl := range b.Slots {
		p.line(d+1, "s%d %v %v: %s", s, sl.Value, sl.Value.Type, bufString(sl.Buf))
	}
	for i := range b.Steps {
		p.step(&b.Steps[i], d+1)
	}
	p.schedule(&b.Schedule, d+1)
}

// schedule prints the steps that do not simply run on the compute queue in
// order ("step 3 on to_device waits 1, 2 record"), the final waits, the
// prefetches and the carried collectives; nothing when there are none.
func (p *execPrinter) schedule(sc *Schedule, d int) {
	var lines []string
	for i, ss := range sc.Steps {
		if ss.Queue == QueueCompute && len(ss.Wait) == 0 && !ss.Record && !ss.Prefetched {
			continue
		}
		l := fmt.Sprintf("step %d on %v", i, ss.Queue)
		if len(ss.Wait) > 0 {
			l += " waits " + intList(ss.Wait)
		}
		if ss.Record {
			l += " record"
		}
		if ss.Prefetched {
			l += " prefetched"
		}
		lines = append(lines, l)
	}
	if len(sc.Final) > 0 {
		lines = append(lines, "final waits "+intList(sc.Final))
	}
	for _, pf := range sc.Prefetch {
		l := fmt.Sprintf("prefetch step %d (param %d) after step %d", pf.Step, pf.Param, pf.After)
		if len(pf.Wait) > 0 {
			l += " waits " + intList(pf.Wait)
		}
		lines = append(lines, l)
	}
	for _, c := range sc.Carried {
		lines = append(lines, fmt.Sprintf("carry step %d to the next iteration, waited before step %d", c.Step, c.Before))
	}
	if len(lines) == 0 {
		return
	}
	p.line(d, "schedule")
	for _, l := range lines {
		p.line(d+1, "%s", l)
	}
}

func intList(s []int) string {
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ", ")
}

func (p *execPrinter) step(st *Step, d int) {
	name := st.Op.Info().Name
	switch st.Kind {
	case StepKernel:
		name = "fusion " + st.Kernel.Mode.String()
	case StepCopy:
		name = fmt.Sprintf("%v->%v", st.From, st.To)
	}
	p.line(d, "%s = %v %s(%s)", slotList(st.Outs), st.Kind, name, slotList(st.Args))
	switch {
	case st.Kernel != nil:
		p.kernel(st.Kernel, d+1)
	case st.Matmul != nil:
		p.matmul(st.Matmul, d+1)
	case st.Loop != nil:
		p.loop(st.Loop, d+1)
	case st.Collective != nil:
		p.collective(st.Collective, d+1)
	}
}

func (p *execPrinter) collective(c *Collective, d int) {
	l := fmt.Sprintf("axis %q size %d", c.Axis, c.Size)
	if c.Shape != nil {
		l += fmt.Sprintf(" shape %v dims %d/%d", c.Shape, c.Dim, c.Dim2)
	}
	if c.Reduction != "" {
		l += " " + c.Reduction
	}
	if c.Pairs != nil {
		l += fmt.Sprintf(" pairs %v", c.Pairs)
	}
	p.line(d, "%s", l)
	for _, t := range []struct {
		name string
		t    *Transpose
	}{{"pre", c.Pre}, {"post", c.Post}} {
		if t.t != nil {
			p.line(d, "%s transpose %v by %v (staging %d/%d bytes)", t.name, t.t.Shape, t.t.Perm, c.Stage[0], c.Stage[1])
		}
	}
}

func (p *execPrinter) matmul(m *Matmul, d int) {
	p.line(d, "layout batch %v/%v contract %v/%v: %d x [%d x %d] . [%d x %d]",
		m.LhsBatch, m.RhsBatch, m.LhsContract, m.RhsContract, m.Batch, m.M, m.K, m.K, m.N)
}

func (p *execPrinter) kernel(k *Kernel, d int) {
	if k.Mode == KernelUnsupported {
		p.line(d, "unsupported: %s", k.Why)
		return
	}
	if k.Dot != nil {
		p.line(d, "dot of arg%d, arg%d into result %d", k.DotArgs[0], k.DotArgs[1], k.DotResult)
		p.matmul(k.Matmul, d+1)
	}
	for _, pr := range k.Programs {
		p.line(d, "program of %d elements", pr.Size)
		for i, nd := range pr.Nodes {
			inv := ""
			if nd.Invariant {
				inv = " invariant"
			}
			switch nd.Kind {
			case NodeLeaf:
				p.line(d+1, "n%d %v = arg%d view %v%s", i, nd.DType, nd.Operand, nd.View, inv)
			case NodeConst:
				p.line(d+1, "n%d %v = const[%d bytes] view %v%s", i, nd.DType, len(nd.Data), nd.View, inv)
			case NodeDot:
				p.line(d+1, "n%d %v = dot", i, nd.DType)
			case NodeOp:
				args := make([]string, len(nd.Args))
				for j, a := range nd.Args {
					args[j] = fmt.Sprintf("n%d", a)
				}
				p.line(d+1, "n%d %v = %s(%s)%s", i, nd.DType, nd.Code.Info().Name, strings.Join(args, ", "), inv)
			case NodeIndexed:
				p.line(d+1, "n%d %v = indexed %d pieces of args %v over %v view %v", i, nd.DType, len(nd.Index.Pieces), nd.Operands, nd.Index.Shape, nd.View)
			}
		}
		for _, r := range pr.Results {
			p.line(d+1, "result %d = n%d", r.Result, r.Node)
		}
		for _, r := range pr.Reduces {
			layout := "strided"
			switch {
			case r.Trailing:
				layout = "trailing"
			case r.Leading:
				layout = "leading"
			}
			p.line(d+1, "result %d = %s(n%d) %s, %d per output, %d outputs, out view %v",
				r.Result, r.Code.Info().Name, r.Node, layout, r.PerOutput, r.Outputs, r.Out)
		}
	}
}

func (p *execPrinter) loop(lp *Loop, d int) {
	p.line(d, "consts %d carry %d length %d reverse %v sub-arena at %d/%d", lp.Consts, lp.Carry, lp.Length, lp.Reverse, lp.SubOffset[0], lp.SubOffset[1])
	for _, m := range lp.Init {
		p.line(d, "init out%d <- arg%d", m.Out, m.Arg)
	}
	for i, b := range lp.Params {
		switch b.Kind {
		case BindArg:
			p.line(d, "param %d <- arg%d", i, b.Arg)
		case BindOut:
			p.line(d, "param %d <- out%d", i, b.Out)
		case BindSlice:
			p.line(d, "param %d <- arg%d slice i*%d", i, b.Arg, b.Stride)
		}
	}
	for i, r := range lp.Results {
		dst := fmt.Sprintf("out%d", r.Out)
		if r.Stride != 0 {
			dst += fmt.Sprintf(" slice i*%d", r.Stride)
		}
		switch {
		case r.InPlace:
			dst += " (in place)"
		case r.Stage:
			dst += " (staged)"
		}
		p.line(d, "result %d -> %s", i, dst)
	}
	for _, b := range lp.Blocks {
		p.block(b, d)
	}
}
