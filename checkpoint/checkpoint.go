// Package checkpoint saves and loads trees of arrays (parameters, optimizer
// states) in the safetensors format of Hugging Face, so that checkpoints can be
// read by other tools (safetensors, PyTorch, JAX) and Ferry can read theirs.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of a
// JSON header, then the raw tensor data, little-endian and row-major. The
// header maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
// end]} (offsets relative to the start of the data) and may hold string
// metadata under "__metadata__":
//
//	{"__metadata__":{"step":"100"},"W":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}
//
// Tensors are named by their path in the tree (trace.TreeDef.Paths): a
// struct {Layers []Layer; Opt optim.AdamState[Params]} saves tensors such as
// "Layers[0].W" and "Opt.Mu.Layers[0].W". Save writes the header with
// "__metadata__" first (when there is metadata) and the tensors in the tree's
// leaf order, their data in the same order and the header padded with spaces
// to a multiple of 8 bytes, as the reference implementation does.
//
// Reading checks a header before allocating anything it describes: at most
// MaxHeaderBytes of JSON, MaxTensors tensors, MaxRank dimensions per shape and
// MaxHeaderDims dimension values in all, each name once, offsets contiguous
// and within the input. A header over a limit is rejected in one pass over
// its bytes, with an error naming the tensor.
//
// # Integrity
//
// Every file Save writes carries, in "__metadata__" (string values, so
// other safetensors readers still read it), the CRC-32C (Castagnoli) of
// each tensor's data under "ferry.crc32c.<name>" and one of the header's
// content (every metadata key and value, every tensor's name, dtype, shape
// and offsets) under "ferry.header_crc32c"; user metadata keys may not
// begin with "ferry.". Load checks them and refuses a changed byte of data
// or a changed metadata value (such as "step"), naming the tensor, and
// refuses data after the last tensor. Files without "ferry." keys (written
// by other tools, such as Hugging Face's) load unverified. SaveFile and
// SaveSharded write each file to a temporary file (".checkpoint-*.tmp"),
// fsync it, rename it and fsync the directory, creating it with mode 0644
// less the umask (WithFileMode to change it); the next save or load of the
// directory removes the temporary files of saves that died (those no live
// save holds locked). A sharded save commits when its index is written;
// see SaveSharded.
//
// Supported dtypes: F32, F16, BF16, F64, I32, I64, U8, U32 and BOOL (Ferry's
// dtypes). Files with other dtypes can be inspected with ReadHeader but not
// loaded.
//
// Sharded arrays (rt.DevicePut, and jobs of several processes:
// rt.InitDistributed) are saved with SaveSharded into a directory: one
// safetensors file per process holding the blocks of its devices, each
// block once, and an index (Index, dir/index.json), written last, that
// commits the save: it names every data file with its size and header
// checksum and the save id every data file carries. A save killed at any
// point leaves the previous checkpoint loadable, and LoadSharded refuses a
// missing file, a wrong checksum or a file of another save, naming it. It
// reads the checkpoint back laid out as the tree it is given, which may
// shard the arrays otherwise or run on another process count.
//
// # Other tools' checkpoints
//
// Open reads the headers of a safetensors file or of a Hugging Face sharded
// set (HFIndexFile) and returns a Reader that reads one tensor by name at
// its offset, converting its dtype. LoadMapped loads such a checkpoint into
// a Go parameter tree through a Mapping (name patterns such as
// "encoder.layer.{i}.attention.self.query.weight" → "Encoder.Blocks.Attn.Q.W[{i}]",
// with splits of fused tensors and transposes), reading each tensor into
// its part of the leaf's array so that the parameters exist once, and
// listing everything that does not match in one error; SaveMapped writes a
// tree back under the mapping's names. Package nn/hf has the mappings of
// Hugging Face's BERT, GPT-2 and Llama.
package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/ferryml/ferry/internal/readsize"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// MaxHeaderBytes is the largest header Load and ReadHeader accept (100 MB,
// the limit of the reference implementation).
const MaxHeaderBytes = 100_000_000

