package checkpoint_test

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// rawTensor is a tensor of a file written as another tool would.
type rawTensor struct {
	name  string
	dtype string
	shape []int
	data  []byte
}

// writeRaw writes a safetensors file without Ferry's checksums (as
// Hugging Face's tools do) with the tensors in the given order.
func writeRaw(t *testing.T, path string, ts []rawTensor) {
	t.Helper()
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var data []byte
	for _, x := range ts {
		hdr[x.name] = map[string]any{"dtype": x.dtype, "shape": x.shape, "data_offsets": []int{len(data), len(data) + len(x.data)}}
		data = append(data, x.data...)
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// randWide returns normal values scaled by powers of two from 2⁻¹⁰ to 2⁹.
func randWide(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(20)-10)))
	}
	return v
}

// TestReadConversions reads tensors of every float dtype as every other
// and integers as integers, against conversions through float64.
func TestReadConversions(t *testing.T) {
	r := testseed.Rand(t, 1)
	n := 257
	src := randWide(r, n)
	src[0], src[1], src[2] = float32(math.Inf(-1)), 65519.99, 1e-8 // overflow and underflow in f16
	f64 := make([]byte, 8*n)
	f16 := make([]byte, 2*n)
	bf16 := make([]byte, 2*n)
	for i, x := range src {
		binary.LittleEndian.PutUint64(f64[8*i:], math.Float64bits(float64(x)))
		binary.LittleEndian.PutUint16(f16[2*i:], uint16(ir.F16FromFloat64(float64(x))))
		binary.LittleEndian.PutUint16(bf16[2*i:], uint16(ir.BF16FromFloat64(float64(x))))
	}
	ints := []int64{0, -1, 1 << 40, math.MaxInt32, math.MinInt32, 7}
	i64 := make([]byte, 8*len(ints))
	for i, v := range ints {
		binary.LittleEndian.PutUint64(i64[8*i:], uint64(v))
	}
	small := []int64{0, -1, math.MaxInt32, math.MinInt32}
	i64s := make([]byte, 8*len(small))
	for i, v := range small {
		binary.LittleEndian.PutUint64(i64s[8*i:], uint64(v))
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	writeRaw(t, path, []rawTensor{
		{"f32", "F32", []int{n}, f32Bytes(src)}, {"f64", "F64", []int{n}, f64},
		{"f16", "F16", []int{n}, f16}, {"bf16", "BF16", []int{n}, bf16},
		{"big", "I64", []int{len(ints)}, i64}, {"small", "I64", []int{len(small)}, i64s},
	})
	rd, err := checkpoint.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	// The value of element i of a stored tensor, exactly.
	stored := map[string]func(i int) float64{
		"f32":  func(i int) float64 { return float64(src[i]) },
		"f64":  func(i int) float64 { return float64(src[i]) },
		"f16":  func(i int) float64 { return ir.F16FromFloat64(float64(src[i])).Float64() },
		"bf16": func(i int) float64 { return ir.BF16FromFloat64(float64(src[i])).Float64() },
	}
	// The value of x rounded to dtype dt (through float64: the reference).
	round := map[ir.DType]func(x float64) float64{
		ir.Float64:  func(x float64) float64 { return x },
		ir.Float32:  func(x float64) float64 { return float64(float32(x)) },
		ir.Float16:  func(x float64) float64 { return ir.F16FromFloat64(x).Float64() },
		ir.BFloat16: func(x float64) float64 { return ir.BF16FromFloat64(x).Float64() },
	}
	for name, get := range stored {
		for dt, rnd := range round {
			l, err := rd.Read(name, dt)
			if err != nil {
				t.Fatalf("%s as %v: %v", name, dt, err)
			}
			for i := range n {
				var got float64
				switch dt {
				case ir.Float64:
					got = ir.View[float64](l)[i]
				case ir.Float32:
					got = float64(ir.View[float32](l)[i])
				case ir.Float16:
					got = ir.F16(binary.LittleEndian.Uint16(l.Data[2*i:])).Float64()
				case ir.BFloat16:
					got = ir.BF16(binary.LittleEndian.Uint16(l.Data[2*i:])).Float64()
				}
				// A double rounding (f64 → f32 → f16) may differ from one
				// rounding; the stored 16-bit values are exact in f32 anyway.
				want := rnd(get(i))
				if got != want && !(name == "f64" && (dt == ir.Float16 || dt == ir.BFloat16)) {
					t.Fatalf("seed %d: %s[%d] = %v as %v: got %v, want %v", testseed.Seed(t), name, i, get(i), dt, got, want)
				}
			}
		}
	}
	l, err := rd.Read("small", ir.Int32)
	if err != nil {
		t.Fatal(err)
	}
	if got := ir.View[int32](l); !slices.Equal(got, []int32{0, -1, math.MaxInt32, math.MinInt32}) {
		t.Errorf("I64 as I32: %v", got)
	}
	if _, err := rd.Read("big", ir.Int32); err == nil || !strings.Contains(err.Error(), "1099511627776") {
		t.Errorf("I64 2^40 as I32: %v", err)
	}
	if _, err := rd.Read("f32", ir.Int32); err == nil || !strings.Contains(err.Error(), "cannot convert") {
		t.Errorf("F32 as I32: %v", err)
	}
	if _, err := rd.Read("nope", ir.Float32); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("a missing tensor: %v", err)
	}
}

