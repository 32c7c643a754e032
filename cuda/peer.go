package cuda

import (
	"fmt"

	"github.com/ferryml/ferry/trace"
)

// CopyToDevice returns a copy of the buffer on device dev of its backend,
// in the same memory space, committed to dev: what rt.ToDevice (and
// DevicePut's blocks) do between two GPUs without passing through a host
// literal. Device memory moves by one cuMemcpyPeerAsync when dev has peer
// access to the buffer's device (enabled by New where
// cuDeviceCanAccessPeer allows it), otherwise through a pinned host
// staging buffer (a device-to-host copy on the source device, then a
// host-to-device copy on dev). A pinned_host buffer is copied on the host.
// An out-of-memory error names dev.
func (x *Buffer) CopyToDevice(dev int) (trace.Buffer, error) {
	g, err := x.b.Device(dev)
	if err != nil {
		return nil, err
	}
	if err := x.Hold(false, ""); err != nil {
		return nil, err
	}
	defer x.Unhold(false)
	src := x.b
	// The buffer's last writer may still run on the source's streams.
	if err := src.enter(); err != nil {
		return nil, err
	}
	err = src.sync()
	src.exit()
	if err != nil {
		return nil, err
	}
	n := x.t.Bytes()
	if err := g.enter(); err != nil {
		return nil, err
	}
	m, err := g.allocate(n, x.t.Space, "array")
	if err == nil && (x.m.host || g == src) {
		err = g.copy(m.ptr, m.host, x.m.ptr, x.m.host, n, g.streams[H2D])
	} else if err == nil && g.peer[src.ord] {
		err = g.d.Check("cuMemcpyPeerAsync", m.ptr, g.ctx, x.m.ptr, src.ctx, uintptr(n), g.streams[H2D])
	}
	if err == nil {
		err = g.d.Check("cuStreamSynchronize", g.streams[H2D])
	}
	g.exit()
	if err == nil && !x.m.host && g != src && !g.peer[src.ord] {
		err = copyThroughHost(m.ptr, g, x.m.ptr, src, n)
	}
	if err != nil {
		if m.ptr != 0 {
			_ = g.releaseEntered(m)
		}
		return nil, fmt.Errorf("cuda: copying %v from cuda:%d to cuda:%d: %w", x.t, src.ord, g.ord, err)
	}
	y := g.newBuffer(x.t, m)
	y.committed = true
	return y, nil
}

// copyThroughHost copies n bytes of device memory from src's device to
// dst's, without peer access: into pinned host memory on src's D2H stream,
// then out of it on dst's H2D stream.
func copyThroughHost(dst uintptr, g *Backend, srcPtr uintptr, src *Backend, n int64) error {
	if n == 0 {
		return nil
	}
	if err := src.enter(); err != nil {
		return err
	}
	stage, err := src.d.HostAlloc(n)
	if err == nil {
		err = src.d.Check("cuMemcpyDtoHAsync", stage, srcPtr, uintptr(n), src.streams[D2H])
		if err == nil {
			err = src.d.Check("cuStreamSynchronize", src.streams[D2H])
		}
	}
	src.exit()
	if stage == 0 {
		return err
	}
	if err == nil {
		if err = g.enter(); err == nil {
			err = g.d.Check("cuMemcpyHtoDAsync", dst, stage, uintptr(n), g.streams[H2D])
			if err == nil {
				err = g.d.Check("cuStreamSynchronize", g.streams[H2D])
			}
			g.exit()
		}
	}
	if e := src.enter(); e == nil {
		_ = src.d.Check("cuMemFreeHost", stage)
		src.exit()
	}
	return err
}

// releaseEntered is release inside an entry of the handle's device.
func (b *Backend) releaseEntered(m mem) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.exit()
	return b.release(m)
}