// TensorInfo describes one tensor of a safetensors header.
type TensorInfo struct {
	// DType is the safetensors dtype name ("F32", "BF16", ...).
	DType string
	// Shape is the tensor's dimensions.
	Shape []int
	// DataOffsets are the tensor's begin and end byte offsets in the data that
	// follows the header.
	DataOffsets [2]int64
}

// Type returns the tensor's Ferry dtype and shape, or an error for a dtype
// Ferry does not support.
func (t TensorInfo) Type() (ir.Type, error) {
	dt, ok := dtypeOf[t.DType]
	if !ok {
		return ir.Type{}, fmt.Errorf("unsupported safetensors dtype %q", t.DType)
	}
	return ir.Type{DType: dt, Shape: ir.Shape(slices.Clone(t.Shape))}, nil
}

var dtypeNames = map[ir.DType]string{
	ir.Float32: "F32", ir.Float16: "F16", ir.BFloat16: "BF16", ir.Float64: "F64",
	ir.Int32: "I32", ir.Int64: "I64", ir.Uint8: "U8", ir.Uint32: "U32", ir.Bool: "BOOL",
}

var dtypeOf = func() map[string]ir.DType {
	m := map[string]ir.DType{}
	for d, n := range dtypeNames {
		m[n] = d
	}
	return m
}()

// otherDTypeSizes are element sizes of safetensors dtypes Ferry does not load,
// so that ReadHeader can still check their offsets.
var otherDTypeSizes = map[string]int64{"I8": 1, "U16": 2, "I16": 2, "U64": 8, "F8_E5M2": 1, "F8_E4M3": 1}

func elemSize(dtype string) (int64, bool) {
	if d, ok := dtypeOf[dtype]; ok {
		return int64(d.Size()), true
	}
	n, ok := otherDTypeSizes[dtype]
	return n, ok
}

// ---- saving ----

// Save writes tree (any tree of concrete arrays, see trace.Flatten) to w in the
// safetensors format, each leaf named by its path, with metadata (may be nil)
// as "__metadata__". Arrays in pinned host memory are saved like device ones.
func Save(w io.Writer, tree any, metadata map[string]string) error {
	leaves, def, err := trace.Flatten(tree)
	if err != nil {
		return fmt.Errorf("checkpoint.Save: %w", err)
	}
	paths := def.Paths()
	lits := make([]*ir.Literal, len(leaves))
	for i, a := range leaves {
		l, err := a.Literal()
		if err != nil {
			return fmt.Errorf("checkpoint.Save: %s: %w", paths[i], err)
		}
		lits[i] = l
	}
	if err := writeTensors(w, paths, lits, metadata, nil); err != nil {
		return fmt.Errorf("checkpoint.Save: %w", err)
	}
	return nil
}

// writeTensors writes the literals lits named names to w in the
// safetensors format, with the user's metadata (may be nil) and the
// internal keys (saveIDKey) in "__metadata__", beside a CRC-32C per tensor
// and one of the header's content.
func writeTensors(w io.Writer, names []string, lits []*ir.Literal, metadata, internal map[string]string) error {
	tensors := make(map[string]TensorInfo, len(names))
	sums := make(map[string]uint32, len(names))
	var off int64
	for i, l := range lits {
		name := names[i]
		if _, dup := tensors[name]; dup || name == "__metadata__" {
			return fmt.Errorf("duplicate or reserved tensor name %q", name)
		}
		n := int64(len(l.Data))
		tensors[name] = TensorInfo{DType: dtypeNames[l.Type.DType], Shape: l.Type.Shape, DataOffsets: [2]int64{off, off + n}}
		sums[name] = crc32.Checksum(l.Data, castagnoli)
		off += n
	}
	metadata, err := fullMetadata(metadata, internal, tensors, sums)
	if err != nil {
		return err
	}
	var hdr bytes.Buffer
	hdr.WriteString(`{"__metadata__":{`)
	keys := make([]string, 0, len(metadata))
	for k := range metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		if i > 0 {
			hdr.WriteByte(',')
		}
		writeJSONString(&hdr, k)
		hdr.WriteByte(':')
		writeJSONString(&hdr, metadata[k])
	}
	hdr.WriteByte('}')
	for _, name := range names {
		ti := tensors[name]
		hdr.WriteByte(',')
		writeJSONString(&hdr, name)
		fmt.Fprintf(&hdr, `:{"dtype":"%s","shape":[`, ti.DType)
		for j, d := range ti.Shape {
			if j > 0 {
				hdr.WriteByte(',')
			}
			fmt.Fprint(&hdr, d)
		}
		fmt.Fprintf(&hdr, `],"data_offsets":[%d,%d]}`, ti.DataOffsets[0], ti.DataOffsets[1])
	}
	hdr.WriteByte('}')
	for hdr.Len()%8 != 0 {
		hdr.WriteByte(' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(hdr.Len()))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(hdr.Bytes()); err != nil {
		return err
	}
	step("wrote the header")
	for i, l := range lits {
		// Literal data is little-endian (Ferry runs on little-endian machines).
		if _, err := w.Write(l.Data); err != nil {
			return fmt.Errorf("%s: %w", names[i], err)
		}
	}
	return nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	var tmp bytes.Buffer
	enc := json.NewEncoder(&tmp)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.Write(bytes.TrimSuffix(tmp.Bytes(), []byte("\n")))
}

