package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// IndexFile is the name of the index of a sharded checkpoint directory
// (SaveSharded).
const IndexFile = "index.json"

// indexFormat names the layout of index files; legacyIndexFormat is the
// layout of earlier versions, without checksums or save ids, still read.
const (
	indexFormat       = "ferry-sharded-checkpoint/2"
	legacyIndexFormat = "ferry-sharded-checkpoint/1"
)

// MaxIndexBytes is the largest index file LoadSharded reads.
const MaxIndexBytes = 1 << 30

// Index describes a sharded checkpoint (SaveSharded): it is the content of
// dir/index.json, the checkpoint's manifest.
type Index struct {
	// Format is "ferry-sharded-checkpoint/2" ("/1" for checkpoints of
	// earlier versions, which have no save id or checksums).
	Format string `json:"format"`
	// SaveID tells this save from the others in the directory: every data
	// file carries it in its metadata, and its name.
	SaveID string `json:"save_id,omitempty"`
	// Processes is the process count of the job that saved it.
	Processes int `json:"processes"`
	// Files are the data files, one per process.
	Files []IndexDataFile `json:"files"`
	// Metadata is SaveSharded's metadata.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Arrays are the tree's leaves in leaf order.
	Arrays []IndexArray `json:"arrays"`
	// Checksum is the CRC-32C (8 hex digits) of the index's JSON written
	// with Checksum empty (encoding/json, fields in this order).
	Checksum string `json:"checksum,omitempty"`
}

// IndexDataFile names a data file of a sharded checkpoint and what it must
// hold.
type IndexDataFile struct {
	// Name is the file's name in the directory.
	Name string `json:"name"`
	// Size is its size in bytes (-1 in a "/1" index: unknown).
	Size int64 `json:"size"`
	// HeaderCRC32C is the CRC-32C of its first bytes, the header length
	// and the header, which holds the save id and each tensor's CRC-32C
	// (empty in a "/1" index).
	HeaderCRC32C string `json:"header_crc32c,omitempty"`
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

// dataFile names process p's data file of a job of n processes in the save
// of id id.
func dataFile(p, n int, id string) string {
	return fmt.Sprintf("process-%d-of-%d.save%s.safetensors", p, n, id)
}

// dataPattern matches the names of data files of sharded checkpoints, of
// this version and earlier ones.
var dataPattern = regexp.MustCompile(`^process-[0-9]+-of-[0-9]+(\.save[0-9]+)?\.safetensors$`)

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
// Process p of n writes dir/process-<p>-of-<n>.save<id>.safetensors
// holding the blocks its devices hold, each distinct block once: of the
// devices holding replicas of a block, the one of lowest device ID writes
// it. A block's tensor is named by the leaf's path and the block's start
// ("Layers[0].W@0,4"). Unsharded arrays are written whole by process 0,
// named by their path. The save id id is one more than the id of the
// checkpoint in dir (1 in a new directory), so the files of the previous
// checkpoint are not touched; every data file carries it in its metadata,
// with a CRC-32C of each tensor and of its header.
//
// The save commits when process 0 writes dir/index.json (the Index: the
// save id, each data file's size and header checksum, each leaf's path,
// dtype, global shape, sharding and blocks, the metadata, and a checksum
// of the index), after every process wrote its data file: each file is
// written to a temporary file, synced, renamed and its directory synced.
// Then process 0 removes the files of earlier saves and temporary files
// of saves that died. A save that dies part-way leaves the previous
// checkpoint in place, and LoadSharded loads it. SaveSharded returns in
// every process once the index is in place (rt.ProcessBarrier), with an
// error in every process if any process failed (if process 0 died after
// writing the index, the new checkpoint is in place, whole, although the
// others report an error).
func SaveSharded(dir string, tree any, metadata map[string]string, opts ...Option) error {
	o := makeOptions(opts)
	id := nextSaveID(dir)
	idx, err := saveLocal(dir, tree, metadata, id, o)
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
		err = commit(dir, idx, o)
	}
	failed, berr = rt.ProcessBarrier(err == nil)
	if err != nil {
		return fmt.Errorf("checkpoint.SaveSharded: %w", err)
	}
	if berr != nil {
		return fmt.Errorf("checkpoint.SaveSharded: %w", berr)
	}
	if len(failed) > 0 {
		return errors.New("checkpoint.SaveSharded: process 0 failed to write the index")
	}
	return nil
}

