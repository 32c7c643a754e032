package settings

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Setting is a declared variable with a typed value.
type Setting[T any] struct {
	*Var
	def   T
	parse func(s string) (T, error) // s is trimmed and non-empty
	last  atomic.Pointer[parsed[T]]
}

// parsed caches the value parsed last.
type parsed[T any] struct {
	raw string
	val T
	err error
}

// newSetting declares v with a typed value.
func newSetting[T any](v *Var, def T, parse func(string) (T, error)) *Setting[T] {
	s := &Setting[T]{Var: v, def: def, parse: parse}
	v.check = func(raw string) error { _, err := s.Parse(raw); return err }
	declare(v)
	return s
}

// Default returns the value of the variable when it is unset.
func (s *Setting[T]) Default() T { return s.def }

// Parse parses value as the variable would hold it: the default for an
// empty value, an *Error naming the variable for a bad one.
func (s *Setting[T]) Parse(value string) (T, error) {
	t := strings.TrimSpace(value)
	if t == "" {
		return s.def, nil
	}
	v, err := s.parse(t)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return s.def, err
		}
		if errors.Is(err, errForm) {
			err = nil // the form says it all
		}
		return s.def, s.errorf(value, err)
	}
	return v, nil
}

// errForm is a parse failure the accepted form describes.
var errForm = errors.New("bad form")

// Lookup returns the variable's value, whether it is set (not empty), and
// the *Error of a bad value (with the default as the value).
func (s *Setting[T]) Lookup() (val T, set bool, err error) {
	raw, _ := s.Raw()
	if strings.TrimSpace(raw) == "" {
		return s.def, false, nil
	}
	if p := s.last.Load(); p != nil && p.raw == raw {
		return p.val, true, p.err
	}
	v, err := s.Parse(raw)
	s.last.Store(&parsed[T]{raw, v, err})
	return v, true, err
}

// Get returns the variable's value, or the default when it is unset or bad;
// a bad value is reported on standard error (see Warn) the first time it is
// read.
func (s *Setting[T]) Get() T {
	v, _, err := s.Lookup()
	if err != nil {
		Warn(err, "the default ("+plain(s.Var.Default)+")")
	}
	return v
}

// plain removes Markdown code marks.
func plain(s string) string { return strings.ReplaceAll(s, "`", "") }

// words of a Bool.
var (
	trueWords  = []string{"1", "t", "true", "on", "yes", "y"}
	falseWords = []string{"0", "f", "false", "off", "no", "n"}
)

func parseBool(s string) (bool, error) {
	l := strings.ToLower(s)
	for _, w := range trueWords {
		if l == w {
			return true, nil
		}
	}
	for _, w := range falseWords {
		if l == w {
			return false, nil
		}
	}
	return false, errForm
}

// newBool declares a Bool variable.
func newBool(v *Var, def bool) *Setting[bool] {
	v.Kind = Bool
	if v.Want == "" {
		v.Want = "1 or 0 (true/false, on/off, yes/no)"
	}
	return newSetting(v, def, parseBool)
}

// newFlag declares a variable that is on when set to any non-empty value.
func newFlag(v *Var) *Setting[bool] {
	v.Kind = Flag
	if v.Type == "" {
		v.Type = "any non-empty"
	}
	return newSetting(v, false, func(string) (bool, error) { return true, nil })
}

// newInt declares an Int variable in [lo, hi].
func newInt(v *Var, def, lo, hi int64) *Setting[int64] {
	v.Kind = Int
	return newSetting(v, def, func(s string) (int64, error) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < lo || n > hi {
			return 0, errForm
		}
		return n, nil
	})
}

// newUint declares an unsigned 64-bit integer variable.
func newUint(v *Var) *Setting[uint64] {
	v.Kind = Int
	return newSetting(v, 0, func(s string) (uint64, error) {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, errForm
		}
		return n, nil
	})
}

// newFloat declares a Float variable accepted by ok.
func newFloat(v *Var, def float64, ok func(float64) bool) *Setting[float64] {
	v.Kind = Float
	return newSetting(v, def, func(s string) (float64, error) {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || !ok(f) {
			return 0, errForm
		}
		return f, nil
	})
}

// newDuration declares a Duration variable: a Go duration of at least min;
// the words in off (case-insensitive) mean 0.
func newDuration(v *Var, def, min time.Duration, off ...string) *Setting[time.Duration] {
	v.Kind = Duration
	return newSetting(v, def, func(s string) (time.Duration, error) {
		for _, w := range off {
			if strings.EqualFold(s, w) {
				return 0, nil
			}
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < min {
			return 0, errForm
		}
		return d, nil
	})
}

// newSize declares a Size variable: a byte count (ParseSize), or one of
// the words of keywords, which stand for their values.
func newSize(v *Var, keywords map[string]int64) *Setting[int64] {
	v.Kind = Size
	return newSetting(v, 0, func(s string) (int64, error) {
		for w, n := range keywords {
			if strings.EqualFold(s, w) {
				return n, nil
			}
		}
		return ParseSize(s)
	})
}

// newEnum declares an Enum variable: one of values; the value returned is
// the word in lower case.
func newEnum(v *Var, def string, values ...string) *Setting[string] {
	v.Kind = Enum
	v.Values = values
	if v.Type == "" {
		v.Type = orList(values, "`")
	}
	if v.Want == "" {
		v.Want = orList(values, "")
	}
	return newSetting(v, def, func(s string) (string, error) {
		l := strings.ToLower(s)
		for _, w := range values {
			if l == w {
				return w, nil
			}
		}
		return "", errForm
	})
}

// orList writes "a, b or c", each word quoted with q.
func orList(words []string, q string) string {
	var b strings.Builder
	for i, w := range words {
		switch {
		case i == 0:
		case i == len(words)-1:
			b.WriteString(" or ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(q + w + q)
	}
	return b.String()
}

// newString declares a String or Path variable: any value (kept as it is,
// spaces included).
func newString(v *Var, kind Kind) *Setting[string] {
	v.Kind = kind
	s := newSetting(v, "", func(s string) (string, error) { return s, nil })
	return s
}