// SaveFile is Save to a file at path, which it creates or replaces. The
// file is written to a temporary file beside it (".checkpoint-*.tmp"),
// synced to storage, renamed to path and the directory synced, so that
// after a crash path holds the previous checkpoint or the new one, never a
// part. Temporary files left in the directory by saves that died are
// removed. The file is created with mode 0644 (less the umask) unless
// WithFileMode says otherwise.
func SaveFile(path string, tree any, metadata map[string]string, opts ...Option) error {
	o := makeOptions(opts)
	dir := dirOf(path)
	removeStale(dir)
	var saveErr error
	err := writeAtomic(path, o.perm, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		if saveErr = Save(bw, tree, metadata); saveErr != nil {
			return saveErr
		}
		return bw.Flush()
	})
	if err != nil && err != saveErr {
		return fmt.Errorf("checkpoint.SaveFile: %w", err)
	}
	return err
}

func dirOf(path string) string {
	i := strings.LastIndexAny(path, `/`+string(os.PathSeparator))
	if i < 0 {
		return "."
	}
	if i == 0 {
		return path[:1]
	}
	return path[:i]
}

// ---- reading ----

// header is a parsed and checked safetensors header.
type header struct {
	tensors  map[string]TensorInfo
	meta     map[string]string // the user's metadata, once verifyHeader ran
	dataSize int64
	order    []string // tensor names by data offset

	verified bool              // the header holds Ferry's checksums and they matched
	sums     map[string]uint32 // each tensor's CRC-32C, when verified
	saveID   string            // saveIDKey's value, when verified
	size     int64             // the bytes of the length and the header
	crc      uint32            // their CRC-32C
}

// readHeader reads and checks the header. size is the number of bytes left in
// r, or -1 if unknown.
func readHeader(r io.Reader, size int64) (*header, error) {
	var lenBuf [8]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("truncated file: reading the header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderBytes {
		return nil, fmt.Errorf("header length %d exceeds the limit of %d bytes (not a safetensors file?)", n, MaxHeaderBytes)
	}
	if size >= 0 && int64(n) > size-8 {
		return nil, fmt.Errorf("truncated file: header length %d but only %d bytes follow", n, max(size-8, 0))
	}
	var hb []byte
	if size >= 0 {
		// The input holds n bytes more: read them into a buffer of that size.
		hb = make([]byte, n)
		if got, err := io.ReadFull(r, hb); err != nil {
			return nil, fmt.Errorf("truncated file: header length %d but only %d bytes follow", n, got)
		}
	} else {
		// Read through a growing buffer, so that a hostile length cannot make
		// us allocate more than the input holds.
		var buf bytes.Buffer
		if got, err := io.CopyN(&buf, r, int64(n)); err != nil {
			return nil, fmt.Errorf("truncated file: header length %d but only %d bytes follow", n, got)
		}
		hb = buf.Bytes()
	}
	h, err := parseHeader(hb)
	if err != nil {
		return nil, err
	}
	if size >= 0 && h.dataSize > size-8-int64(n) {
		return nil, fmt.Errorf("truncated file: the header describes %d bytes of data but only %d follow", h.dataSize, size-8-int64(n))
	}
	if size >= 0 && h.dataSize < size-8-int64(n) {
		return nil, fmt.Errorf("%d bytes of trailing data after the last tensor (the header describes %d bytes of data)", size-8-int64(n)-h.dataSize, h.dataSize)
	}
	if err := verifyHeader(h); err != nil {
		return nil, err
	}
	h.size = 8 + int64(n)
	h.crc = crc32.Update(crc32.Checksum(lenBuf[:], castagnoli), castagnoli, hb)
	return h, nil
}

