package backend_test

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

func TestFormatBytesTable(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1, "1 B"}, {512, "512 B"}, {1023, "1023 B"},
		{1024, "1 KiB"}, {1536, "1.5 KiB"}, {4608, "4.5 KiB"}, {10 << 10, "10 KiB"},
		{1048063, "1023 KiB"}, {1048064, "1 MiB"}, // 1023.499 KiB, 1023.5 KiB
		{48*1<<20 + 1<<17, "48.1 MiB"}, {600 << 10, "600 KiB"}, {3 << 29, "1.5 GiB"},
		{1320702444, "1.23 GiB"}, {5 << 40, "5 TiB"}, {1 << 50, "1 PiB"},
		{math.MaxInt64, "8 EiB"}, {-1536, "-1.5 KiB"}, {-5, "-5 B"}, {math.MinInt64, "-8 EiB"},
	} {
		if got := backend.FormatBytes(c.n); got != c.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

// TestFormatBytesRoundTrip checks random counts of every magnitude against
// their exact value: the printed figure is within half a unit of its third
// significant digit, at most three significant digits are printed (more only
// for 1000-1023 of a unit), and the unit is the largest one the count reaches.
func TestFormatBytesRoundTrip(t *testing.T) {
	r := testseed.Rand(t, 0)
	for range 20000 {
		n := int64(r.Uint64() >> (1 + r.IntN(63)))
		s := backend.FormatBytes(n)
		num, unit, ok := strings.Cut(s, " ")
		if !ok {
			t.Fatalf("FormatBytes(%d) = %q: no unit", n, s)
		}
		exp := strings.Index("BKMGTPE", unit[:1])
		if exp < 0 || (exp > 0 && unit[1:] != "iB") || (exp == 0 && unit != "B") {
			t.Fatalf("FormatBytes(%d) = %q: bad unit", n, s)
		}
		v, err := strconv.ParseFloat(num, 64)
		if err != nil {
			t.Fatalf("FormatBytes(%d) = %q: %v", n, s, err)
		}
		scale := math.Ldexp(1, 10*exp)
		if exp == 0 {
			if v != float64(n) {
				t.Fatalf("FormatBytes(%d) = %q, want the exact count", n, s)
			}
			continue
		}
		exact := float64(n) / scale
		if lo, hi := math.Ldexp(1, 10*exp), math.Ldexp(1, 10*(exp+1)); float64(n) < lo*(1-1e-3) || float64(n) >= hi {
			t.Fatalf("FormatBytes(%d) = %q: the unit does not fit the count", n, s)
		}
		digits := strings.TrimLeft(strings.ReplaceAll(num, ".", ""), "0")
		if len(digits) > 3 && v < 1000 {
			t.Fatalf("FormatBytes(%d) = %q: more than three significant digits", n, s)
		}
		if strings.Contains(num, ".") && strings.HasSuffix(num, "0") {
			t.Fatalf("FormatBytes(%d) = %q: trailing zero", n, s)
		}
		step := math.Pow(10, math.Floor(math.Log10(exact))-2) // the third significant digit
		if exact >= 100 {
			step = 1
		}
		if math.Abs(v-exact) > step/2*(1+1e-9) && !(v == 1 && exact >= 1023.5) {
			t.Fatalf("FormatBytes(%d) = %q: %g %s is not within %g of the exact %g", n, s, v, unit, step/2, exact)
		}
	}
}

func ExampleFormatBytes() {
	for _, n := range []int64{512, 4608, 50_440_000, 1_320_702_444} {
		fmt.Println(backend.FormatBytes(n))
	}
	// Output:
	// 512 B
	// 4.5 KiB
	// 48.1 MiB
	// 1.23 GiB
}

// The out-of-memory report prints every figure in a unit that fits it, at
// a tiny pool and at a huge one, with the exact count beside rounded ones.
func TestOutOfMemoryReportSizes(t *testing.T) {
	tiny := &backend.OutOfMemoryError{Platform: "cpu", Space: ir.Device, Allocator: backend.AllocatorBFC, Devices: 1,
		Requested: 96, Capacity: 256, Limit: 192, Reserved: 192, InUse: 160, LargestFree: 32, FreeBytes: 32, FreeBlocks: 1,
		LiveAllocs: 1, Largest: []backend.LiveArray{{What: "temp arena", Bytes: 160, Site: "x.go:1"}}}
	huge := &backend.OutOfMemoryError{Platform: "cuda", Space: ir.Device, Allocator: backend.AllocatorBFC, Devices: 1,
		Requested: 3 << 39, Capacity: 141 << 30, Limit: 106 << 30, Reserved: 106 << 30, InUse: 100 << 30, LargestFree: 6 << 30,
		LiveAllocs: 1, Largest: []backend.LiveArray{{What: "temp arena", Bytes: 100 << 30, Site: "x.go:1"}}}
	for _, c := range []struct {
		e    *backend.OutOfMemoryError
		want []string
	}{
		{tiny, []string{"cannot allocate 96 B\n", "capacity 256 B, limit 192 B, reserved 192 B, in use 160 B, largest free block 32 B", "160 B  temp arena"}},
		{huge, []string{"cannot allocate 1.5 TiB (1649267441664 bytes)\n", "capacity 141 GiB (151397597184 bytes), limit 106 GiB (113816633344 bytes), reserved 106 GiB, in use 100 GiB, largest free block 6 GiB", "100 GiB  temp arena"}},
	} {
		msg := c.e.Error()
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("report lacks %q:\n%s", w, msg)
			}
		}
		if strings.Contains(msg, "0.00") || strings.Contains(msg, "MiB") {
			t.Errorf("report prints a size in a unit that does not fit it:\n%s", msg)
		}
	}
}
