package nccl

import (
	"fmt"
	"sync"

	"github.com/ferryml/ferry/backend"
)

// Importing this package registers NCCL as the maker of the CUDA backend's
// device communicators (backend.RegisterDeviceCommMaker for "cuda"): the
// runtime then runs the collectives of sharded programs on the CUDA backend
// through NCCL. The library is loaded on first use, when a sharded program
// with collectives first runs.
func init() { backend.RegisterDeviceCommMaker("cuda", &maker{}) }

// maker is the backend.DeviceCommMaker over a lazily loaded Lib.
type maker struct {
	once sync.Once
	lib  *Lib
	err  error
}

func (m *maker) load() (*Lib, error) {
	m.once.Do(func() {
		m.lib, m.err = Load()
		if m.err != nil {
			m.err = fmt.Errorf("nccl: the CUDA backend runs collectives through NCCL, which did not load: %w", m.err)
		}
	})
	return m.lib, m.err
}

// InitAll is ncclCommInitAll over devices.
func (m *maker) InitAll(devices []int) ([]backend.DeviceCommunicator, error) {
	l, err := m.load()
	if err != nil {
		return nil, err
	}
	cs, err := l.CommInitAll(devices)
	if err != nil {
		return nil, err
	}
	out := make([]backend.DeviceCommunicator, len(cs))
	for i, c := range cs {
		out[i] = c.Collectives()
	}
	return out, nil
}

// NewGroupID is ncclGetUniqueId.
func (m *maker) NewGroupID() ([]byte, error) {
	l, err := m.load()
	if err != nil {
		return nil, err
	}
	id, err := l.GetUniqueID()
	return id[:], err
}

// InitRank is ncclCommInitRank.
func (m *maker) InitRank(id []byte, size, rank int) (backend.DeviceCommunicator, error) {
	l, err := m.load()
	if err != nil {
		return nil, err
	}
	if len(id) != UniqueIDBytes {
		return nil, fmt.Errorf("nccl: a group id has %d bytes, want %d", len(id), UniqueIDBytes)
	}
	c, err := l.CommInitRank(size, UniqueID(id), rank)
	if err != nil {
		return nil, err
	}
	return c.Collectives(), nil
}
