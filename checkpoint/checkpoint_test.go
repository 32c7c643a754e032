package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The header and data of a small tree, written by hand from the safetensors
// format description.
func TestSaveBytesExact(t *testing.T) {
	tree := struct{ A, B *trace.Array }{rt.FromSlice([]float32{1, 2}), rt.FromScalar(int32(7))}
	var buf bytes.Buffer
	require.NoError(t, checkpoint.Save(&buf, tree, map[string]string{"format": "pt"}))

	// Each tensor's CRC-32C (Castagnoli) of its data bytes is in the
	// metadata, beside the header's checksum (checked by TestHeaderFlips).
	crcA := crc32.Checksum([]byte("\x00\x00\x80\x3f\x00\x00\x00\x40"), crc32.MakeTable(crc32.Castagnoli))
	crcB := crc32.Checksum([]byte("\x07\x00\x00\x00"), crc32.MakeTable(crc32.Castagnoli))
	out := buf.String()
	i := strings.Index(out, `"ferry.header_crc32c":"`) + len(`"ferry.header_crc32c":"`)
	require.Greater(t, i, 30)
	headerSum := out[i : i+8]
	hdr := fmt.Sprintf(`{"__metadata__":{"ferry.crc32c.A":"%08x","ferry.crc32c.B":"%08x","ferry.header_crc32c":"%s","format":"pt"},`, crcA, crcB, headerSum) +
		`"A":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},` +
		`"B":{"dtype":"I32","shape":[],"data_offsets":[8,12]}}` +
		"     " // 227 bytes padded to 232
	want := "\xe8\x00\x00\x00\x00\x00\x00\x00" + hdr +
		"\x00\x00\x80\x3f" + "\x00\x00\x00\x40" + // f32 1, 2
		"\x07\x00\x00\x00" // i32 7
	require.Equal(t, want, out)

	// Without metadata, __metadata__ holds only the checksums.
	buf.Reset()
	require.NoError(t, checkpoint.Save(&buf, struct{ X *trace.Array }{rt.FromSlice([]uint8{1, 2, 3})}, nil))
	require.Contains(t, buf.String(), fmt.Sprintf(`{"__metadata__":{"ferry.crc32c.X":"%08x","ferry.header_crc32c":"`,
		crc32.Checksum([]byte{1, 2, 3}, crc32.MakeTable(crc32.Castagnoli))))
	n := binary.LittleEndian.Uint64(buf.Bytes())
	require.Zero(t, n%8, "the header is padded to a multiple of 8 bytes")
	require.Equal(t, `"X":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}`, strings.TrimRight(buf.String()[8:8+n], " ")[strings.Index(buf.String(), `"X":`)-8:])
	require.Equal(t, "\x01\x02\x03", buf.String()[8+n:])

	// And it reads back.
	infos, meta, err := checkpoint.ReadHeader(bytes.NewReader([]byte(want)))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"format": "pt"}, meta)
	require.Equal(t, map[string]checkpoint.TensorInfo{
		"A": {DType: "F32", Shape: []int{2}, DataOffsets: [2]int64{0, 8}},
		"B": {DType: "I32", Shape: []int{}, DataOffsets: [2]int64{8, 12}},
	}, infos)
	got, err := checkpoint.Load(strings.NewReader(want), tree)
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2}, got.A.Float32s())
	require.Equal(t, []int32{7}, got.B.Int32s())
}

// AllTypes has one leaf of every dtype.
type AllTypes struct {
	F32  *trace.Array
	F16  *trace.Array
	BF16 *trace.Array
	F64  *trace.Array
	I32  *trace.Array
	I64  *trace.Array
	U8   *trace.Array
	U32  *trace.Array
	Bool *trace.Array
	Nil  *trace.Array // a None leaf: not saved, loads as nil
}

type Layer struct{ W, B *trace.Array }

type Model struct {
	Layers []Layer
	Embed  map[string]*trace.Array
}

type Checkpoint struct {
	Params Model
	Opt    optim.AdamState[Model]
	All    AllTypes
	Step   int // static: not saved
}