type stackTree struct {
	Q, K, V *trace.Array // [L, d, d] parts of a fused [d, 3d] per layer
	B       *trace.Array // [L, 3, d]: the fused bias, split into 3 rows
	T       *trace.Array // [c, r]: the transpose of a [r, c] tensor
	E       *trace.Array // whole, f16 in the file
}

// TestLoadMappedParts loads fused, stacked and transposed tensors large
// enough to pass through the read buffer several times, against the values
// picked out in Go, and saves them back byte for byte.
func TestLoadMappedParts(t *testing.T) {
	r := testseed.Rand(t, 2)
	const L, d, rows, cols = 2, 300, 700, 500 // the fused [300, 900] is 1.08 MB; the transposed 1.4 MB
	fused := make([][]float32, L)
	bias := make([][]float32, L)
	var ts []rawTensor
	for i := range L {
		fused[i], bias[i] = randWide(r, d*3*d), randWide(r, 3*d)
		ts = append(ts,
			rawTensor{"h." + string(rune('0'+i)) + ".qkv", "F32", []int{d, 3 * d}, f32Bytes(fused[i])},
			rawTensor{"h." + string(rune('0'+i)) + ".qkv_bias", "F32", []int{3 * d}, f32Bytes(bias[i])})
	}
	tr := randWide(r, rows*cols)
	e := randWide(r, 10)
	e16 := make([]byte, 20)
	for i, x := range e {
		binary.LittleEndian.PutUint16(e16[2*i:], uint16(ir.F16FromFloat64(float64(x))))
	}
	ts = append(ts, rawTensor{"t", "F32", []int{rows, cols}, f32Bytes(tr)}, rawTensor{"e", "F16", []int{10}, e16},
		rawTensor{"buffer", "I64", []int{3}, make([]byte, 24)})
	r.Shuffle(len(ts), func(i, j int) { ts[i], ts[j] = ts[j], ts[i] })
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	writeRaw(t, path, ts)

	m := checkpoint.Mapping{Ignore: []string{"buf*"}}
	for p, f := range []string{"Q", "K", "V"} {
		m.Rules = append(m.Rules,
			checkpoint.Rule{File: "h.{i}.qkv", Tree: f + "[{i}]", Split: checkpoint.Split{Axis: 1, Part: p, Parts: 3}},
			checkpoint.Rule{File: "h.{i}.qkv_bias", Tree: "B[{i}][" + string(rune('0'+p)) + "]", Split: checkpoint.Split{Axis: 0, Part: p, Parts: 3}})
	}
	m.Rules = append(m.Rules, checkpoint.Rule{File: "t", Tree: "T", Transpose: true}, checkpoint.Rule{File: "e", Tree: "E"})
	abs := func(dt ir.DType, s ...int) *trace.Array { return trace.Abstract(ir.TypeOf(dt, s...)) }
	like := stackTree{Q: abs(ir.Float32, L, d, d), K: abs(ir.Float32, L, d, d), V: abs(ir.Float32, L, d, d),
		B: abs(ir.Float32, L, 3, d), T: abs(ir.Float32, cols, rows), E: abs(ir.Float32, 10)}
	got, err := checkpoint.LoadMappedFile(path, like, m)
	if err != nil {
		t.Fatal(err)
	}
	seed := testseed.Seed(t)
	for p, a := range []*trace.Array{got.Q, got.K, got.V} {
		v := a.Float32s()
		for i := range L {
			for x := range d {
				for y := range d {
					if w := fused[i][x*3*d+p*d+y]; v[(i*d+x)*d+y] != w {
						t.Fatalf("seed %d: part %d [%d,%d,%d] = %v, want %v", seed, p, i, x, y, v[(i*d+x)*d+y], w)
					}
				}
			}
		}
	}
	if b := got.B.Float32s(); !slices.Equal(b[:3*d], bias[0]) || !slices.Equal(b[3*d:], bias[1]) {
		t.Errorf("seed %d: the split biases differ", seed)
	}
	tv := got.T.Float32s()
	for x := range rows {
		for y := range cols {
			if tv[y*rows+x] != tr[x*cols+y] {
				t.Fatalf("seed %d: T[%d,%d] = %v, want %v", seed, y, x, tv[y*rows+x], tr[x*cols+y])
			}
		}
	}
	for i, x := range got.E.Float32s() {
		if want := float32(ir.F16FromFloat64(float64(e[i])).Float64()); x != want {
			t.Errorf("E[%d] = %v, want %v", i, x, want)
		}
	}

	// Saved back under the file's names: the same tensors (the f16 one as
	// f32, the ignored buffer not at all).
	back := filepath.Join(dir, "back.safetensors")
	if err := checkpoint.SaveMapped(back, got, m, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	orig, _ := checkpoint.Open(path)
	defer orig.Close()
	saved, err := checkpoint.Open(back)
	if err != nil {
		t.Fatal(err)
	}
	defer saved.Close()
	if want := []string{"e", "h.0.qkv", "h.0.qkv_bias", "h.1.qkv", "h.1.qkv_bias", "t"}; !slices.Equal(saved.Names(), want) {
		t.Fatalf("saved %v, want %v", saved.Names(), want)
	}
	for _, n := range saved.Names() {
		a, _ := saved.Read(n, ir.Float32)
		b, _ := orig.Read(n, ir.Float32)
		if !slices.Equal(a.Type.Shape, b.Type.Shape) || !slices.Equal(a.Data, b.Data) {
			t.Errorf("seed %d: %s saved as %v differs from the original %v", seed, n, a.Type, b.Type)
		}
	}
}

// TestLoadMappedVerified: a file Ferry wrote is verified, also when only
// a part of a tensor is read.
func TestLoadMappedVerified(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	type tree struct{ W *trace.Array }
	w := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	if err := checkpoint.SaveFile(path, tree{W: w}, nil); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	data[len(data)-1] ^= 0x40
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	like := struct{ A, B *trace.Array }{trace.Abstract(ir.TypeOf(ir.Float32, 2, 1)), trace.Abstract(ir.TypeOf(ir.Float32, 3, 2))}
	m := checkpoint.Mapping{Rules: []checkpoint.Rule{{File: "W", Tree: "A"}, {File: "W", Tree: "B", Transpose: true}}}
	m.Rules[0].Split = checkpoint.Split{Axis: 1, Part: 0, Parts: 3}
	_, err := checkpoint.LoadMappedFile(path, like, m)
	if err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("a corrupt tensor read in part: %v", err)
	}
	r, err := checkpoint.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Read("W", ir.Float32); err == nil || !strings.Contains(err.Error(), `tensor "W" is corrupt`) {
		t.Errorf("a corrupt tensor read whole: %v", err)
	}
}