// Limits on what one header may describe, checked while it is parsed, so a
// hostile header is rejected before what it describes is decoded. With
// MaxHeaderBytes they bound the time and memory of reading any header.
const (
	// MaxRank is the most dimensions a tensor may have: 64, NumPy's limit
	// (NPY_MAXDIMS).
	MaxRank = 64
	// MaxTensors is the most tensors one file may hold.
	MaxTensors = 1 << 20
	// MaxHeaderDims is the most dimension values the shapes of one header
	// may hold together (4 per tensor for MaxTensors tensors).
	MaxHeaderDims = 4 * MaxTensors
)

// headerLimits are the limits parseHeader applies (tests lower them).
var headerLimits = struct{ rank, tensors, dims int }{MaxRank, MaxTensors, MaxHeaderDims}

// dims is a JSON shape whose rank is checked before its values are decoded.
type dims []int64

// UnmarshalJSON counts the values of the array b (an upper bound, from its
// commas) before decoding them.
func (d *dims) UnmarshalJSON(b []byte) error {
	if n := bytes.Count(b, []byte{','}) + 1; n > headerLimits.rank {
		return fmt.Errorf("shape has %d dimensions, more than the limit of %d", n, headerLimits.rank)
	}
	return json.Unmarshal(b, (*[]int64)(d))
}

// isSyntaxError reports whether err from a json.Decoder means malformed JSON
// (rather than a value of the wrong type).
func isSyntaxError(err error) bool {
	var se *json.SyntaxError
	return errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// checkArrayLengths scans the header's JSON text once, without decoding it,
// and rejects the first array of more than limit values among the top three
// levels of nesting. In a safetensors header those arrays are shapes and
// data_offsets, so a longer one is a shape over the rank limit, and a header
// of millions of dimensions is rejected in one pass over its bytes before any
// of them is decoded. Malformed JSON is left to the decoder to report.
func checkArrayLengths(b []byte, limit int) error {
	var (
		depth   int
		isArray [4]bool   // whether the open value at depth 1..3 is an array
		commas  [4]int    // commas so far in the array at each depth
		key     [3][2]int // byte range of the last string at depths 1 and 2: the tensor's name, the field
	)
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			start := i
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 1 || depth == 2 {
				key[depth] = [2]int{start, min(i+1, len(b))}
			}
		case '{', '[':
			depth++
			if depth < len(isArray) {
				isArray[depth], commas[depth] = c == '[', 0
			}
		case '}', ']':
			depth = max(depth-1, 0)
		case ',':
			if depth > 0 && depth < len(isArray) && isArray[depth] {
				if commas[depth]++; commas[depth] >= limit {
					if depth == 3 {
						return fmt.Errorf("tensor %s: %s has more than %d values; a tensor's rank is at most %d",
							b[key[1][0]:key[1][1]], b[key[2][0]:key[2][1]], limit, limit)
					}
					return fmt.Errorf("invalid header: an array of more than %d values ending after byte %d", limit, i)
				}
			}
		}
	}
	return nil
}

