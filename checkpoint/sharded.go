package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// IndexFile is the name of the index of a sharded checkpoint directory
// (SaveSharded).
const IndexFile = "index.json"

// indexFormat names the layout of index files, checked on load.
const indexFormat = "ferry-sharded-checkpoint/1"

// MaxIndexBytes is the largest index file LoadSharded reads.
const MaxIndexBytes = 1 << 30

// Index describes a sharded checkpoint (SaveSharded): it is the content of
// dir/index.json.
type Index struct {
	// Format is "ferry-sharded-checkpoint/1".
	Format string `json:"format"`
	// Processes is the process count of the job that saved it.
	Processes int `json:"processes"`
	// Files are the data files, one per process, relative to the directory.
	Files []string `json:"files"`
	// Metadata is SaveSharded's metadata.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Arrays are the tree's leaves in leaf order.
	Arrays []IndexArray `json:"arrays"`
}

// IndexArray describes one leaf of a sharded checkpoint.
type IndexArray struct {
	// Path is the leaf's path in the tree (trace.TreeDef.Paths).
	Path string `json:"path"`
	// DType is the safetensors dtype name ("F32", "BF16", ...).
	DType string `json:"dtype"`
	// Shape is the global shape.
	Shape []int `json:"shape"`
	// Sharding is the saved array's sharding (ir.NamedSharding.String),
	// empty for an unsharded array.
	Sharding string `json:"sharding,omitempty"`
	// Blocks are the distinct blocks that tile the array, each saved once.
	Blocks []IndexBlock `json:"blocks"`
}

// IndexBlock is one saved block of an array: its bounds in the global array
// and where its data is.
type IndexBlock struct {
	// Start and Limit bound the block per dimension.
	Start []int `json:"start"`
	Limit []int `json:"limit"`
	// File is the data file holding it, relative to the directory.
	File string `json:"file"`
	// Tensor is its name in that file.
	Tensor string `json:"tensor"`
}

// dataFile names process p's data file of a job of n processes.
func dataFile(p, n int) string { return fmt.Sprintf("process-%d-of-%d.safetensors", p, n) }

// blockName names the tensor of a leaf's block in a data file: the leaf's
// path, then "@" and the block's start ("W@0,4"); an unsharded leaf's
// tensor is its path.
func blockName(path string, start []int) string {
	s := make([]string, len(start))
	for i, v := range start {
		s[i] = fmt.Sprint(v)
	}
	return path + "@" + strings.Join(s, ",")
}

// SaveSharded writes tree (any tree of concrete arrays, sharded or not) to
// the directory dir, which it creates if needed, as one safetensors file
// per process and one index, so that LoadSharded can read it back with
// other shardings or in a job of another process count. In a job of
// several processes (rt.InitDistributed) every process calls it with the
// same tree structure, shapes and shardings; dir is a directory that every
// process sees (a shared file system).
//
// Process p of n writes dir/process-<p>-of-<n>.safetensors holding the
// blocks its devices hold, each distinct block once: of the devices holding
// replicas of a block, the one of lowest device ID writes it. A block's
// tensor is named by the leaf's path and the block's start ("Layers[0].W@0,4").
// Unsharded arrays are written whole by process 0, named by their path.
// Then process 0 writes dir/index.json (the Index: each leaf's path, dtype,
// global shape, sharding and blocks with their files and tensor names,
// and metadata). The files are written to temporary files and renamed;
// the index is written after every process wrote its data, and SaveSharded
// returns in every process once it is in place (rt.ProcessBarrier), with an
// error in every process if any process failed.
func SaveSharded(dir string, tree any, metadata map[string]string) error {
	idx, err := saveLocal(dir, tree, metadata)
	failed, berr := rt.ProcessBarrier(err == nil)
	if err != nil {
		return fmt.Errorf("checkpoint.SaveSharded: %w", err)
	}
	if berr != nil {
		return fmt.Errorf("checkpoint.SaveSharded: %w", berr)
	}
	if len(failed) > 0 {
		return fmt.Errorf("checkpoint.SaveSharded: processes %v failed to write their data files", failed)
	}
	if rt.ProcessIndex() == 0 {
		err = writeAtomic(filepath.Join(dir, IndexFile), func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", " ")
			return enc.Encode(idx)
		})
	}
	failed, berr = rt.ProcessBarrier(err == nil)
	if err != nil {
		return fmt.Errorf("checkpoint.SaveSharded: writing the index: %w", err)
	}
	if berr != nil {
		return fmt.Errorf("checkpoint.SaveSharded: %w", berr)
	}
	if len(failed) > 0 {
		return errors.New("checkpoint.SaveSharded: process 0 failed to write the index")
	}
	return nil
}

