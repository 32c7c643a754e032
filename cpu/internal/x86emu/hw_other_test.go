//go:build !(amd64 && linux)

package x86emu

import "errors"

func hwHas(evex bool) bool { return false }

type hwCode struct{}

func hwMap(codes [][]byte) (*hwCode, error) { return nil, errors.New("no hardware runner here") }

func (h *hwCode) free() {}

func (h *hwCode) run(i int, block *[hbWords]uint64) {}
