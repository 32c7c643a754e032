package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Mapping names the tensors of another tool's checkpoint (a Hugging Face
// model's, say) by the paths of a Go parameter tree, so that LoadMapped can
// read such a checkpoint into the tree and SaveMapped can write the tree
// back under the checkpoint's names. Package nn/hf has the mappings of
// nn.Bert, nn.GPT2 and nn.Llama.
type Mapping struct {
	// Rules map file tensors to tree leaves. A file tensor may match
	// several rules (a fused tensor split into several leaves).
	Rules []Rule
	// Ignore lists file tensors that are not loaded, as patterns in which
	// "*" matches any characters: buffers a model recomputes
	// ("*.position_ids"), heads the tree has no place for ("cls.*").
	Ignore []string
	// Prefixes are prefixes a file's tensor names may carry, or lack,
	// beside the rules' names: with Prefixes ["bert."], the rule
	// "embeddings.word_embeddings.weight" also matches
	// "bert.embeddings.word_embeddings.weight", and with ["transformer."]
	// the rule "transformer.wte.weight" also matches "wte.weight". SaveMapped
	// writes the rules' names.
	Prefixes []string
}

// Rule maps the file tensors whose names match File to the tree leaves
// that Tree names.
//
// File and Tree are names with placeholders {i} (any {name}) standing for
// a decimal index, the same in both: the rule
//
//	{File: "encoder.layer.{i}.attention.self.query.weight", Tree: "Encoder.Blocks.Attn.Q.W[{i}]"}
//
// loads "encoder.layer.3.attention.self.query.weight" into index 3 of the
// first axis of the leaf Encoder.Blocks.Attn.Q.W. An index in brackets
// after a leaf's path selects along its leading axes (the layer axis of
// nn.TransformerStack's stacked parameters); one inside the path is a
// slice element of the tree ("MLP.Layers[0].W").
type Rule struct {
	File string
	Tree string
	// Split, when Parts > 0, says that the file tensor is Parts equal parts
	// along Axis and that the rule maps part Part: GPT-2's fused c_attn
	// weight [D, 3D] is Q, K and V split along axis 1.
	Split Split
	// Transpose says that the leaf (a 2-D part) is the transpose of the
	// file tensor. Prefer a layout that makes it unnecessary
	// (nn.LayoutOutIn keeps PyTorch's [out, in] weights as stored).
	Transpose bool
}

// Split selects part Part of Parts equal parts along Axis of a file
// tensor.
type Split struct {
	Axis, Part, Parts int
}

// LoadOption changes what LoadMapped loads.
type LoadOption func(*loadOptions)

type loadOptions struct {
	ignore []string // file tensor patterns
	keep   []string // tree leaf patterns
}

// IgnoreTensors leaves the file tensors matching the patterns ("*" matches
// any characters) unloaded, besides the mapping's Ignore list.
func IgnoreTensors(patterns ...string) LoadOption {
	return func(o *loadOptions) { o.ignore = append(o.ignore, patterns...) }
}

// KeepLeaves lets the tree leaves whose paths match the patterns ("*"
// matches any characters, "[" and "]" are themselves) be missing from the
// file: they keep the arrays of like, which must be concrete.
func KeepLeaves(patterns ...string) LoadOption {
	return func(o *loadOptions) { o.keep = append(o.keep, patterns...) }
}

// placeholder is {name} in a rule's names.
var placeholder = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// compiledRule is a Rule with its names as regular expressions.
type compiledRule struct {
	Rule
	file, tree *regexp.Regexp
}

// compilePattern turns a name with placeholders into an anchored regular
// expression with a named group of digits per placeholder.
func compilePattern(s string) (*regexp.Regexp, []string, error) {
	var b strings.Builder
	var vars []string
	b.WriteString("^")
	last := 0
	for _, m := range placeholder.FindAllStringSubmatchIndex(s, -1) {
		b.WriteString(regexp.QuoteMeta(s[last:m[0]]))
		v := s[m[2]:m[3]]
		if slices.Contains(vars, v) {
			return nil, nil, fmt.Errorf("placeholder {%s} appears twice in %q", v, s)
		}
		vars = append(vars, v)
		b.WriteString(`(?P<` + v + `>0|[1-9][0-9]*)`)
		last = m[1]
	}
	b.WriteString(regexp.QuoteMeta(s[last:]) + "$")
	re, err := regexp.Compile(b.String())
	return re, vars, err
}