// parseHeader parses the header's JSON object one entry at a time, checking
// the limits (tensor count, rank, dimension values) before decoding what an
// entry describes.
func parseHeader(b []byte) (*header, error) {
	if err := checkArrayLengths(b, headerLimits.rank); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if tok, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("invalid header JSON: %w", err)
	} else if tok != json.Delim('{') {
		return nil, fmt.Errorf("invalid header: it must be a JSON object, not one beginning with %v", tok)
	}
	h := &header{tensors: map[string]TensorInfo{}, meta: map[string]string{}}
	sawMeta := false
	totalDims := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("invalid header JSON: %w", err)
		}
		name := tok.(string) // object keys are strings
		if name == "__metadata__" {
			if sawMeta {
				return nil, errors.New(`invalid header: "__metadata__" appears twice`)
			}
			sawMeta = true
			if err := dec.Decode(&h.meta); err != nil {
				return nil, fmt.Errorf("invalid __metadata__ (must map strings to strings): %w", err)
			}
			if h.meta == nil {
				h.meta = map[string]string{}
			}
			continue
		}
		if _, dup := h.tensors[name]; dup {
			return nil, fmt.Errorf("invalid header: tensor %q appears twice", name)
		}
		if len(h.tensors) >= headerLimits.tensors {
			return nil, fmt.Errorf("the header describes more than %d tensors, the limit", headerLimits.tensors)
		}
		var ti struct {
			DType       string  `json:"dtype"`
			Shape       dims    `json:"shape"`
			DataOffsets []int64 `json:"data_offsets"`
		}
		if err := dec.Decode(&ti); err != nil {
			if isSyntaxError(err) {
				return nil, fmt.Errorf("invalid header JSON in tensor %q: %w", name, err)
			}
			return nil, fmt.Errorf("tensor %q: invalid header entry: %w", name, err)
		}
		if totalDims += len(ti.Shape); totalDims > headerLimits.dims {
			return nil, fmt.Errorf("tensor %q: the header's shapes hold more than %d dimension values, the limit", name, headerLimits.dims)
		}
		es, ok := elemSize(ti.DType)
		if !ok {
			return nil, fmt.Errorf("tensor %q: unknown dtype %q", name, ti.DType)
		}
		if ti.Shape == nil {
			return nil, fmt.Errorf("tensor %q: no shape", name)
		}
		if len(ti.DataOffsets) != 2 {
			return nil, fmt.Errorf("tensor %q: data_offsets must be [begin, end]", name)
		}
		nbytes := es
		shape := make([]int, len(ti.Shape))
		for i, d := range ti.Shape {
			if d < 0 || d > math.MaxInt32 {
				return nil, fmt.Errorf("tensor %q: invalid dimension %d in shape %v", name, d, ti.Shape)
			}
			shape[i] = int(d)
			if d != 0 && nbytes > math.MaxInt64/d {
				return nil, fmt.Errorf("tensor %q: shape %v is too large", name, ti.Shape)
			}
			nbytes *= d
		}
		b0, b1 := ti.DataOffsets[0], ti.DataOffsets[1]
		if b0 < 0 || b1 < b0 || b1-b0 != nbytes {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] do not hold %s%v (%d bytes)", name, b0, b1, ti.DType, ti.Shape, nbytes)
		}
		h.tensors[name] = TensorInfo{DType: ti.DType, Shape: shape, DataOffsets: [2]int64{b0, b1}}
		h.order = append(h.order, name)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("invalid header JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid header: data after the header's JSON object (only spaces may pad it)")
	}
	sort.Slice(h.order, func(i, j int) bool {
		a, b := h.tensors[h.order[i]].DataOffsets, h.tensors[h.order[j]].DataOffsets
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		return a[1] < b[1]
	})
	var end int64
	for _, name := range h.order {
		o := h.tensors[name].DataOffsets
		if o[0] != end {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a gap or overlap (expected to begin at %d)", name, o[0], o[1], end)
		}
		end = o[1]
	}
	h.dataSize = end
	return h, nil
}

// ReadHeader reads the header of a safetensors stream: the tensors by name and
// the metadata (empty if none). It checks the header as Load does (dtypes,
// shapes against offsets, offsets contiguous, its checksum, and, where the
// stream's size is known, no data after the last tensor) but reads no
// tensor data. The metadata is the user's: Ferry's checksum keys ("ferry.")
// are left out.
func ReadHeader(r io.Reader) (map[string]TensorInfo, map[string]string, error) {
	h, err := readHeader(r, readsize.Remaining(r))
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint.ReadHeader: %w", err)
	}
	return h.tensors, h.meta, nil
}