// saveLocal writes this process's data file and returns the index (the
// same in every process).
func saveLocal(dir string, tree any, metadata map[string]string) (*Index, error) {
	leaves, def, err := trace.Flatten(tree)
	if err != nil {
		return nil, err
	}
	p, n := rt.ProcessIndex(), rt.ProcessCount()
	devs := rt.Devices()
	idx := &Index{Format: indexFormat, Processes: n, Metadata: metadata}
	for q := range n {
		idx.Files = append(idx.Files, dataFile(q, n))
	}
	mine := dataFile(p, n)
	var names []string
	var lits []*ir.Literal
	for i, path := range def.Paths() {
		a := leaves[i]
		if a.IsTraced() {
			return nil, fmt.Errorf("%s: a traced array; save outside of traced functions", path)
		}
		typ := a.Type()
		dt, ok := dtypeNames[typ.DType]
		if !ok {
			return nil, fmt.Errorf("%s: dtype %v cannot be saved", path, typ.DType)
		}
		ia := IndexArray{Path: path, DType: dt, Shape: slices.Clone(typ.Shape)}
		s := typ.Sharding
		if s == nil {
			ia.Blocks = []IndexBlock{{Start: make([]int, len(typ.Shape)), Limit: slices.Clone(typ.Shape), File: idx.Files[0], Tensor: path}}
			if p == 0 {
				l, err := a.Literal()
				if err != nil {
					return nil, fmt.Errorf("%s: %w", path, err)
				}
				names, lits = append(names, path), append(lits, l)
			}
			idx.Arrays = append(idx.Arrays, ia)
			continue
		}
		ia.Sharding = s.String()
		// The owner of each block: the lowest device holding it.
		owner := map[string]int{}
		var order []string
		bounds := map[string][2][]int{}
		for _, g := range s.Mesh.Devices() {
			start, limit, err := s.ShardBounds(typ.Shape, g)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			k := fmt.Sprint(start)
			if o, ok := owner[k]; !ok {
				order = append(order, k)
				owner[k], bounds[k] = g, [2][]int{start, limit}
			} else if g < o {
				owner[k] = g
			}
		}
		for _, k := range order {
			b := bounds[k]
			if owner[k] >= len(devs) {
				return nil, fmt.Errorf("%s: %v names device %d, the job has %d", path, s, owner[k], len(devs))
			}
			ia.Blocks = append(ia.Blocks, IndexBlock{Start: b[0], Limit: b[1], File: idx.Files[devs[owner[k]].Process], Tensor: blockName(path, b[0])})
		}
		shards, err := rt.Shards(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, sh := range shards {
			k := fmt.Sprint(sh.Start)
			if owner[k] != sh.Device.ID {
				continue
			}
			l, err := sh.Array.Literal()
			if err != nil {
				return nil, fmt.Errorf("%s: block %v: %w", path, sh.Start, err)
			}
			names, lits = append(names, blockName(path, sh.Start)), append(lits, l)
		}
		idx.Arrays = append(idx.Arrays, ia)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	err = writeAtomic(filepath.Join(dir, mine), func(w io.Writer) error {
		return writeTensors(w, names, lits, nil)
	})
	if err != nil {
		return nil, err
	}
	return idx, nil
}

// writeAtomic writes the file at path through write, into a temporary file
// beside it renamed to path when complete.
func writeAtomic(path string, write func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".checkpoint-*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = write(f); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// ReadIndex reads and checks the index of a sharded checkpoint directory
// (SaveSharded).
func ReadIndex(dir string) (*Index, error) {
	idx, err := readIndex(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint.ReadIndex: %w", err)
	}
	return idx, nil
}

func readIndex(dir string) (*Index, error) {
	path := filepath.Join(dir, IndexFile)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("no sharded checkpoint in %s: %w", dir, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxIndexBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxIndexBytes {
		return nil, fmt.Errorf("%s is over %d bytes", path, MaxIndexBytes)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var idx Index
	if err := dec.Decode(&idx); err != nil {
		return nil, fmt.Errorf("%s: invalid index: %w", path, err)
	}
	if idx.Format != indexFormat {
		return nil, fmt.Errorf("%s: format %q, want %q", path, idx.Format, indexFormat)
	}
	for i := range idx.Arrays {
		if err := checkArray(&idx.Arrays[i]); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return &idx, nil
}

// checkArray checks that a's blocks lie in its shape and tile it exactly.
func checkArray(a *IndexArray) error {
	if _, ok := dtypeOf[a.DType]; !ok {
		return fmt.Errorf("array %q: unsupported dtype %q", a.Path, a.DType)
	}
	total := int64(1)
	for _, d := range a.Shape {
		if d < 0 {
			return fmt.Errorf("array %q: invalid shape %v", a.Path, a.Shape)
		}
		total *= int64(d)
	}
	var sum int64
	for i, b := range a.Blocks {
		if len(b.Start) != len(a.Shape) || len(b.Limit) != len(a.Shape) {
			return fmt.Errorf("array %q: block %d has bounds %v..%v for shape %v", a.Path, i, b.Start, b.Limit, a.Shape)
		}
		v := int64(1)
		for d := range a.Shape {
			if b.Start[d] < 0 || b.Limit[d] < b.Start[d] || b.Limit[d] > a.Shape[d] {
				return fmt.Errorf("array %q: block %d bounds %v..%v lie outside shape %v", a.Path, i, b.Start, b.Limit, a.Shape)
			}
			v *= int64(b.Limit[d] - b.Start[d])
		}
		sum += v
		for j := range i {
			if overlaps(b, a.Blocks[j]) {
				return fmt.Errorf("array %q: blocks %d and %d overlap", a.Path, j, i)
			}
		}
	}
	if sum != total {
		return fmt.Errorf("array %q: its blocks hold %d of its %d elements", a.Path, sum, total)
	}
	return nil
}

func overlaps(a, b IndexBlock) bool {
	for d := range a.Start {
		if max(a.Start[d], b.Start[d]) >= min(a.Limit[d], b.Limit[d]) {
			return false
		}
	}
	return true
}

// LoadSharded reads the sharded checkpoint in dir (SaveSharded) into a tree
// shaped like like, which gives the structure, the paths, each leaf's dtype
// and shape, and its layout: a leaf that is a sharded array loads with its
// sharding (which may differ from the saved one: another mesh, spec or
// process count), any other leaf loads unsharded on the default device
// (in like's memory space). Each of this process's devices gets its block
// of each array from the parts of the saved blocks it covers, read from
// whichever data files hold them (every process sees every file). In a job
// of several processes every process calls it with like's shardings the
// same. The checkpoint must hold exactly the leaves of like with the same
// dtypes and shapes; otherwise the error names the leaf.
func LoadSharded[T any](dir string, like T) (T, error) {
	var z T
	leaves, def, err := trace.Flatten(like)
	if err != nil {
		return z, fmt.Errorf("checkpoint.LoadSharded: %w", err)
	}
	out, err := loadSharded(dir, leaves, def.Paths())
	if err != nil {
		return z, fmt.Errorf("checkpoint.LoadSharded %s: %w", dir, err)
	}
	return trace.UnflattenAs[T](def, out)
}

// dataReader reads tensors of one data file.
type dataReader struct {
	f    *os.File
	h    *header
	base int64 // the file offset of the data
}

func loadSharded(dir string, leaves []*trace.Array, paths []string) (out []*trace.Array, err error) {
	idx, err := readIndex(dir)
	if err != nil {
		return nil, err
	}
	byPath := map[string]*IndexArray{}
	for i := range idx.Arrays {
		byPath[idx.Arrays[i].Path] = &idx.Arrays[i]
	}
	inTree := map[string]bool{}
	var errs []error
	for i, p := range paths {
		inTree[p] = true
		a, ok := byPath[p]
		if !ok {
			errs = append(errs, fmt.Errorf("array %q is missing from the checkpoint", p))
			continue
		}
		want := leaves[i]
		if want.IsTraced() {
			return nil, fmt.Errorf("array %q: like holds a traced array; load outside of traced functions", p)
		}
		if dtypeOf[a.DType] != want.DType() || !slices.Equal(a.Shape, want.Shape()) {
			errs = append(errs, fmt.Errorf("array %q is %v in the checkpoint, want %v", p,
				ir.Type{DType: dtypeOf[a.DType], Shape: a.Shape}, ir.Type{DType: want.DType(), Shape: want.Shape()}))
		}
	}
	for _, a := range idx.Arrays {
		if !inTree[a.Path] {
			errs = append(errs, fmt.Errorf("the checkpoint has array %q, which is not in the tree", a.Path))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	files := map[string]*dataReader{}
	defer func() {
		for _, r := range files {
			r.f.Close()
		}
	}()
	open := func(name string) (*dataReader, error) {
		if r := files[name]; r != nil {
			return r, nil
		}
		if name != filepath.Base(name) || !slices.Contains(idx.Files, name) {
			return nil, fmt.Errorf("the index names data file %q, not one of its files %v", name, idx.Files)
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("data file: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		h, err := readHeader(f, st.Size())
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("data file %s: %w", name, err)
		}
		base, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			f.Close()
			return nil, err
		}
		r := &dataReader{f: f, h: h, base: base}
		files[name] = r
		return r, nil
	}
	out = make([]*trace.Array, len(leaves))
	defer func() {
		if err != nil {
			for _, a := range out {
				if a != nil {
					_ = a.Delete()
				}
			}
		}
	}()
	for i, p := range paths {
		a, want := byPath[p], leaves[i]
		typ := want.Type()
		block := func(start, limit []int) (*ir.Literal, error) {
			shape := make(ir.Shape, len(start))
			for d := range start {
				shape[d] = limit[d] - start[d]
			}
			l := ir.NewLiteral(ir.Type{DType: typ.DType, Shape: shape, Space: typ.Space})
			for _, b := range a.Blocks {
				if err := readPart(open, a, b, l, start, limit); err != nil {
					return nil, fmt.Errorf("array %q: %w", p, err)
				}
			}
			if typ.DType == ir.Bool {
				for j, v := range l.Data { // Ferry's bools are 0 or 1
					if v != 0 {
						l.Data[j] = 1
					}
				}
			}
			return l, nil
		}
		if typ.Sharding != nil {
			out[i], err = rt.MakeShardedArray(typ, func(_ rt.Device, start, limit []int) (*ir.Literal, error) {
				return block(start, limit)
			})
			if err != nil {
				return nil, fmt.Errorf("array %q: %w", p, err)
			}
			continue
		}
		l, err := block(make([]int, len(typ.Shape)), slices.Clone(typ.Shape))
		if err != nil {
			return nil, err
		}
		x, err := rt.FromLiteral(l)
		if err != nil {
			return nil, fmt.Errorf("array %q: %w", p, err)
		}
		if sp := typ.Space; sp != x.Space() {
			y := trace.DevicePut(x, sp)
			_ = x.Delete()
			x = y
		}
		out[i] = x
	}
	return out, nil
}

// readPart copies the part of saved block b of array a that lies in
// [start, limit) into dst, the block [start, limit) of the array. It reads
// from b's file the bytes from the part's first element to its last.
func readPart(open func(string) (*dataReader, error), a *IndexArray, b IndexBlock, dst *ir.Literal, start, limit []int) error {
	rank := len(start)
	lo, hi := make([]int, rank), make([]int, rank)
	for d := range rank {
		lo[d], hi[d] = max(start[d], b.Start[d]), min(limit[d], b.Limit[d])
		if lo[d] >= hi[d] {
			return nil // disjoint, or empty
		}
	}
	r, err := open(b.File)
	if err != nil {
		return err
	}
	ti, ok := r.h.tensors[b.Tensor]
	if !ok {
		return fmt.Errorf("data file %s has no tensor %q", b.File, b.Tensor)
	}
	bshape := make([]int, rank)
	for d := range rank {
		bshape[d] = b.Limit[d] - b.Start[d]
	}
	if ti.DType != a.DType || !slices.Equal(ti.Shape, bshape) {
		return fmt.Errorf("tensor %q of %s is %s%v, the index says %s%v", b.Tensor, b.File, ti.DType, ti.Shape, a.DType, bshape)
	}
	es := int64(dst.Type.DType.Size())
	// Row-major offsets (in elements) of the part's first and last elements
	// in the saved block.
	offset := func(idx []int, origin []int, shape []int) int64 {
		var o int64
		for d := range rank {
			o = o*int64(shape[d]) + int64(idx[d]-origin[d])
		}
		return o
	}
	last := make([]int, rank)
	for d := range rank {
		last[d] = hi[d] - 1
	}
	first, end := offset(lo, b.Start, bshape), offset(last, b.Start, bshape)+1
	span := make([]byte, (end-first)*es)
	if _, err := r.f.ReadAt(span, r.base+ti.DataOffsets[0]+first*es); err != nil {
		return fmt.Errorf("reading tensor %q of %s: %w", b.Tensor, b.File, err)
	}
	dshape := dst.Type.Shape
	row := es // bytes per row of the part
	if rank > 0 {
		row *= int64(hi[rank-1] - lo[rank-1])
	}
	idx := slices.Clone(lo)
	for {
		s := (offset(idx, b.Start, bshape) - first) * es
		t := offset(idx, start, dshape) * es
		copy(dst.Data[t:t+row], span[s:s+row])
		d := rank - 2
		for ; d >= 0; d-- { // next row: odometer over the outer dimensions
			idx[d]++
			if idx[d] < hi[d] {
				break
			}
			idx[d] = lo[d]
		}
		if d < 0 {
			return nil
		}
	}
}