// globRE turns a pattern in which "*" matches any characters into a regular
// expression.
func globRE(patterns []string) *regexp.Regexp {
	if len(patterns) == 0 {
		return nil
	}
	alts := make([]string, len(patterns))
	for i, p := range patterns {
		alts[i] = strings.ReplaceAll(regexp.QuoteMeta(p), `\*`, ".*")
	}
	return regexp.MustCompile("^(?:" + strings.Join(alts, "|") + ")$")
}

func (m Mapping) compile() ([]compiledRule, error) {
	var errs []error
	rules := make([]compiledRule, len(m.Rules))
	for i, r := range m.Rules {
		fre, fv, err1 := compilePattern(r.File)
		tre, tv, err2 := compilePattern(r.Tree)
		if err := errors.Join(err1, err2); err != nil {
			errs = append(errs, fmt.Errorf("rule %d (%s → %s): %w", i, r.File, r.Tree, err))
			continue
		}
		slices.Sort(fv)
		slices.Sort(tv)
		if !slices.Equal(fv, tv) {
			errs = append(errs, fmt.Errorf("rule %d (%s → %s): the two names must hold the same placeholders", i, r.File, r.Tree))
		}
		if s := r.Split; s.Parts != 0 && (s.Parts < 2 || s.Part < 0 || s.Part >= s.Parts || s.Axis < 0) {
			errs = append(errs, fmt.Errorf("rule %d (%s → %s): invalid split: part %d of %d along axis %d", i, r.File, r.Tree, s.Part, s.Parts, s.Axis))
		}
		rules[i] = compiledRule{Rule: r, file: fre, tree: tre}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid mapping: %w", errors.Join(errs...))
	}
	return rules, nil
}

// substitute fills the placeholders of pattern from the groups of re's
// match m of a name.
func substitute(pattern string, re *regexp.Regexp, m []string) string {
	return placeholder.ReplaceAllStringFunc(pattern, func(p string) string {
		return m[re.SubexpIndex(p[1:len(p)-1])]
	})
}

// leafRef is a part of a leaf: the leaf and indices along its leading axes.
type leafRef struct {
	leaf int
	idx  []int
}

// leafTable resolves tree names to leaves.
type leafTable struct {
	paths  []string
	index  map[string]int
	leaves []*trace.Array
}

// resolve returns the leaf part that the tree name p names: a leaf's path,
// or one followed by indices along its leading axes.
func (t *leafTable) resolve(p string) (leafRef, error) {
	var idx []int
	s := p
	for {
		if i, ok := t.index[s]; ok {
			shape := t.leaves[i].Shape()
			if len(idx) > len(shape) {
				return leafRef{}, fmt.Errorf("%s indexes %d axes of %s, which is %v", p, len(idx), s, t.leaves[i].Type())
			}
			for k, j := range idx {
				if j >= shape[k] {
					return leafRef{}, fmt.Errorf("%s: index %d is out of range for axis %d of %s, which is %v", p, j, k, s, t.leaves[i].Type())
				}
			}
			return leafRef{leaf: i, idx: idx}, nil
		}
		if !strings.HasSuffix(s, "]") {
			return leafRef{}, fmt.Errorf("%s is not a leaf of the tree", p)
		}
		open := strings.LastIndexByte(s, '[')
		j, err := strconv.Atoi(s[open+1 : len(s)-1])
		if open < 0 || err != nil || j < 0 {
			return leafRef{}, fmt.Errorf("%s is not a leaf of the tree", p)
		}
		idx = append([]int{j}, idx...)
		s = s[:open]
	}
}

// String names the leaf part as the tree names it.
func (t *leafTable) name(r leafRef) string {
	var b strings.Builder
	b.WriteString(t.paths[r.leaf])
	for _, j := range r.idx {
		fmt.Fprintf(&b, "[%d]", j)
	}
	return b.String()
}

