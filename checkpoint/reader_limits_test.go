package checkpoint

import (
	"bytes"
	"encoding/binary"
	"fmt"
	goruntime "runtime"
	"strings"
	"testing"
)

// shapeHeader is a safetensors file (header and data) of one U8 tensor "x"
// of rank ones, so it holds one byte whatever the rank.
func shapeHeader(rank int) []byte {
	var h strings.Builder
	h.WriteString(`{"x":{"dtype":"U8","shape":[`)
	for i := range rank {
		if i > 0 {
			h.WriteByte(',')
		}
		h.WriteByte('1')
	}
	h.WriteString(`],"data_offsets":[0,1]}}`)
	return file(h.String(), "\x07")
}

// file is a safetensors file of header h and data.
func file(h, data string) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(b, h...), data...)
}

// tensorsHeader is a file of n U8 scalars of rank dims each (all ones).
func tensorsHeader(n, rank int) []byte {
	var h strings.Builder
	h.WriteByte('{')
	for i := range n {
		if i > 0 {
			h.WriteByte(',')
		}
		fmt.Fprintf(&h, `"t%d":{"dtype":"U8","shape":[%s],"data_offsets":[%d,%d]}`,
			i, strings.TrimSuffix(strings.Repeat("1,", rank), ","), i, i+1)
	}
	h.WriteByte('}')
	return file(h.String(), strings.Repeat("\x00", n))
}

// TestHeaderRankLimit: a shape of more than MaxRank dimensions is rejected,
// before its dimensions are decoded.
func TestHeaderRankLimit(t *testing.T) {
	if MaxRank != 64 {
		t.Fatalf("MaxRank = %d, the documented limit is 64", MaxRank)
	}
	infos, _, err := ReadHeader(bytes.NewReader(shapeHeader(MaxRank)))
	if err != nil || len(infos["x"].Shape) != MaxRank {
		t.Fatalf("rank %d: %v", MaxRank, err)
	}
	want := fmt.Sprintf(`tensor "x": "shape" has more than %d values; a tensor's rank is at most %d`, MaxRank, MaxRank)
	for _, rank := range []int{MaxRank + 1, 1000} {
		_, _, err := ReadHeader(bytes.NewReader(shapeHeader(rank)))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("rank %d: err = %v, want one containing %q", rank, err, want)
		}
	}

	// A million dimensions (a 2 MB header; the reported one had 50 million
	// in 100 MB) are rejected without decoding them: reading the header
	// allocates its bytes and little more, not the 16 bytes per dimension
	// and more of decoding them (60 MB before the limit).
	in := shapeHeader(1_000_000)
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	_, _, err = ReadHeader(bytes.NewReader(in))
	goruntime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 3*uint64(len(in))/2 {
		t.Fatalf("rejecting a %d-byte header allocated %d bytes", len(in), got)
	}

	// Shapes nested in arrays (a type error anyway) are counted when decoded.
	nested := `{"x":{"dtype":"U8","shape":[[` + strings.TrimSuffix(strings.Repeat("1,", MaxRank+1), ",") + `]],"data_offsets":[0,1]}}`
	_, _, err = ReadHeader(bytes.NewReader(file(nested, "\x07")))
	if err == nil || !strings.Contains(err.Error(), `tensor "x": invalid header entry: shape has 65 dimensions, more than the limit of 64`) {
		t.Fatalf("nested: err = %v", err)
	}
}

// withLimits runs f with the header limits lowered to tensors and dims.
func withLimits(t *testing.T, tensors, dims int, f func()) {
	t.Helper()
	saved := headerLimits
	defer func() { headerLimits = saved }()
	headerLimits.tensors, headerLimits.dims = tensors, dims
	f()
}

// TestHeaderTensorLimit: a header of more tensors than the limit is
// rejected as soon as the entry past the limit is reached.
func TestHeaderTensorLimit(t *testing.T) {
	withLimits(t, 5, 1000, func() {
		if infos, _, err := ReadHeader(bytes.NewReader(tensorsHeader(5, 2))); err != nil || len(infos) != 5 {
			t.Fatalf("5 tensors: %v", err)
		}
		_, _, err := ReadHeader(bytes.NewReader(tensorsHeader(6, 2)))
		if err == nil || !strings.Contains(err.Error(), "more than 5 tensors") {
			t.Fatalf("6 tensors: err = %v", err)
		}
	})
	if MaxTensors < 100_000 {
		t.Fatalf("MaxTensors = %d rejects real models", MaxTensors)
	}
}