// nextSaveID returns the id of the next save in dir: one more than the
// committed checkpoint's, 1 if there is none (or none of this format).
// Every process of a job reads the same index (it changes only between the
// two barriers of SaveSharded), so they agree.
func nextSaveID(dir string) string {
	idx, err := readIndex(dir)
	if err != nil || idx.Format != indexFormat {
		return "1"
	}
	v, err := strconv.ParseUint(idx.SaveID, 10, 63)
	if err != nil {
		return "1"
	}
	return strconv.FormatUint(v+1, 10)
}

// commit checks the data files of idx that every process wrote (their
// headers: the save id and checksums), records their sizes and header
// checksums in idx, writes idx as the index, and removes the files of
// earlier saves and stale temporary files.
func commit(dir string, idx *Index, o options) error {
	for i := range idx.Files {
		f := &idx.Files[i]
		r, err := openData(dir, f.Name)
		if err != nil {
			return err
		}
		r.f.Close()
		if !r.h.verified || r.h.saveID != idx.SaveID {
			return fmt.Errorf("data file %s is not of this save (save id %q, want %q)", f.Name, r.h.saveID, idx.SaveID)
		}
		f.Size, f.HeaderCRC32C = r.size, crcHex(r.h.crc)
	}
	idx.Checksum = ""
	b, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	idx.Checksum = crcHex(crc32.Checksum(b, castagnoli))
	err = writeAtomic(filepath.Join(dir, IndexFile), o.perm, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		return enc.Encode(idx)
	})
	if err != nil {
		return fmt.Errorf("writing the index: %w", err)
	}
	// Committed: the files of earlier saves can go.
	keep := map[string]bool{}
	for _, f := range idx.Files {
		keep[f.Name] = true
	}
	if entries, err := os.ReadDir(dir); err == nil {
		for _, e := range entries {
			if e.Type().IsRegular() && dataPattern.MatchString(e.Name()) && !keep[e.Name()] {
				if os.Remove(filepath.Join(dir, e.Name())) == nil {
					step("removed " + e.Name())
				}
			}
		}
	}
	removeStale(dir)
	return nil
}