// filePart is the part of a file tensor a rule reads, its shape after the
// rule's transpose, or an error for a rule that does not fit the tensor.
func (r *compiledRule) filePart(shape []int) (region, []int, error) {
	reg := region{start: make([]int, len(shape)), limit: slices.Clone(shape), transpose: r.Transpose}
	if s := r.Split; s.Parts != 0 {
		if s.Axis >= len(shape) || shape[s.Axis]%s.Parts != 0 {
			return region{}, nil, fmt.Errorf("cannot split %v into %d equal parts along axis %d", shape, s.Parts, s.Axis)
		}
		n := shape[s.Axis] / s.Parts
		reg.start[s.Axis], reg.limit[s.Axis] = s.Part*n, (s.Part+1)*n
	}
	out := make([]int, len(shape))
	for k := range shape {
		out[k] = reg.limit[k] - reg.start[k]
	}
	if r.Transpose {
		if len(shape) != 2 {
			return region{}, nil, fmt.Errorf("cannot transpose %v: only 2-D tensors", shape)
		}
		out[0], out[1] = out[1], out[0]
	}
	return reg, out, nil
}

// write is one file tensor's part loaded into one leaf part.
type write struct {
	file string
	rule *compiledRule
	dst  leafRef
	reg  region
}

// LoadMapped reads the checkpoint r into a tree shaped like like through
// the mapping m: each file tensor goes where m's rules say, converted to the
// dtype of its leaf (F32, F16 and BF16 among each other, I64 and I32), and
// every leaf must be written exactly once. The tensors the file has and
// the mapping does not place (other than those m.Ignore or IgnoreTensors
// ignore), and the leaves the file does not fill (other than those
// KeepLeaves keeps), are listed in one error, with the names each missing
// leaf's rules expect. like's arrays give only dtypes, shapes and memory
// spaces: trace.Abstract arrays do, so that a model is never materialised
// twice. Each leaf's array is allocated once and each tensor read straight
// into its part of it (on the CPU backend into the array's own memory), so
// loading holds one copy of the parameters and, for tensors that are
// converted, split or transposed, a buffer of at most 1 MiB.
func LoadMapped[T any](r *Reader, like T, m Mapping, opts ...LoadOption) (T, error) {
	var z T
	leaves, def, err := loadMapped(r, like, m, opts)
	if err != nil {
		return z, fmt.Errorf("checkpoint.LoadMapped %s: %w", r.path, err)
	}
	return trace.UnflattenAs[T](def, leaves)
}

// LoadMappedFile is LoadMapped from the checkpoint at path (see Open).
func LoadMappedFile[T any](path string, like T, m Mapping, opts ...LoadOption) (T, error) {
	var z T
	r, err := Open(path)
	if err != nil {
		return z, err
	}
	defer r.Close()
	return LoadMapped(r, like, m, opts...)
}

// mappedLoad is the state of one LoadMapped: the compiled mapping, the
// leaves of like, the writes planned from the file's tensors, and the
// errors found on the way, reported together.
type mappedLoad struct {
	r      *Reader
	m      Mapping
	rules  []compiledRule
	def    *trace.TreeDef
	leaves []*trace.Array
	t      *leafTable
	// ignore matches the file tensors not loaded, keep the leaves that
	// may be missing from the file (nil: none).
	ignore, keep *regexp.Regexp

	writes []write
	// depth is, per leaf, the number of leading axes its writes index
	// (-1: not written).
	depth []int
	// by maps a leaf part's name to the file tensor writing it.
	by                     map[string]string
	unmapped, bad, missing []error
	// dests are the leaves' arrays being filled.
	dests []*dest
}

func loadMapped(r *Reader, like any, m Mapping, opts []LoadOption) ([]*trace.Array, *trace.TreeDef, error) {
	l, err := newMappedLoad(r, like, m, opts)
	if err != nil {
		return nil, nil, err
	}
	for _, name := range r.names {
		if l.ignore == nil || !l.ignore.MatchString(name) {
			l.plan(name)
		}
	}
	l.checkWrites()
	l.checkLeaves()
	if err := l.err(); err != nil {
		return nil, nil, err
	}
	out, err := l.read()
	if err != nil {
		return nil, nil, err
	}
	return out, l.def, nil
}

