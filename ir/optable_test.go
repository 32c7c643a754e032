package ir

import "testing"

// TestOpTableComplete is the op table's own meta-test: every op code has a
// unique name that parses back, a shape rule, and, when elementwise of a
// unary, binary or compare class, a dtype rule; the slots later issues
// fill are still empty. The CPU (internal/eval), CUDA (cuda) and VJP
// (trace) meta-tests check the other pieces of each row.
func TestOpTableComplete(t *testing.T) {
	seen := map[string]Code{}
	for _, c := range AllCodes() {
		info := c.Info()
		if info.Code != c || info.Name == "" {
			t.Errorf("op code %d has no row in the op table", c)
			continue
		}
		if prev, ok := seen[info.Name]; ok {
			t.Errorf("ops %d and %d are both named %q", prev, c, info.Name)
		}
		seen[info.Name] = c
		if got, ok := LookupCode(info.Name); !ok || got != c {
			t.Errorf("LookupCode(%q) = %v, %v", info.Name, got, ok)
		}
		if info.Infer == nil {
			t.Errorf("%v has no shape rule (Infer)", c)
		}
		switch info.Class {
		case ClassUnary, ClassBinary, ClassCompare:
			if !info.Elementwise || info.DTypes == NoDTypeRule {
				t.Errorf("%v: an elementwise class without Elementwise or a dtype rule", c)
			}
		}
		if info.Ref1 != nil && info.NumArgs != 1 || info.Ref2 != nil && info.NumArgs != 2 {
			t.Errorf("%v: reference function of the wrong arity", c)
		}
		if info.Shard == nil {
			t.Errorf("%v has no sharding rule (Shard); give it one or list it in DefaultShardedOps", c)
		}
	}
}

// TestDTypeRule checks each rule against the dtypes it names.
func TestDTypeRule(t *testing.T) {
	all := []DType{Bool, Uint8, Int32, Int64, Uint32, Float16, BFloat16, Float32, Float64}
	want := map[DTypeRule]func(DType) bool{
		AnyDType:      func(DType) bool { return true },
		FloatDTypes:   func(d DType) bool { return d == Float16 || d == BFloat16 || d == Float32 || d == Float64 },
		NumericDTypes: func(d DType) bool { return d != Bool },
		LogicalDTypes: func(d DType) bool { return d == Bool || d == Uint8 || d == Int32 || d == Int64 || d == Uint32 },
		IntegerDTypes: func(d DType) bool { return d == Uint8 || d == Int32 || d == Int64 || d == Uint32 },
		NoDTypeRule:   func(DType) bool { return false },
	}
	for k, f := range want {
		for _, d := range all {
			if k.OK(d) != f(d) {
				t.Errorf("%v.OK(%v) = %v", k, d, k.OK(d))
			}
		}
	}
}