// TestOpenIndex: a Hugging Face index must agree with its files.
func TestOpenIndex(t *testing.T) {
	dir := t.TempDir()
	writeRaw(t, filepath.Join(dir, "a.safetensors"), []rawTensor{{"x", "F32", []int{1}, f32Bytes([]float32{1})}, {"y", "F32", []int{1}, f32Bytes([]float32{2})}})
	writeRaw(t, filepath.Join(dir, "b.safetensors"), []rawTensor{{"z", "F32", []int{1}, f32Bytes([]float32{3})}})
	index := func(m map[string]string) {
		data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 12}, "weight_map": m})
		if err := os.WriteFile(filepath.Join(dir, checkpoint.HFIndexFile), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	index(map[string]string{"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"})
	r, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Names(); !slices.Equal(got, []string{"x", "y", "z"}) || r.Metadata()["total_size"] != "12" {
		t.Errorf("names %v, metadata %v", got, r.Metadata())
	}
	if z, err := r.Read("z", ir.Float32); err != nil || ir.View[float32](z)[0] != 3 {
		t.Errorf("z: %v %v", z, err)
	}
	if z, err := r.ReadArray("z", ir.Float16); err != nil || z.Type().String() != "f16[1]" || z.Item() != 3 {
		t.Errorf("z as an f16 array: %v %v", z, err)
	}
	r.Close()
	index(map[string]string{"x": "a.safetensors", "z": "a.safetensors"})
	_, err = checkpoint.Open(dir)
	for _, want := range []string{`maps tensor "z" to a.safetensors, which does not hold it`, `holds tensor "y", which index`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a wrong index: the error does not say %q: %v", want, err)
		}
	}
	index(map[string]string{"x": "../a.safetensors"})
	if _, err := checkpoint.Open(dir); err == nil || !strings.Contains(err.Error(), "beside the index") {
		t.Errorf("a file outside the directory: %v", err)
	}
}