// newMappedLoad compiles m and flattens like.
func newMappedLoad(r *Reader, like any, m Mapping, opts []LoadOption) (*mappedLoad, error) {
	var o loadOptions
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	rules, err := m.compile()
	if err != nil {
		return nil, err
	}
	leaves, def, err := trace.Flatten(like)
	if err != nil {
		return nil, err
	}
	t := &leafTable{paths: def.Paths(), index: map[string]int{}, leaves: leaves}
	for i, p := range t.paths {
		t.index[p] = i
		if leaves[i].IsTraced() {
			return nil, fmt.Errorf("leaf %s of like is traced; load outside of traced functions", p)
		}
	}
	return &mappedLoad{
		r: r, m: m, rules: rules, def: def, leaves: leaves, t: t,
		ignore: globRE(append(slices.Clone(m.Ignore), o.ignore...)),
		keep:   globRE(o.keep),
	}, nil
}

// plan adds the writes of file tensor name: those of every rule matching
// the first of its candidate names that any rule matches.
func (l *mappedLoad) plan(name string) {
	ti, _ := l.r.Info(name)
	for _, cand := range candidates(name, l.m.Prefixes) {
		matched := false
		for i := range l.rules {
			rule := &l.rules[i]
			if sm := rule.file.FindStringSubmatch(cand); sm != nil {
				matched = true
				l.planRule(name, ti, rule, sm)
			}
		}
		if matched {
			return
		}
	}
	l.unmapped = append(l.unmapped, fmt.Errorf("file tensor %q (%s%v) is not mapped", name, ti.DType, ti.Shape))
}

// planRule adds the write of file tensor name by rule, whose file name
// matched as sm, or an error where the tensor does not fit its leaf.
func (l *mappedLoad) planRule(name string, ti TensorInfo, rule *compiledRule, sm []string) {
	tree := substitute(rule.Tree, rule.file, sm)
	ref, err := l.t.resolve(tree)
	if err != nil {
		l.bad = append(l.bad, fmt.Errorf("file tensor %q → %w", name, err))
		return
	}
	reg, shape, err := rule.filePart(ti.Shape)
	if err != nil {
		l.bad = append(l.bad, fmt.Errorf("file tensor %q (%s%v) → %s: %w", name, ti.DType, ti.Shape, tree, err))
		return
	}
	leaf := l.leaves[ref.leaf]
	want := leaf.Shape()[len(ref.idx):]
	if !slices.Equal(shape, []int(want)) {
		l.bad = append(l.bad, fmt.Errorf("file tensor %q (%s%v) → %s: the part is %v, the leaf's is %v (leaf %v)", name, ti.DType, ti.Shape, tree, shape, want, leaf.Type()))
		return
	}
	src, err := ti.Type()
	if err == nil {
		err = checkConvert(src.DType, leaf.DType())
	}
	if err != nil {
		l.bad = append(l.bad, fmt.Errorf("file tensor %q → %s: %w", name, tree, err))
		return
	}
	l.writes = append(l.writes, write{file: name, rule: rule, dst: ref, reg: reg})
}

// checkWrites records which leaf parts the writes fill, and an error for
// a leaf written whole and by parts or a part written twice.
func (l *mappedLoad) checkWrites() {
	l.depth = make([]int, len(l.leaves))
	for i := range l.depth {
		l.depth[i] = -1
	}
	l.by = map[string]string{}
	for _, w := range l.writes {
		d := &l.depth[w.dst.leaf]
		if *d >= 0 && *d != len(w.dst.idx) {
			l.bad = append(l.bad, fmt.Errorf("leaf %s is written whole and by parts (file tensor %q)", l.t.paths[w.dst.leaf], w.file))
			continue
		}
		*d = len(w.dst.idx)
		n := l.t.name(w.dst)
		if prev, dup := l.by[n]; dup {
			l.bad = append(l.bad, fmt.Errorf("leaf %s is written by file tensors %q and %q", n, prev, w.file))
			continue
		}
		l.by[n] = w.file
	}
}

