package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// HFIndexFile is the name of the index of a sharded Hugging Face checkpoint:
// a JSON object whose "weight_map" maps each tensor name to the file (in the
// same directory) that holds it.
const HFIndexFile = "model.safetensors.index.json"

// Reader reads the tensors of a safetensors file, or of a sharded set of
// them, one at a time and only the bytes asked for: Open parses the
// headers, and Read, ReadInto and ReadArray read one tensor's data at its
// offset in its file, converting it to the dtype asked for. Files written
// by Ferry are verified (each tensor's CRC-32C, checked the first time it
// is read); other tools' files are read unverified. A Reader is safe for
// concurrent use; Close releases its files.
type Reader struct {
	path  string
	files []*tensorFile
	where map[string]int // tensor name → index in files
	names []string       // sorted
	meta  map[string]string
}

// tensorFile is one safetensors file of a Reader.
type tensorFile struct {
	path string
	f    *os.File
	h    *header

	mu      sync.Mutex
	checked map[string]bool // tensors whose checksum was verified
}

// Open opens a safetensors checkpoint for reading by name. path is a
// .safetensors file; a Hugging Face index (HFIndexFile, a JSON file whose
// "weight_map" names the file of each tensor); or a directory holding
// model.safetensors or HFIndexFile. It reads and checks every file's header
// (as ReadHeader does) and no tensor data. With an index, every tensor it
// maps must be in the file it names, and every tensor of those files must
// be in the map.
func Open(path string) (*Reader, error) {
	r, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint.Open: %w", err)
	}
	return r, nil
}

func open(path string) (*Reader, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		single := filepath.Join(path, "model.safetensors")
		index := filepath.Join(path, HFIndexFile)
		switch {
		case fileExists(single):
			path = single
		case fileExists(index):
			path = index
		default:
			return nil, fmt.Errorf("directory %s holds neither model.safetensors nor %s", path, HFIndexFile)
		}
	}
	r := &Reader{path: path, where: map[string]int{}}
	ok := false
	defer func() {
		if !ok {
			r.Close()
		}
	}()
	if strings.HasSuffix(path, ".json") {
		if err := r.openIndex(path); err != nil {
			return nil, err
		}
	} else {
		tf, err := openTensorFile(path)
		if err != nil {
			return nil, err
		}
		r.files = append(r.files, tf)
		for name := range tf.h.tensors {
			r.where[name] = 0
		}
		r.meta = tf.h.meta
	}
	for name := range r.where {
		r.names = append(r.names, name)
	}
	sort.Strings(r.names)
	ok = true
	return r, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// openIndex opens the files of a Hugging Face index.