// Load reads a safetensors stream into a tree shaped like like: like gives the
// structure, the tensor names (its paths) and each tensor's dtype and shape,
// and its arrays are only read for those (zeros of the right shapes do). Nil
// arrays in like are not leaves and stay nil. The file must hold exactly the
// tensors of like with the same dtypes and shapes; otherwise the error names
// the tensor. Arrays are created in device memory, or in pinned host memory
// where like's array is there (an offloaded optimizer state loads offloaded).
// Use ReadHeader for the metadata.
func Load[T any](r io.Reader, like T) (T, error) {
	v, err := load(r, readsize.Remaining(r), like)
	if err != nil {
		var z T
		return z, fmt.Errorf("checkpoint.Load: %w", err)
	}
	return trace.UnflattenAs[T](v.def, v.leaves)
}

// LoadFile is Load from the file at path. Temporary files left beside it by
// saves that died (SaveFile) are removed.
func LoadFile[T any](path string, like T) (T, error) {
	var z T
	removeStale(dirOf(path))
	f, err := os.Open(path)
	if err != nil {
		return z, fmt.Errorf("checkpoint.LoadFile: %w", err)
	}
	defer f.Close()
	v, err := load(f, readsize.Remaining(f), like)
	if err != nil {
		return z, fmt.Errorf("checkpoint.LoadFile %s: %w", path, err)
	}
	return trace.UnflattenAs[T](v.def, v.leaves)
}

type loaded struct {
	leaves []*trace.Array
	def    *trace.TreeDef
}

func load(r io.Reader, size int64, like any) (*loaded, error) {
	leaves, def, err := trace.Flatten(like)
	if err != nil {
		return nil, err
	}
	paths := def.Paths()
	index := make(map[string]int, len(paths))
	for i, p := range paths {
		index[p] = i
	}
	h, err := readHeader(r, size)
	if err != nil {
		return nil, err
	}
	// Check names, dtypes and shapes before reading (and allocating) any data.
	var errs []error
	for i, p := range paths {
		ti, ok := h.tensors[p]
		if !ok {
			errs = append(errs, fmt.Errorf("tensor %q is missing from the file", p))
			continue
		}
		want := leaves[i]
		if want.IsTraced() {
			return nil, fmt.Errorf("tensor %q: like holds a traced array; load outside of traced functions", p)
		}
		typ, err := ti.Type()
		if err != nil {
			errs = append(errs, fmt.Errorf("tensor %q: %w", p, err))
			continue
		}
		if typ.DType != want.DType() || !slices.Equal(typ.Shape, want.Shape()) {
			errs = append(errs, fmt.Errorf("tensor %q is %v in the file, want %v", p, typ, ir.Type{DType: want.DType(), Shape: want.Shape()}))
		}
	}
	for _, name := range h.order {
		if _, ok := index[name]; !ok {
			errs = append(errs, fmt.Errorf("the file has tensor %q, which is not in the tree", name))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	out := make([]*trace.Array, len(leaves))
	ok := false
	defer func() {
		if !ok {
			for _, a := range out {
				if a != nil {
					_ = a.Delete()
				}
			}
		}
	}()
	for _, name := range h.order {
		i := index[name]
		want := leaves[i]
		l := ir.NewLiteral(ir.Type{DType: want.DType(), Shape: want.Shape()})
		if _, err := io.ReadFull(r, l.Data); err != nil {
			return nil, fmt.Errorf("truncated file: reading tensor %q: %w", name, err)
		}
		if err := checkTensor(h, name, l.Data); err != nil {
			return nil, err
		}
		if l.Type.DType == ir.Bool {
			for j, b := range l.Data { // Ferry's bools are 0 or 1
				if b != 0 {
					l.Data[j] = 1
				}
			}
		}
		a, err := rt.FromLiteral(l)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		if sp := want.Space(); sp != a.Space() {
			b := trace.DevicePut(a, sp)
			_ = a.Delete()
			a = b
		}
		out[i] = a
	}
	if size < 0 {
		// A stream of unknown size: it must end after the last tensor.
		var b [1]byte
		if n, _ := io.ReadFull(r, b[:]); n > 0 {
			return nil, errors.New("trailing data after the last tensor")
		}
	}
	ok = true
	return &loaded{leaves: out, def: def}, nil
}