// checkLeaves records the leaves, and the parts of leaves written by
// parts, that no write fills and KeepLeaves does not keep.
func (l *mappedLoad) checkLeaves() {
	t := l.t
	for i, p := range t.paths {
		if l.keep != nil && l.keep.MatchString(p) {
			if l.depth[i] < 0 && l.leaves[i].IsAbstract() {
				l.bad = append(l.bad, fmt.Errorf("leaf %s is kept (KeepLeaves) but like's array is abstract", p))
			}
			if l.depth[i] < 0 {
				continue
			}
		}
		if l.depth[i] < 0 {
			l.missing = append(l.missing, fmt.Errorf("leaf %s (%v) is not in the file%s", p, l.leaves[i].Type(), t.expected(l.rules, i, nil)))
			continue
		}
		forEachIndex(l.leaves[i].Shape()[:l.depth[i]], func(idx []int) {
			ref := leafRef{leaf: i, idx: slices.Clone(idx)}
			if _, ok := l.by[t.name(ref)]; !ok {
				l.missing = append(l.missing, fmt.Errorf("leaf part %s is not in the file%s", t.name(ref), t.expected(l.rules, i, ref.idx)))
			}
		})
	}
}

// err joins the errors found, under a line that counts them, or returns
// nil.
func (l *mappedLoad) err() error {
	if n := len(l.unmapped) + len(l.missing) + len(l.bad); n == 0 {
		return nil
	}
	var head []string
	if len(l.unmapped) > 0 {
		head = append(head, fmt.Sprintf("%d file tensors not mapped (IgnoreTensors to skip them)", len(l.unmapped)))
	}
	if len(l.missing) > 0 {
		head = append(head, fmt.Sprintf("%d tree leaves or parts not in the file (KeepLeaves to keep like's)", len(l.missing)))
	}
	if len(l.bad) > 0 {
		head = append(head, fmt.Sprintf("%d tensors that do not fit", len(l.bad)))
	}
	all := append(append(append([]error{errors.New(strings.Join(head, ", ") + ":")}, l.bad...), l.unmapped...), l.missing...)
	return errors.Join(all...)
}

// read allocates each written leaf once, reads every tensor into its part
// and returns the loaded leaves (like's own for those kept).
func (l *mappedLoad) read() ([]*trace.Array, error) {
	l.dests = make([]*dest, len(l.leaves))
	ok := false
	defer func() {
		if !ok {
			for _, d := range l.dests {
				if d != nil {
					d.discard()
				}
			}
		}
	}()
	for i, a := range l.leaves {
		if l.depth[i] < 0 {
			continue
		}
		d, err := newDest(a.Type())
		if err != nil {
			return nil, fmt.Errorf("leaf %s: %w", l.t.paths[i], err)
		}
		l.dests[i] = d
	}
	r, writes := l.r, l.writes
	sort.SliceStable(writes, func(i, j int) bool { // file order, for the page cache's read-ahead
		fi, fj := r.where[writes[i].file], r.where[writes[j].file]
		if fi != fj {
			return fi < fj
		}
		return r.files[fi].h.tensors[writes[i].file].DataOffsets[0] < r.files[fj].h.tensors[writes[j].file].DataOffsets[0]
	})
	for _, w := range writes {
		if err := l.readWrite(w); err != nil {
			return nil, err
		}
	}
	out := make([]*trace.Array, len(l.leaves))
	for i := range l.leaves {
		if l.dests[i] == nil {
			out[i] = l.leaves[i] // kept
			continue
		}
		a, err := l.dests[i].finish()
		if err != nil {
			return nil, fmt.Errorf("leaf %s: %w", l.t.paths[i], err)
		}
		l.dests[i] = nil
		out[i] = a
	}
	ok = true
	return out, nil
}

// readWrite reads w's file tensor into its part of its leaf's memory.
func (l *mappedLoad) readWrite(w write) error {
	leaf := l.leaves[w.dst.leaf]
	shape := leaf.Shape()
	es := leaf.DType().Size()
	part, off := 1, 0
	for _, n := range shape[len(w.dst.idx):] {
		part *= n
	}
	for k, j := range w.dst.idx {
		off = off*shape[k] + j
	}
	mem := l.dests[w.dst.leaf].mem[off*part*es : (off+1)*part*es]
	fi := l.r.where[w.file]
	if err := l.r.files[fi].read(w.file, l.r.files[fi].h.tensors[w.file], w.reg, leaf.DType(), mem); err != nil {
		return fmt.Errorf("%s → %s: %w", w.file, l.t.name(w.dst), err)
	}
	return nil
}