// TestHeaderDimsLimit: the shapes of a header together hold at most the
// limit's dimension values.
func TestHeaderDimsLimit(t *testing.T) {
	withLimits(t, 1000, 12, func() {
		if _, _, err := ReadHeader(bytes.NewReader(tensorsHeader(3, 4))); err != nil {
			t.Fatalf("12 dimensions: %v", err)
		}
		_, _, err := ReadHeader(bytes.NewReader(tensorsHeader(4, 4)))
		if err == nil || !strings.Contains(err.Error(), "more than 12 dimension values") {
			t.Fatalf("16 dimensions: err = %v", err)
		}
	})
	if MaxHeaderDims < 4*MaxTensors {
		t.Fatalf("MaxHeaderDims = %d allows fewer than 4 per tensor", MaxHeaderDims)
	}
}

// TestHeaderStructure: names appear once, and nothing but padding follows
// the header's object.
func TestHeaderStructure(t *testing.T) {
	w := `"W":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}`
	for h, want := range map[string]string{
		`{` + w + `,` + w + `}`:                           `tensor "W" appears twice`,
		`{"__metadata__":{},"__metadata__":{},` + w + `}`: `"__metadata__" appears twice`,
		`{` + w + `} x`:                                   "after the header's JSON object",
		`{` + w + `}{}`:                                   "after the header's JSON object",
		`[1]`:                                             "must be a JSON object",
		`{` + w:                                           "invalid header JSON",
		`{"W":{"dtype":"U8","shape":[1],"data_offsets":[0,1]`:         "invalid header JSON",
		`{"W":{"dtype":"U8","shape":[1 2],"data_offsets":[0,1]}}`:     "invalid header JSON",
		`{"W":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}`:     "invalid header entry",
		`{"W":{"dtype":"U8","shape":{"a":1},"data_offsets":[0,1]}}`:   "invalid header entry",
		`{"W":{"dtype":"U8","shape":["1,1"],"data_offsets":[0,1]}}`:   "invalid header entry",
		`{"W":{"dtype":"U8","shape":null,"data_offsets":[0,1]}}`:      "no shape",
		`{"W":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`:     "data_offsets must be",
		`{"W":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"V":7}`: `tensor "V": invalid header entry`,
	} {
		_, _, err := ReadHeader(bytes.NewReader(file(h, "\x00")))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want one containing %q", h, err, want)
		}
	}
	// Padding spaces after the object are part of the format.
	infos, meta, err := ReadHeader(bytes.NewReader(file(`{"__metadata__":{"k":"v"},`+w+`}   `, "\x00")))
	if err != nil || len(infos) != 1 || meta["k"] != "v" {
		t.Fatalf("padded header: %v %v %v", infos, meta, err)
	}
}

// FuzzReadHeader: any input is read without a panic, and an accepted header
// describes contiguous tensors, of known dtypes and at most MaxRank
// dimensions, that fit in the input.
func FuzzReadHeader(f *testing.F) {
	w := `"W":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]}`
	for _, seed := range [][]byte{
		file(`{`+w+`}`, "12345678"), file(`{"__metadata__":{"a":"b"},`+w+`}  `, "12345678"),
		file(`{`+w+`,"B":{"dtype":"BOOL","shape":[],"data_offsets":[8,9]}}`, "123456789"),
		shapeHeader(MaxRank + 1), tensorsHeader(3, 2), file(`{`+w+`}`, "1234"), file(`[]`, ""), nil,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		infos, _, err := ReadHeader(bytes.NewReader(in))
		if err != nil {
			return
		}
		if len(infos) > MaxTensors {
			t.Fatalf("%d tensors", len(infos))
		}
		var total int64
		for name, ti := range infos {
			es, ok := elemSize(ti.DType)
			if !ok || len(ti.Shape) > MaxRank {
				t.Fatalf("%s: %+v", name, ti)
			}
			n := es
			for _, d := range ti.Shape {
				n *= int64(d)
			}
			if ti.DataOffsets[1]-ti.DataOffsets[0] != n {
				t.Fatalf("%s: %+v holds %d bytes", name, ti, n)
			}
			total += n
		}
		if hl := int64(binary.LittleEndian.Uint64(in)); total > int64(len(in))-8-hl {
			t.Fatalf("%d bytes of tensors in a %d-byte input", total, len(in))
		}
	})
}