func randF32(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func newCheckpoint(t *testing.T, r *rand.Rand) Checkpoint {
	model := Model{
		Layers: []Layer{
			{W: rt.FromSlice(randF32(r, 12), 3, 4), B: rt.FromSlice(randF32(r, 4), 4)},
			{W: rt.FromSlice(randF32(r, 8), 4, 2), B: rt.FromSlice(randF32(r, 2), 2)},
		},
		Embed: map[string]*trace.Array{"tok": rt.FromSlice(randF32(r, 6), 3, 2)},
	}
	opt := optim.Adam[Model](optim.Constant(0.1), 0.9, 0.999, 1e-8)
	st, err := opt.Init(model)
	require.NoError(t, err)
	for range 2 { // non-trivial moments and count
		g, err := trace.MapAs(model, func(x *trace.Array) *trace.Array {
			return rt.FromSlice(randF32(r, x.Size()), x.Shape()...)
		})
		require.NoError(t, err)
		_, st, err = opt.Update(g, st, model)
		require.NoError(t, err)
	}
	f := rt.FromSlice(randF32(r, 6), 2, 3)
	return Checkpoint{
		Params: model,
		Opt:    st,
		All: AllTypes{
			F32:  f,
			F16:  trace.Convert(f, ir.Float16),
			BF16: trace.Convert(f, ir.BFloat16),
			F64:  rt.FromSlice([]float64{1e300, -2.5, 3}),
			I32:  rt.FromSlice([]int32{-1, 1 << 30}, 2, 1),
			I64:  rt.FromSlice([]int64{-1 << 60, 5}),
			U8:   rt.FromSlice([]uint8{0, 255}),
			U32:  rt.FromSlice([]uint32{1 << 31}),
			Bool: rt.FromSlice([]bool{true, false, true}),
		},
		Step: 2,
	}
}

func requireSameTree(t *testing.T, want, got any) {
	t.Helper()
	lw, dw, err := trace.Flatten(want)
	require.NoError(t, err)
	lg, dg, err := trace.Flatten(got)
	require.NoError(t, err)
	require.Equal(t, dw.Paths(), dg.Paths())
	for i := range lw {
		a, err := lw[i].Literal()
		require.NoError(t, err)
		b, err := lg[i].Literal()
		require.NoError(t, err)
		require.Equal(t, a.Type.DType, b.Type.DType, dw.Paths()[i])
		require.Equal(t, a.Type.Shape, b.Type.Shape, dw.Paths()[i])
		require.Equal(t, a.Data, b.Data, dw.Paths()[i])
	}
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ck := newCheckpoint(t, r)
	var buf bytes.Buffer
	require.NoError(t, checkpoint.Save(&buf, ck, map[string]string{"step": "2"}))

	infos, meta, err := checkpoint.ReadHeader(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.Equal(t, "2", meta["step"])
	for _, name := range []string{"Params.Layers[0].W", `Params.Embed["tok"]`, "Opt.Mu.Layers[1].B", `Opt.Nu.Embed["tok"]`, "Opt.Count", "All.BF16"} {
		require.Contains(t, infos, name)
	}
	require.Equal(t, "BF16", infos["All.BF16"].DType)
	require.Equal(t, "BOOL", infos["All.Bool"].DType)
	require.Equal(t, "I32", infos["Opt.Count"].DType)
	require.Len(t, infos, 5+5+5+1+9)

	// Load into a zeroed tree of the same shapes.
	like, err := trace.MapAs(ck, func(x *trace.Array) *trace.Array { return trace.ZerosLike(x) })
	require.NoError(t, err)
	like.Step = 0
	got, err := checkpoint.Load(bytes.NewReader(buf.Bytes()), like)
	require.NoError(t, err)
	requireSameTree(t, ck, got)
	require.Nil(t, got.All.Nil)
	require.Equal(t, 0, got.Step, "static values come from like")
	require.Equal(t, []int32{2}, got.Opt.Count.Int32s())

	// Through a file, with the optimizer state offloaded: it loads offloaded
	// into a like made in pinned_host by InitIn.
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	off := ck
	off.Opt, err = optim.ToSpace(ck.Opt, ir.PinnedHost)
	require.NoError(t, err)
	require.NoError(t, checkpoint.SaveFile(path, off, nil))
	likeOff := like
	likeOff.Opt, err = optim.InitIn(optim.Adam[Model](optim.Constant(0.1), 0.9, 0.999, 1e-8), like.Params, ir.PinnedHost)
	require.NoError(t, err)
	got, err = checkpoint.LoadFile(path, likeOff)
	require.NoError(t, err)
	requireSameTree(t, ck, got)
	require.Equal(t, ir.PinnedHost, got.Opt.Mu.Layers[0].W.Space())
	require.Equal(t, ir.Device, got.Params.Layers[0].W.Space())

	// The loaded state continues training like the saved one.
	opt := optim.Adam[Model](optim.Constant(0.1), 0.9, 0.999, 1e-8)
	u1, _, err := opt.Update(ck.Params, ck.Opt, ck.Params)
	require.NoError(t, err)
	u2, _, err := opt.Update(got.Params, got.Opt, got.Params)
	require.NoError(t, err)
	requireSameTree(t, u1, u2)
}

func saved(t *testing.T, tree any) []byte {
	var buf bytes.Buffer
	require.NoError(t, checkpoint.Save(&buf, tree, nil))
	return buf.Bytes()
}

func TestLoadErrors(t *testing.T) {
	type P struct{ W, B *trace.Array }
	p := P{W: rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3), B: rt.FromSlice([]float32{1, 2})}
	data := saved(t, p)

	// Truncated anywhere: in the length, the header, or the data; with a
	// reader whose size is known and one whose size is not.
	for _, n := range []int{0, 4, 8, 20, len(data) - 33, len(data) - 1} {
		_, err := checkpoint.Load(bytes.NewReader(data[:n]), p)
		require.ErrorContains(t, err, "truncated", "cut at %d", n)
		_, err = checkpoint.Load(io.MultiReader(bytes.NewReader(data[:n])), p)
		require.ErrorContains(t, err, "truncated", "cut at %d (unsized)", n)
	}

	// Wrong shape, wrong dtype.
	_, err := checkpoint.Load(bytes.NewReader(data), P{W: rt.FromSlice(make([]float32, 6), 3, 2), B: p.B})
	require.ErrorContains(t, err, `tensor "W" is f32[2,3] in the file, want f32[3,2]`)
	_, err = checkpoint.Load(bytes.NewReader(data), P{W: p.W, B: rt.FromSlice([]float64{0, 0})})
	require.ErrorContains(t, err, `tensor "B" is f32[2] in the file, want f64[2]`)

	// Missing and unexpected names.
	type Q struct{ W, B, C *trace.Array }
	_, err = checkpoint.Load(bytes.NewReader(data), Q{W: p.W, B: p.B, C: p.B})
	require.ErrorContains(t, err, `tensor "C" is missing from the file`)
	_, err = checkpoint.Load(bytes.NewReader(data), struct{ W *trace.Array }{p.W})
	require.ErrorContains(t, err, `the file has tensor "B", which is not in the tree`)

	// Bad headers.
	withHeader := func(h string, rest string) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
		return append(append(b, h...), rest...)
	}
	for h, msg := range map[string]string{
		`{"W":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}`:                              "do not hold",
		`{"W":{"dtype":"F32","shape":[2,3],"data_offsets":[4,28]}}`:                              "gap or overlap",
		`{"W":{"dtype":"X9","shape":[2,3],"data_offsets":[0,24]}}`:                               "unknown dtype",
		`{"W":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]}}`:                             "invalid dimension",
		`{"W":{"dtype":"F32","shape":[2,3]}}`:                                                    "data_offsets",
		`{"W":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"x":1}}`:                        "invalid header entry",
		`{"__metadata__":{"a":1}}`:                                                               "__metadata__",
		`{"W":`:                                                                                  "invalid header JSON",
		`{"W":{"dtype":"F32","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,24]}}`: "too large",
		`{"W":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"B":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}`: "gap or overlap",
	} {
		_, err := checkpoint.Load(bytes.NewReader(withHeader(h, strings.Repeat("\x00", 32))), p)
		require.ErrorContains(t, err, msg, h)
	}
	// A file with a dtype Ferry lacks can be inspected, not loaded.
	i16 := withHeader(`{"W":{"dtype":"I16","shape":[2,3],"data_offsets":[0,12]}}`, strings.Repeat("\x00", 12))
	infos, _, err := checkpoint.ReadHeader(bytes.NewReader(i16))
	require.NoError(t, err)
	require.Equal(t, "I16", infos["W"].DType)
	_, err = checkpoint.Load(bytes.NewReader(i16), struct{ W *trace.Array }{p.W})
	require.ErrorContains(t, err, `tensor "W": unsupported safetensors dtype "I16"`)
}