// candidates returns the names a file tensor may be matched as: its own,
// then with each prefix removed or added.
func candidates(name string, prefixes []string) []string {
	out := []string{name}
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			out = append(out, name[len(p):])
		} else {
			out = append(out, p+name)
		}
	}
	return out
}

// forEachIndex calls f with every index of shape, in row-major order.
func forEachIndex(shape []int, f func(idx []int)) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	idx := make([]int, len(shape))
	for range n {
		f(idx)
		for k := len(shape) - 1; k >= 0; k-- {
			if idx[k]++; idx[k] < shape[k] {
				break
			}
			idx[k] = 0
		}
	}
}

// expected names, for an error, the file tensors whose rules would write
// leaf i (at idx, or any part when idx is nil).
func (t *leafTable) expected(rules []compiledRule, i int, idx []int) string {
	var names []string
	try := func(tree string) {
		for k := range rules {
			r := &rules[k]
			if sm := r.tree.FindStringSubmatch(tree); sm != nil {
				n := substitute(r.File, r.tree, sm)
				if r.Split.Parts != 0 {
					n += fmt.Sprintf(" (part %d of %d along axis %d)", r.Split.Part, r.Split.Parts, r.Split.Axis)
				}
				if !slices.Contains(names, n) {
					names = append(names, n)
				}
			}
		}
	}
	if idx != nil {
		try(t.name(leafRef{leaf: i, idx: idx}))
	} else {
		try(t.paths[i])
		if len(names) == 0 {
			// A stacked leaf: the names of its first and last parts.
			if shape := t.leaves[i].Shape(); len(shape) > 0 && shape[0] > 0 {
				try(t.paths[i] + "[0]")
				if shape[0] > 1 {
					try(fmt.Sprintf("%s[%d]", t.paths[i], shape[0]-1))
				}
			}
		}
	}
	if len(names) == 0 {
		return " (no rule maps a file tensor to it)"
	}
	return " (expected " + strings.Join(names, ", ") + ")"
}

// SaveMapped writes tree (concrete arrays) to a safetensors file at path
// under the names of the mapping m: the inverse of LoadMapped. Each leaf,
// or each part of a stacked leaf, is written under the file name of the
// rule whose Tree matches it; parts that a rule splits from one file tensor
// are joined back into it, transposed leaves transposed back. Every leaf
// must have a rule. The file is written as SaveFile writes (atomically,
// with Ferry's checksums, which other readers ignore); metadata is stored
// as it is (Hugging Face's loaders want {"format": "pt"}). Leaves and parts
// that are stored whole are written from the arrays' memory; joined and
// transposed tensors are assembled in host memory first.
func SaveMapped(path string, tree any, m Mapping, metadata map[string]string, opts ...Option) error {
	names, lits, err := mappedTensors(tree, m)
	if err != nil {
		return fmt.Errorf("checkpoint.SaveMapped: %w", err)
	}
	o := makeOptions(opts)
	removeStale(dirOf(path))
	var saveErr error
	err = writeAtomic(path, o.perm, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		if saveErr = writeTensors(bw, names, lits, metadata, nil); saveErr != nil {
			return saveErr
		}
		return bw.Flush()
	})
	if err != nil {
		return fmt.Errorf("checkpoint.SaveMapped: %w", err)
	}
	return nil
}

// piece is a leaf part that goes into a file tensor.
type piece struct {
	rule *compiledRule
	typ  ir.Type // the part's type
	data []byte  // the part's bytes (in the leaf's memory)
	from string  // the part's tree name
}