// TestLoadMappedDestinations: arrays load where like's are (pinned_host
// too), kept leaves keep like's arrays, a bad mapping is named.
func TestLoadMappedDestinations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	writeRaw(t, path, []rawTensor{{"w", "F32", []int{2}, f32Bytes([]float32{1, 2})}})
	host := trace.DevicePut(rt.FromSlice([]float32{0, 0}, 2), ir.PinnedHost)
	like := struct{ W, Keep *trace.Array }{host, rt.FromSlice([]float32{9}, 1)}
	m := checkpoint.Mapping{Rules: []checkpoint.Rule{{File: "w", Tree: "W"}}}
	if _, err := checkpoint.LoadMappedFile(path, like, m); err == nil || !strings.Contains(err.Error(), "leaf Keep (f32[1]) is not in the file (no rule maps a file tensor to it)") {
		t.Errorf("a leaf without a tensor: %v", err)
	}
	got, err := checkpoint.LoadMappedFile(path, like, m, checkpoint.KeepLeaves("Ke*"))
	if err != nil {
		t.Fatal(err)
	}
	if got.W.Space() != ir.PinnedHost || !slices.Equal(got.W.Float32s(), []float32{1, 2}) || got.Keep != like.Keep {
		t.Errorf("W %v %v, Keep %v", got.W.Type(), got.W.Float32s(), got.Keep)
	}
	bad := checkpoint.Mapping{Rules: []checkpoint.Rule{{File: "w.{i}", Tree: "W"}}}
	if _, err := checkpoint.LoadMappedFile(path, like, bad); err == nil || !strings.Contains(err.Error(), "the same placeholders") {
		t.Errorf("a rule with a placeholder on one side: %v", err)
	}
}
