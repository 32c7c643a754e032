//go:build !(amd64 && linux)

package vmath

import "unsafe"

// jitExecOK: generated code is never run here (the code generator still
// builds, and its output can be inspected).
const jitExecOK = false

type execMem struct{}

func mapExec(code []byte) (*execMem, error) { return nil, ErrNoJIT }

func (m *execMem) call(args *uint64) {}

func uintptrOf(p *float32) uintptr { return uintptr(unsafe.Pointer(p)) }

func keepAlive(x any) {}