func (r *Reader) openIndex(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var idx struct {
		Metadata  map[string]any    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return fmt.Errorf("index %s: %w", path, err)
	}
	if len(idx.WeightMap) == 0 {
		return fmt.Errorf("index %s: no \"weight_map\" (is it a Hugging Face %s?)", path, HFIndexFile)
	}
	dir := filepath.Dir(path)
	fileIndex := map[string]int{}
	var fileNames []string
	for _, f := range idx.WeightMap {
		if _, ok := fileIndex[f]; !ok {
			fileIndex[f] = -1
			fileNames = append(fileNames, f)
		}
	}
	sort.Strings(fileNames)
	var errs []error
	for _, f := range fileNames {
		if f == "" || filepath.IsAbs(f) || strings.Contains(f, "..") || strings.ContainsAny(f, `/\`) {
			return fmt.Errorf("index %s: file name %q must name a file beside the index", path, f)
		}
		tf, err := openTensorFile(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("index %s: %w", path, err)
		}
		fileIndex[f] = len(r.files)
		r.files = append(r.files, tf)
	}
	for name, f := range idx.WeightMap {
		i := fileIndex[f]
		if _, ok := r.files[i].h.tensors[name]; !ok {
			errs = append(errs, fmt.Errorf("index %s maps tensor %q to %s, which does not hold it", path, name, f))
			continue
		}
		r.where[name] = i
	}
	for i, tf := range r.files {
		for _, name := range tf.h.order {
			if j, ok := r.where[name]; !ok || j != i {
				errs = append(errs, fmt.Errorf("file %s holds tensor %q, which index %s does not map to it", tf.path, name, path))
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	r.meta = map[string]string{}
	for k, v := range idx.Metadata {
		r.meta[k] = fmt.Sprint(v)
	}
	return nil
}

func openTensorFile(path string) (*tensorFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	h, err := readHeader(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &tensorFile{path: path, f: f, h: h, checked: map[string]bool{}}, nil
}

// Close closes the Reader's files.
func (r *Reader) Close() error {
	var errs []error
	for _, tf := range r.files {
		if err := tf.f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Path returns the file or index the Reader was opened from.
func (r *Reader) Path() string { return r.path }

// Names returns the names of the tensors, sorted.
func (r *Reader) Names() []string { return slices.Clone(r.names) }

// Info returns the dtype, shape and data offsets (in its own file) of the
// tensor name, and whether there is one.
func (r *Reader) Info(name string) (TensorInfo, bool) {
	i, ok := r.where[name]
	if !ok {
		return TensorInfo{}, false
	}
	ti := r.files[i].h.tensors[name]
	ti.Shape = slices.Clone(ti.Shape)
	return ti, true
}

// Metadata returns the user metadata: the file's "__metadata__" (less
// Ferry's checksum keys), or an index's "metadata".
func (r *Reader) Metadata() map[string]string {
	m := make(map[string]string, len(r.meta))
	for k, v := range r.meta {
		m[k] = v
	}
	return m
}

// Read reads the tensor name into a new host literal of dtype dt,
// converting it (see ReadInto).
func (r *Reader) Read(name string, dt ir.DType) (*ir.Literal, error) {
	ti, ok := r.Info(name)
	if !ok {
		return nil, fmt.Errorf("checkpoint.Reader.Read: %s has no tensor %q", r.path, name)
	}
	if !dt.Valid() {
		return nil, fmt.Errorf("checkpoint.Reader.Read: tensor %q: invalid dtype %v", name, dt)
	}
	l := ir.NewLiteral(ir.Type{DType: dt, Shape: ir.Shape(ti.Shape)})
	if err := r.ReadInto(name, l); err != nil {
		return nil, err
	}
	return l, nil
}

// ReadInto reads the tensor name into dst, whose shape must be the
// tensor's, converting it to dst's dtype: floats (F64, F32, F16, BF16) to
// any float dtype (rounding to nearest even), integers (I64, I32, U32, U8)
// to any integer dtype (an error names the first value out of range), and
// BOOL to BOOL. It reads the tensor's bytes at their offset in its file,
// straight into dst when the dtypes match, through a buffer of at most
// 1 MiB when they do not.
func (r *Reader) ReadInto(name string, dst *ir.Literal) error {
	i, ok := r.where[name]
	if !ok {
		return fmt.Errorf("checkpoint.Reader.ReadInto: %s has no tensor %q", r.path, name)
	}
	ti := r.files[i].h.tensors[name]
	if !slices.Equal(ti.Shape, []int(dst.Type.Shape)) {
		return fmt.Errorf("checkpoint.Reader.ReadInto: tensor %q is %s%v, dst is %v", name, ti.DType, ti.Shape, dst.Type)
	}
	if err := r.files[i].read(name, ti, region{}, dst.Type.DType, dst.Data); err != nil {
		return fmt.Errorf("checkpoint.Reader.ReadInto: %w", err)
	}
	return nil
}

// ReadArray reads the tensor name into a new array of dtype dt in device
// memory (see ReadInto for the conversions). On the CPU backend the data is
// read straight into the array's memory, with no host copy.
func (r *Reader) ReadArray(name string, dt ir.DType) (*trace.Array, error) {
	ti, ok := r.Info(name)
	if !ok {
		return nil, fmt.Errorf("checkpoint.Reader.ReadArray: %s has no tensor %q", r.path, name)
	}
	if !dt.Valid() {
		return nil, fmt.Errorf("checkpoint.Reader.ReadArray: tensor %q: invalid dtype %v", name, dt)
	}
	d, err := newDest(ir.Type{DType: dt, Shape: ir.Shape(ti.Shape)})
	if err != nil {
		return nil, fmt.Errorf("checkpoint.Reader.ReadArray: tensor %q: %w", name, err)
	}
	if err := r.files[r.where[name]].read(name, ti, region{}, dt, d.mem); err != nil {
		d.discard()
		return nil, fmt.Errorf("checkpoint.Reader.ReadArray: %w", err)
	}
	a, err := d.finish()
	if err != nil {
		return nil, fmt.Errorf("checkpoint.Reader.ReadArray: tensor %q: %w", name, err)
	}
	return a, nil
}

// region selects part of a file tensor: start and limit per axis (nil:
// the whole tensor), and whether the selected 2-D block is transposed.
type region struct {
	start, limit []int
	transpose    bool
}

// scratchBytes bounds the buffer of a read that converts, transposes or
// gathers a tensor's rows.
const scratchBytes = 1 << 20

// read reads the part reg of tensor name (info ti) of tf into dst, of
// dtype dt: the part's elements in row-major order, or those of its
// transpose. dst must hold exactly the part.
func (tf *tensorFile) read(name string, ti TensorInfo, reg region, dt ir.DType, dst []byte) error {
	src, ok := dtypeOf[ti.DType]
	if !ok {
		return fmt.Errorf("tensor %q: unsupported safetensors dtype %q", name, ti.DType)
	}
	if err := checkConvert(src, dt); err != nil {
		return fmt.Errorf("tensor %q: %w", name, err)
	}
	shape := ti.Shape
	start, limit := reg.start, reg.limit
	if start == nil {
		start = make([]int, len(shape))
		limit = slices.Clone(shape)
	}
	n := 1
	for k := range shape {
		if start[k] < 0 || limit[k] > shape[k] || start[k] > limit[k] {
			return fmt.Errorf("tensor %q: part [%v, %v) outside its shape %v", name, start, limit, shape)
		}
		n *= limit[k] - start[k]
	}
	if reg.transpose && len(shape) != 2 {
		return fmt.Errorf("tensor %q: only a 2-D tensor can be transposed, it is %v", name, shape)
	}
	if len(dst) != n*dt.Size() {
		return fmt.Errorf("tensor %q: the destination holds %d bytes, the part %d elements of %v", name, len(dst), n, dt)
	}
	whole := true
	for k := range shape {
		whole = whole && start[k] == 0 && limit[k] == shape[k]
	}
	base := tf.h.size + ti.DataOffsets[0]
	es := int64(src.Size())
	if whole && !reg.transpose && src == dt {
		// The common case: straight into dst, checked there.
		if _, err := tf.f.ReadAt(dst, base); err != nil {
			return fmt.Errorf("%s: reading tensor %q: %w", tf.path, name, err)
		}
		if tf.h.verified {
			if err := checkTensor(tf.h, name, dst); err != nil {
				return fmt.Errorf("%s: %w", tf.path, err)
			}
			tf.mu.Lock()
			tf.checked[name] = true
			tf.mu.Unlock()
		}
		return normBool(dt, dst)
	}
	if err := tf.verify(name, ti); err != nil {
		return err
	}
	// The part is a sequence of runs, each contiguous in the file: find the
	// innermost axis from which the part covers whole rows.
	inner := len(shape) // axes inner..rank-1 are whole
	for inner > 0 && start[inner-1] == 0 && limit[inner-1] == shape[inner-1] {
		inner--
	}
	runElems := 1
	for k := inner; k < len(shape); k++ {
		runElems *= shape[k]
	}
	axis := inner - 1 // the runs' outermost axis (−1: the part is one run)
	if axis >= 0 {
		runElems *= limit[axis] - start[axis]
	}
	if n == 0 {
		return nil
	}
	w := window{f: tf.f, base: base, end: base + ti.DataOffsets[1] - ti.DataOffsets[0]}
	// rows × cols of the transposed 2-D part, for scattering.
	var rows, cols int
	var rowBuf []byte
	if reg.transpose {
		rows, cols = limit[0]-start[0], limit[1]-start[1]
		rowBuf = make([]byte, cols*dt.Size())
	}
	idx := slices.Clone(start) // the run's first element, its axes ≤ axis
	out := 0                   // elements written
	for run := 0; out < n; run++ {
		var off int64
		stride := int64(1)
		for k := len(shape) - 1; k >= 0; k-- {
			off += int64(idx[k]) * stride
			stride *= int64(shape[k])
		}
		if reg.transpose {
			// runElems is cols here (a partial row) or the whole block.
			for r0 := 0; r0 < runElems/cols; r0++ {
				if err := w.convert(name, src, dt, rowBuf, base+(off+int64(r0*shape[1]))*es, cols); err != nil {
					return err
				}
				r := out/cols + r0
				des := dt.Size()
				for c := 0; c < cols; c++ {
					copy(dst[(c*rows+r)*des:(c*rows+r+1)*des], rowBuf[c*des:(c+1)*des])
				}
			}
		} else if err := w.convert(name, src, dt, dst[out*dt.Size():(out+runElems)*dt.Size()], base+off*es, runElems); err != nil {
			return err
		}
		out += runElems
		// The next run: increment idx over axes < inner.
		for k := axis - 1; k >= 0; k-- {
			idx[k]++
			if idx[k] < limit[k] {
				break
			}
			idx[k] = start[k]
		}
	}
	return normBool(dt, dst)
}

// verify checks the CRC-32C of a Ferry-written tensor, once, by reading it
// through; a file of another tool is not checked.
func (tf *tensorFile) verify(name string, ti TensorInfo) error {
	if !tf.h.verified {
		return nil
	}
	tf.mu.Lock()
	done := tf.checked[name]
	tf.mu.Unlock()
	if done {
		return nil
	}
	hw := crc32.New(castagnoli)
	n := ti.DataOffsets[1] - ti.DataOffsets[0]
	if _, err := io.Copy(hw, io.NewSectionReader(tf.f, tf.h.size+ti.DataOffsets[0], n)); err != nil {
		return fmt.Errorf("%s: reading tensor %q: %w", tf.path, name, err)
	}
	if got, want := hw.Sum32(), tf.h.sums[name]; got != want {
		return fmt.Errorf("%s: tensor %q is corrupt: its data has CRC-32C %08x, the header records %08x", tf.path, name, got, want)
	}
	tf.mu.Lock()
	tf.checked[name] = true
	tf.mu.Unlock()
	return nil
}

// normBool makes Ferry's bools 0 or 1.
func normBool(dt ir.DType, b []byte) error {
	if dt == ir.Bool {
		for j, v := range b {
			if v != 0 {
				b[j] = 1
			}
		}
	}
	return nil
}

// window reads a tensor's bytes through a buffer of at most scratchBytes
// that holds a window of the file, so that short runs close together cost
// one read.
type window struct {
	f        *os.File
	base     int64 // the tensor's first byte
	end      int64 // one past its last
	buf      []byte
	from, to int64 // the file bytes buf holds
}

// convert reads n elements of dtype src at file offset off into dst as
// dtype dt.
func (w *window) convert(name string, src, dt ir.DType, dst []byte, off int64, n int) error {
	es, ds := src.Size(), dt.Size()
	for n > 0 {
		if src == dt && int64(n*es) >= scratchBytes {
			// A long run of the same dtype: straight into dst.
			if _, err := w.f.ReadAt(dst[:n*es], off); err != nil {
				return fmt.Errorf("reading tensor %q: %w", name, err)
			}
			return nil
		}
		if off < w.from || off+int64(es) > w.to {
			if w.buf == nil {
				w.buf = make([]byte, min(scratchBytes, w.end-w.base))
			}
			m := min(int64(len(w.buf)), w.end-off)
			m -= m % int64(es)
			if _, err := w.f.ReadAt(w.buf[:m], off); err != nil {
				return fmt.Errorf("reading tensor %q: %w", name, err)
			}
			w.from, w.to = off, off+m
		}
		k := min(n, int((w.to-off)/int64(es)))
		b := w.buf[off-w.from : off-w.from+int64(k*es)]
		if err := convertElems(dt, dst[:k*ds], src, b); err != nil {
			return fmt.Errorf("tensor %q: %w", name, err)
		}
		dst, off, n = dst[k*ds:], off+int64(k*es), n-k
	}
	return nil
}

// dest is the memory of a new array that a load writes into.
type dest struct {
	typ ir.Type
	mem []byte
	arr *trace.Array // the array whose memory mem is (CPU backend), or nil
	lit *ir.Literal  // the host literal to copy to the device, or nil
}

// newDest makes the memory of a new array of type typ. On the CPU backend
// it is a new array's own memory (its device or pinned_host pool), so that
// reading into it makes no copy; on others a host literal that finish
// copies to the device.
func newDest(typ ir.Type) (d *dest, err error) {
	d = &dest{typ: typ}
	if rt.DefaultBackend().Name() != "cpu" {
		d.lit = ir.NewLiteral(typ)
		d.mem = d.lit.Data
		return d, nil
	}
	defer trace.Recover(&err)
	a := trace.Zeros(typ.Shape, typ.DType)
	if typ.Space != a.Space() {
		b := trace.DevicePut(a, typ.Space)
		_ = a.Delete()
		a = b
	}
	l, err := a.Literal()
	if err != nil {
		return nil, err
	}
	d.arr, d.mem = a, l.Data
	return d, nil
}

// finish returns the array.
func (d *dest) finish() (a *trace.Array, err error) {
	if d.arr != nil {
		return d.arr, nil
	}
	if a, err = rt.FromLiteral(d.lit); err != nil {
		return nil, err
	}
	d.lit, d.mem = nil, nil
	if d.typ.Space != a.Space() {
		defer trace.Recover(&err)
		b := trace.DevicePut(a, d.typ.Space)
		_ = a.Delete()
		a = b
	}
	return a, nil
}

// discard frees the memory.
func (d *dest) discard() {
	if d.arr != nil {
		_ = d.arr.Delete()
	}
	d.arr, d.lit, d.mem = nil, nil, nil
}