// saveLocal writes this process's data file and returns the index (the
// same in every process).
func saveLocal(dir string, tree any, metadata map[string]string, id string, o options) (*Index, error) {
	leaves, def, err := trace.Flatten(tree)
	if err != nil {
		return nil, err
	}
	p, n := rt.ProcessIndex(), rt.ProcessCount()
	devs := rt.Devices()
	for k := range metadata {
		if strings.HasPrefix(k, reservedPrefix) {
			return nil, fmt.Errorf("metadata key %q: keys beginning with %q are reserved for Ferry's checksums", k, reservedPrefix)
		}
	}
	idx := &Index{Format: indexFormat, SaveID: id, Processes: n, Metadata: metadata}
	for q := range n {
		idx.Files = append(idx.Files, IndexDataFile{Name: dataFile(q, n, id)})
	}
	mine := dataFile(p, n, id)
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
			ia.Blocks = []IndexBlock{{Start: make([]int, len(typ.Shape)), Limit: slices.Clone(typ.Shape), File: idx.Files[0].Name, Tensor: path}}
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
			ia.Blocks = append(ia.Blocks, IndexBlock{Start: b[0], Limit: b[1], File: idx.Files[devs[owner[k]].Process].Name, Tensor: blockName(path, b[0])})
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
	err = writeAtomic(filepath.Join(dir, mine), o.perm, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		if err := writeTensors(bw, names, lits, nil, map[string]string{saveIDKey: id}); err != nil {
			return err
		}
		return bw.Flush()
	})
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", mine, err)
	}
	return idx, nil
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
	var probe struct {
		Format string `json:"format"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("%s: invalid index: %w", path, err)
	}
	strict := func(v any) error {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return err
		}
		if _, err := dec.Token(); err != io.EOF {
			return errors.New("data after the index's JSON object")
		}
		return nil
	}
	var idx Index
	switch probe.Format {
	case indexFormat:
		if err := strict(&idx); err != nil {
			return nil, fmt.Errorf("%s: invalid index: %w", path, err)
		}
		rec := idx.Checksum
		idx.Checksum = ""
		m, err := json.Marshal(&idx)
		if err != nil {
			return nil, err
		}
		idx.Checksum = rec
		want, ok := parseCRC(rec)
		if !ok {
			return nil, fmt.Errorf("%s: corrupt index: its checksum %q is not 8 hex digits", path, rec)
		}
		if got := crc32.Checksum(m, castagnoli); got != want {
			return nil, fmt.Errorf("%s: corrupt index: its content has CRC-32C %08x, it records %08x", path, got, want)
		}
		if _, err := strconv.ParseUint(idx.SaveID, 10, 63); err != nil {
			return nil, fmt.Errorf("%s: invalid save id %q", path, idx.SaveID)
		}
		for _, df := range idx.Files {
			if _, ok := parseCRC(df.HeaderCRC32C); !ok || df.Size < 0 {
				return nil, fmt.Errorf("%s: data file %q has size %d and header checksum %q", path, df.Name, df.Size, df.HeaderCRC32C)
			}
		}
	case legacyIndexFormat:
		var old struct {
			Format    string            `json:"format"`
			Processes int               `json:"processes"`
			Files     []string          `json:"files"`
			Metadata  map[string]string `json:"metadata,omitempty"`
			Arrays    []IndexArray      `json:"arrays"`
		}
		if err := strict(&old); err != nil {
			return nil, fmt.Errorf("%s: invalid index: %w", path, err)
		}
		idx = Index{Format: old.Format, Processes: old.Processes, Metadata: old.Metadata, Arrays: old.Arrays}
		for _, name := range old.Files {
			idx.Files = append(idx.Files, IndexDataFile{Name: name, Size: -1})
		}
	default:
		return nil, fmt.Errorf("%s: format %q, want %q", path, probe.Format, indexFormat)
	}
	if len(idx.Files) != idx.Processes {
		return nil, fmt.Errorf("%s: %d data files for %d processes", path, len(idx.Files), idx.Processes)
	}
	names := map[string]bool{}
	for _, df := range idx.Files {
		if df.Name != filepath.Base(df.Name) || !dataPattern.MatchString(df.Name) || names[df.Name] {
			return nil, fmt.Errorf("%s: invalid or repeated data file name %q", path, df.Name)
		}
		names[df.Name] = true
	}
	for i := range idx.Arrays {
		if err := checkArray(&idx.Arrays[i]); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, bl := range idx.Arrays[i].Blocks {
			if !names[bl.File] {
				return nil, fmt.Errorf("%s: array %q: a block in %q, not one of the data files", path, idx.Arrays[i].Path, bl.File)
			}
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
//
// Nothing loads unless it is what the save wrote: the index's checksum,
// every data file's size, header checksum and save id, and the CRC-32C of
// each saved block this process reads are checked, and a mismatch is an
// error naming the file (and the tensor). Checkpoints of the "/1" format
// (earlier versions) have no checksums and load unverified. Temporary
// files of saves that died in dir are removed.
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
	f       *os.File
	h       *header
	base    int64 // the file offset of the data
	size    int64 // the file's size
	checked map[string]bool
}

// openData opens the data file name of dir and reads and checks its header.
func openData(dir, name string) (*dataReader, error) {
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
	return &dataReader{f: f, h: h, base: h.size, size: st.Size(), checked: map[string]bool{}}, nil
}

// checkData checks the CRC-32C of tensor name's data, once.
func (r *dataReader) checkData(file, name string, ti TensorInfo) error {
	if !r.h.verified || r.checked[name] {
		return nil
	}
	hw := crc32.New(castagnoli)
	n := ti.DataOffsets[1] - ti.DataOffsets[0]
	if _, err := io.Copy(hw, io.NewSectionReader(r.f, r.base+ti.DataOffsets[0], n)); err != nil {
		return fmt.Errorf("data file %s: reading tensor %q: %w", file, name, err)
	}
	if got, want := hw.Sum32(), r.h.sums[name]; got != want {
		return fmt.Errorf("data file %s: tensor %q is corrupt: its data has CRC-32C %08x, the header records %08x", file, name, got, want)
	}
	r.checked[name] = true
	return nil
}

// shardedLoad is the state of one LoadSharded: the index and its arrays by
// path, and the data files, open.
type shardedLoad struct {
	dir    string
	idx    *Index
	byPath map[string]*IndexArray
	files  map[string]*dataReader
}

func loadSharded(dir string, leaves []*trace.Array, paths []string) (out []*trace.Array, err error) {
	removeStale(dir)
	idx, err := readIndex(dir)
	if err != nil {
		return nil, err
	}
	l := &shardedLoad{dir: dir, idx: idx, byPath: map[string]*IndexArray{}, files: map[string]*dataReader{}}
	for i := range idx.Arrays {
		l.byPath[idx.Arrays[i].Path] = &idx.Arrays[i]
	}
	if err := l.checkTree(leaves, paths); err != nil {
		return nil, err
	}
	defer func() {
		for _, r := range l.files {
			r.f.Close()
		}
	}()
	if err := l.openFiles(); err != nil {
		return nil, err
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
		if out[i], err = l.load(p, leaves[i].Type()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkTree checks that the index holds exactly the leaves of the tree,
// with their dtypes and shapes.
func (l *shardedLoad) checkTree(leaves []*trace.Array, paths []string) error {
	inTree := map[string]bool{}
	var errs []error
	for i, p := range paths {
		inTree[p] = true
		a, ok := l.byPath[p]
		if !ok {
			errs = append(errs, fmt.Errorf("array %q is missing from the checkpoint", p))
			continue
		}
		want := leaves[i]
		if want.IsTraced() {
			return fmt.Errorf("array %q: like holds a traced array; load outside of traced functions", p)
		}
		if dtypeOf[a.DType] != want.DType() || !slices.Equal(a.Shape, want.Shape()) {
			errs = append(errs, fmt.Errorf("array %q is %v in the checkpoint, want %v", p,
				ir.Type{DType: dtypeOf[a.DType], Shape: a.Shape}, ir.Type{DType: want.DType(), Shape: want.Shape()}))
		}
	}
	for _, a := range l.idx.Arrays {
		if !inTree[a.Path] {
			errs = append(errs, fmt.Errorf("the checkpoint has array %q, which is not in the tree", a.Path))
		}
	}
	return errors.Join(errs...)
}

// openFiles opens every data file and checks it against the index before
// any is read.
func (l *shardedLoad) openFiles() error {
	idx := l.idx
	for _, df := range idx.Files {
		r, err := openData(l.dir, df.Name)
		if err != nil {
			return err
		}
		l.files[df.Name] = r
		if idx.Format == legacyIndexFormat {
			continue
		}
		if r.size != df.Size {
			return fmt.Errorf("data file %s has %d bytes, the index records %d", df.Name, r.size, df.Size)
		}
		if got := crcHex(r.h.crc); got != df.HeaderCRC32C {
			return fmt.Errorf("data file %s: its header has CRC-32C %s, the index records %s (a file of another save, or corrupt)", df.Name, got, df.HeaderCRC32C)
		}
		if !r.h.verified || r.h.saveID != idx.SaveID {
			return fmt.Errorf("data file %s is of save %q, the index is of save %q", df.Name, r.h.saveID, idx.SaveID)
		}
	}
	return nil
}

// open returns the open data file name.
func (l *shardedLoad) open(name string) (*dataReader, error) {
	if r := l.files[name]; r != nil {
		return r, nil
	}
	return nil, fmt.Errorf("the index names data file %q, not one of its files", name)
}

// block reads the block [start, limit) of array p, of type typ, from the
// parts of the saved blocks it covers.
func (l *shardedLoad) block(p string, typ ir.Type, start, limit []int) (*ir.Literal, error) {
	a := l.byPath[p]
	shape := make(ir.Shape, len(start))
	for d := range start {
		shape[d] = limit[d] - start[d]
	}
	lit := ir.NewLiteral(ir.Type{DType: typ.DType, Shape: shape, Space: typ.Space})
	for _, b := range a.Blocks {
		if err := readPart(l.open, a, b, lit, start, limit); err != nil {
			return nil, fmt.Errorf("array %q: %w", p, err)
		}
	}
	if typ.DType == ir.Bool {
		for j, v := range lit.Data { // Ferry's bools are 0 or 1
			if v != 0 {
				lit.Data[j] = 1
			}
		}
	}
	return lit, nil
}

// load loads array p as typ: sharded as typ's sharding says, or whole on
// the default device in typ's memory space.
func (l *shardedLoad) load(p string, typ ir.Type) (*trace.Array, error) {
	if typ.Sharding != nil {
		x, err := rt.MakeShardedArray(typ, func(_ rt.Device, start, limit []int) (*ir.Literal, error) {
			return l.block(p, typ, start, limit)
		})
		if err != nil {
			return nil, fmt.Errorf("array %q: %w", p, err)
		}
		return x, nil
	}
	lit, err := l.block(p, typ, make([]int, len(typ.Shape)), slices.Clone(typ.Shape))
	if err != nil {
		return nil, err
	}
	x, err := rt.FromLiteral(lit)
	if err != nil {
		return nil, fmt.Errorf("array %q: %w", p, err)
	}
	if sp := typ.Space; sp != x.Space() {
		y := trace.DevicePut(x, sp)
		_ = x.Delete()
		x = y
	}
	return x, nil
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
	if err := r.checkData(b.File, b.Tensor, ti); err != nil {
		return err
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