// Hostile lengths never make Load allocate more than the input holds.
func TestHostileHeaderLength(t *testing.T) {
	p := struct{ W *trace.Array }{rt.FromSlice([]float32{1})}
	huge := binary.LittleEndian.AppendUint64(nil, 1<<62)
	_, err := checkpoint.Load(bytes.NewReader(huge), p)
	require.ErrorContains(t, err, "exceeds the limit")

	claim := binary.LittleEndian.AppendUint64(nil, 90_000_000) // under the limit, but absent
	claim = append(claim, `{"W":`...)
	_, err = checkpoint.Load(bytes.NewReader(claim), p)
	require.ErrorContains(t, err, "truncated")

	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	_, err = checkpoint.Load(io.MultiReader(bytes.NewReader(claim)), p) // size unknown
	goruntime.ReadMemStats(&after)
	require.ErrorContains(t, err, "truncated")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated")

	// A header claiming a huge tensor is rejected before its data is allocated.
	h := `{"W":{"dtype":"F64","shape":[1000000000],"data_offsets":[0,8000000000]}}`
	big := append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...)
	goruntime.ReadMemStats(&before)
	_, err = checkpoint.Load(io.MultiReader(bytes.NewReader(big)), p)
	goruntime.ReadMemStats(&after)
	require.ErrorContains(t, err, `tensor "W" is f64[1000000000] in the file, want f32[1]`)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated")
	_, _, err = checkpoint.ReadHeader(bytes.NewReader(big))
	require.ErrorContains(t, err, "truncated file: the header describes 8000000000 bytes of data but only 0 follow")
}

func TestSaveErrors(t *testing.T) {
	err := checkpoint.SaveFile(filepath.Join(t.TempDir(), "no", "such", "dir", "x.safetensors"), struct{}{}, nil)
	require.Error(t, err)

	// A failed save leaves neither the file nor its temporary.
	dir := t.TempDir()
	a := rt.FromSlice([]float32{1})
	require.NoError(t, a.Delete())
	require.Error(t, checkpoint.SaveFile(filepath.Join(dir, "x.safetensors"), a, nil))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries)

	// Traced arrays cannot be saved.
	f := rt.Jit(func(x *trace.Array) (*trace.Array, error) {
		return x, checkpoint.Save(io.Discard, x, nil)
	})
	_, err = f(rt.FromSlice([]float32{1}))
	require.ErrorContains(t, err, "traced")
}
