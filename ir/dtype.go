package ir

import (
	"fmt"
	"strings"
)

// DType is the element type of an array.
type DType uint8

// The element types Ferry supports.
const (
	InvalidDType DType = iota
	Bool
	Uint8
	Int32
	Int64
	Uint32
	Float16
	BFloat16
	Float32
	Float64
	numDTypes
)

var dtypeNames = [numDTypes]string{"invalid", "bool", "u8", "i32", "i64", "u32", "f16", "bf16", "f32", "f64"}
var dtypeLongNames = [numDTypes]string{"invalid", "bool", "uint8", "int32", "int64", "uint32", "float16", "bfloat16", "float32", "float64"}
var dtypeSizes = [numDTypes]int{0, 1, 1, 4, 8, 4, 2, 2, 4, 8}

// AllDTypes lists every valid dtype in declaration order.
var AllDTypes = []DType{Bool, Uint8, Int32, Int64, Uint32, Float16, BFloat16, Float32, Float64}

// String returns the short name used in IR text: bool, u8, i32, i64, u32, f16, bf16, f32, f64.
func (d DType) String() string {
	if d >= numDTypes {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeNames[d]
}

// LongName returns the NumPy-style name (float32, bfloat16, ...).
func (d DType) LongName() string {
	if d >= numDTypes {
		return d.String()
	}
	return dtypeLongNames[d]
}

// Size returns the number of bytes of one element.
func (d DType) Size() int {
	if d >= numDTypes {
		return 0
	}
	return dtypeSizes[d]
}

// Valid reports whether d is one of the supported dtypes.
func (d DType) Valid() bool { return d > InvalidDType && d < numDTypes }

// IsFloat reports whether d is a floating-point dtype.
func (d DType) IsFloat() bool { return d == Float16 || d == BFloat16 || d == Float32 || d == Float64 }

// IsInteger reports whether d is an integer dtype (signed or unsigned, not bool).
func (d DType) IsInteger() bool { return d == Uint8 || d == Int32 || d == Int64 || d == Uint32 }

// IsSigned reports whether d is a signed integer dtype.
func (d DType) IsSigned() bool { return d == Int32 || d == Int64 }

// IsUnsigned reports whether d is an unsigned integer dtype.
func (d DType) IsUnsigned() bool { return d == Uint8 || d == Uint32 }

// ParseDType parses a short (f32) or long (float32) dtype name.
func ParseDType(s string) (DType, error) {
	for i := DType(1); i < numDTypes; i++ {
		if s == dtypeNames[i] || s == dtypeLongNames[i] {
			return i, nil
		}
	}
	return InvalidDType, fmt.Errorf("unknown dtype %q (want one of %s)", s, strings.Join(dtypeNames[1:], ", "))
}

// MemorySpace is where an array lives.
type MemorySpace uint8

// Memory spaces. On CUDA, Device is GPU memory and PinnedHost is page-locked host
// memory; on the CPU backend both are host RAM but Device is a capacity-limited pool.
const (
	Device MemorySpace = iota
	PinnedHost
	numSpaces
)

var spaceNames = [numSpaces]string{"device", "pinned_host"}

// AllSpaces lists every memory space.
var AllSpaces = []MemorySpace{Device, PinnedHost}

// String returns "device" or "pinned_host".
func (m MemorySpace) String() string {
	if m >= numSpaces {
		return fmt.Sprintf("space(%d)", uint8(m))
	}
	return spaceNames[m]
}

// ParseMemorySpace parses "device" or "pinned_host".
func ParseMemorySpace(s string) (MemorySpace, error) {
	for i := MemorySpace(0); i < numSpaces; i++ {
		if s == spaceNames[i] {
			return i, nil
		}
	}
	return 0, fmt.Errorf("unknown memory space %q (want device or pinned_host)", s)
}
