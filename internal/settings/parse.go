package settings

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// ParseSize parses a positive byte count: "123", "1e9", "64MiB", "1.5GiB",
// "512MB" (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024;
// units are case-insensitive and may follow a space). Fractional byte
// counts round down.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	end := len(t)
	for end > 0 {
		ch := t[end-1]
		if (ch|0x20) >= 'a' && (ch|0x20) <= 'z' {
			end--
			continue
		}
		break
	}
	num, unit := strings.TrimSpace(t[:end]), strings.ToLower(t[end:])
	if num == "" {
		return 0, fmt.Errorf("bad memory size %q: want a number of bytes like 123, 1e9, 64MiB or 1.5GiB", s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		hint := ""
		if len(unit) == 1 {
			hint = fmt.Sprintf(" (write %siB for powers of 1024 or %sB for powers of 1000)", strings.ToUpper(unit), strings.ToUpper(unit))
		}
		return 0, fmt.Errorf("bad memory size %q: unknown unit %q%s", s, t[end:], hint)
	}
	if mult == 1 && !strings.ContainsAny(num, ".eE") {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bad memory size %q: %v", s, errors.Unwrap(err))
		}
		if n <= 0 {
			return 0, fmt.Errorf("bad memory size %q: must be positive", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || strings.HasPrefix(num, "0x") || strings.HasPrefix(num, "0X") {
		return 0, fmt.Errorf("bad memory size %q: %q is not a number", s, num)
	}
	v := math.Floor(f * mult)
	if math.IsNaN(v) || v >= math.MaxInt64 {
		return 0, fmt.Errorf("bad memory size %q: too large", s)
	}
	if v < 1 {
		return 0, fmt.Errorf("bad memory size %q: must be at least one byte", s)
	}
	return int64(v), nil
}

// BudgetDevice is the value of MemoryBudget that stands for the device's
// capacity ("device").
const BudgetDevice = -1

// parseBudget parses a FERRY_MEMORY_BUDGET value: "device", a byte count
// as ParseSize reads it, or a number followed by K, M, G or T alone
// (powers of 1024).
func parseBudget(t string) (int64, error) {
	if strings.EqualFold(t, "device") {
		return BudgetDevice, nil
	}
	if n := len(t); n > 1 {
		if shift, ok := map[byte]uint{'k': 10, 'm': 20, 'g': 30, 't': 40}[t[n-1]|0x20]; ok && (t[n-2] >= '0' && t[n-2] <= '9' || t[n-2] == '.' || t[n-2] == ' ') {
			f, err := strconv.ParseFloat(strings.TrimSpace(t[:n-1]), 64)
			if err != nil || math.IsNaN(f) || f <= 0 {
				return 0, errForm
			}
			v := math.Floor(f * float64(uint64(1)<<shift))
			if v >= math.MaxInt64 { // +Inf too
				return 0, fmt.Errorf("too large: at most %d bytes (8 EiB)", int64(math.MaxInt64))
			}
			if v < 1 {
				return 0, errors.New("less than one byte")
			}
			return int64(v), nil
		}
	}
	return ParseSize(t)
}

// parseFloats parses n comma-separated numbers accepted by ok.
func parseFloats(s string, n int, ok func(float64) bool) ([]float64, error) {
	f := strings.Split(s, ",")
	if len(f) != n {
		return nil, errForm
	}
	x := make([]float64, n)
	for i, e := range f {
		v, err := strconv.ParseFloat(strings.TrimSpace(e), 64)
		if err != nil || math.IsNaN(v) || !ok(v) {
			return nil, fmt.Errorf("%q is not a positive number", e)
		}
		x[i] = v
	}
	return x, nil
}
