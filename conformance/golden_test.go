package conformance

import (
	"bufio"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryml/ferry/ir"
)

// goldenArray is an array in a golden file: dtype, shape and the hex of its
// little-endian bytes.
type goldenArray struct {
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	Hex   string `json:"hex"`
}

// literal decodes a golden array.
func (g goldenArray) literal() (*ir.Literal, error) {
	dt, err := ir.ParseDType(g.DType)
	if err != nil {
		return nil, err
	}
	data, err := hex.DecodeString(g.Hex)
	if err != nil {
		return nil, err
	}
	l := ir.NewLiteral(ir.Type{DType: dt, Shape: ir.Shape(g.Shape)})
	if len(data) != len(l.Data) {
		return nil, fmt.Errorf("%v%v: %d bytes, want %d", dt, g.Shape, len(data), len(l.Data))
	}
	copy(l.Data, data)
	return l, nil
}

// readGolden reads testdata/name (gzip'd JSON lines): the header into meta,
// then every case into a new *T.
func readGolden[T any](t *testing.T, name string, meta any) []*T {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("golden file missing: %v (regenerate: bash scripts/venv && .venv/bin/python conformance/gen.py)", err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	sc := bufio.NewScanner(z)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out []*T
	for line := 0; sc.Scan(); line++ {
		if line == 0 {
			if err := json.Unmarshal(sc.Bytes(), meta); err != nil {
				t.Fatalf("%s header: %v", name, err)
			}
			continue
		}
		c := new(T)
		if err := json.Unmarshal(sc.Bytes(), c); err != nil {
			t.Fatalf("%s line %d: %v", name, line+1, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

// elemBits returns element i of l as raw bits.
func elemBits(l *ir.Literal, i int) uint64 {
	n := l.Type.DType.Size()
	var v uint64
	for k := n - 1; k >= 0; k-- {
		v = v<<8 | uint64(l.Data[i*n+k])
	}
	return v
}

// isNaN reports whether element i of a float literal is a NaN.
func isNaN(l *ir.Literal, i int) bool {
	return l.Type.DType.IsFloat() && math.IsNaN(l.Float64At(i))
}

// ulpDist is the distance in units in the last place between elements of
// two float literals of one dtype (0 for two NaNs, MaxInt64 for a NaN and a
// number): the difference of their positions in the ordered set of values.
func ulpDist(a, b *ir.Literal, i int) int64 {
	na, nb := isNaN(a, i), isNaN(b, i)
	if na || nb {
		if na && nb {
			return 0
		}
		return math.MaxInt64
	}
	bits := a.Type.DType.Size() * 8
	ord := func(v uint64) int64 {
		sign := v >> (bits - 1) & 1
		mag := int64(v &^ (1 << (bits - 1)))
		if sign == 1 {
			return -mag
		}
		return mag
	}
	d := ord(elemBits(a, i)) - ord(elemBits(b, i))
	if d < 0 {
		d = -d
	}
	return d
}

// sameElem reports bit equality of element i, with every NaN equal.
func sameElem(a, b *ir.Literal, i int) bool {
	if isNaN(a, i) || isNaN(b, i) {
		return isNaN(a, i) && isNaN(b, i)
	}
	return elemBits(a, i) == elemBits(b, i)
}

// elemString formats element i of l with its bits.
func elemString(l *ir.Literal, i int) string {
	dt := l.Type.DType
	switch {
	case dt.IsFloat():
		return fmt.Sprintf("%v (0x%0*x)", l.Float64At(i), dt.Size()*2, elemBits(l, i))
	case dt == ir.Bool:
		return fmt.Sprint(l.Data[i] != 0)
	case dt.IsSigned():
		v := elemBits(l, i)
		return fmt.Sprint(int64(v<<(64-8*dt.Size())) >> (64 - 8*dt.Size()))
	}
	return fmt.Sprint(elemBits(l, i))
}