func mappedTensors(tree any, m Mapping) ([]string, []*ir.Literal, error) {
	rules, err := m.compile()
	if err != nil {
		return nil, nil, err
	}
	leaves, def, err := trace.Flatten(tree)
	if err != nil {
		return nil, nil, err
	}
	paths := def.Paths()
	var errs []error
	files := map[string][]piece{}
	var order []string
	match := func(tree string) (*compiledRule, string) {
		for k := range rules {
			r := &rules[k]
			if sm := r.tree.FindStringSubmatch(tree); sm != nil {
				return r, substitute(r.File, r.tree, sm)
			}
		}
		return nil, ""
	}
	for i, a := range leaves {
		lit, err := a.Literal()
		if err != nil {
			errs = append(errs, fmt.Errorf("leaf %s: %w", paths[i], err))
			continue
		}
		shape := a.Shape()
		// The depth of the leaf's parts: the fewest leading indices a rule matches.
		d := -1
		for k := 0; k <= len(shape) && d < 0; k++ {
			probe := paths[i] + strings.Repeat("[0]", k)
			if r, _ := match(probe); r != nil {
				d = k
			}
		}
		if d < 0 {
			errs = append(errs, fmt.Errorf("leaf %s (%v): no rule maps it to a file tensor", paths[i], a.Type()))
			continue
		}
		partType := ir.Type{DType: a.DType(), Shape: shape[d:]}
		nb := int(partType.Bytes())
		off := 0
		forEachIndex(shape[:d], func(idx []int) {
			name := paths[i]
			for _, j := range idx {
				name += fmt.Sprintf("[%d]", j)
			}
			r, file := match(name)
			data := lit.Data[off : off+nb]
			off += nb
			if r == nil {
				errs = append(errs, fmt.Errorf("leaf part %s: no rule maps it to a file tensor", name))
				return
			}
			if _, seen := files[file]; !seen {
				order = append(order, file)
			}
			files[file] = append(files[file], piece{rule: r, typ: partType, data: data, from: name})
		})
	}
	sort.Strings(order)
	lits := make([]*ir.Literal, 0, len(order))
	for _, file := range order {
		l, err := joinPieces(files[file])
		if err != nil {
			errs = append(errs, fmt.Errorf("file tensor %q: %w", file, err))
			continue
		}
		lits = append(lits, l)
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	return order, lits, nil
}

// joinPieces makes a file tensor of its pieces: one piece stored whole
// (its memory, no copy), transposed back, or the parts of a split joined.
func joinPieces(ps []piece) (*ir.Literal, error) {
	first := ps[0]
	for _, p := range ps[1:] {
		if p.typ.DType != first.typ.DType || !slices.Equal(p.typ.Shape, first.typ.Shape) {
			return nil, fmt.Errorf("its parts %s (%v) and %s (%v) differ in type", first.from, first.typ, p.from, p.typ)
		}
	}
	// Each piece as the file stores it (transposed back).
	es := first.typ.DType.Size()
	stored := func(p piece) ([]byte, ir.Shape) {
		if !p.rule.Transpose {
			return p.data, p.typ.Shape
		}
		r, c := p.typ.Shape[0], p.typ.Shape[1]
		out := make([]byte, len(p.data))
		for i := range r {
			for j := range c {
				copy(out[(j*r+i)*es:(j*r+i+1)*es], p.data[(i*c+j)*es:(i*c+j+1)*es])
			}
		}
		return out, ir.Shape{c, r}
	}
	s := first.rule.Split
	if s.Parts == 0 {
		if len(ps) > 1 {
			return nil, fmt.Errorf("written by %s and %s", ps[0].from, ps[1].from)
		}
		data, shape := stored(first)
		return &ir.Literal{Type: ir.Type{DType: first.typ.DType, Shape: shape}, Data: data}, nil
	}
	parts := make([][]byte, s.Parts)
	var shape ir.Shape
	for _, p := range ps {
		ps := p.rule.Split
		if ps.Parts != s.Parts || ps.Axis != s.Axis {
			return nil, fmt.Errorf("its parts %s and %s are split differently", first.from, p.from)
		}
		if parts[ps.Part] != nil {
			return nil, fmt.Errorf("part %d is written twice (%s)", ps.Part, p.from)
		}
		parts[ps.Part], shape = stored(p)
	}
	for k, p := range parts {
		if p == nil {
			return nil, fmt.Errorf("part %d of %d along axis %d has no leaf", k, s.Parts, s.Axis)
		}
	}
	if s.Axis >= len(shape) {
		return nil, fmt.Errorf("split axis %d of a part of rank %d", s.Axis, len(shape))
	}
	outer := 1
	for _, n := range shape[:s.Axis] {
		outer *= n
	}
	block := len(parts[0]) / max(outer, 1)
	full := shape.Clone()
	full[s.Axis] *= s.Parts
	l := ir.NewLiteral(ir.Type{DType: first.typ.DType, Shape: full})
	at := 0
	for o := range outer {
		for _, p := range parts {
			at += copy(l.Data[at:], p[o*block:(o+1)*block])
		}
	}
	return l, nil
}
