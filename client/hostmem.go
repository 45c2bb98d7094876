package client

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
)

// Host memory shared with the mediator. Each region is a memfd, sealed so
// that it can neither shrink nor grow (the mediator maps it and must never
// fault past its end), with every page written before it is passed to the
// mediator once (the mediator refuses holes, whose pages its copies would
// fault in as its own memory, and seals the memfd against hole punching,
// so it is left unsealed for that); copies then name a region and an
// offset, and the mediator moves the bytes between that memory and the
// node's socket without another copy.

// region is a registered memfd mapping.
type region struct {
	id  uint32 // guarded by Client.mu: a resumed session renumbers it (reconnect.go)
	mem []byte
}

func (r *region) unmap() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
}

// HostAlloc returns n bytes of host memory shared with the mediator, like
// pinned memory of a GPU driver: copies from and to it are zero-copy. Free
// it with HostFree; Close unmaps it.
func (c *Client) HostAlloc(n int) ([]byte, error) {
	r, err := c.register(n)
	if err != nil {
		return nil, err
	}
	return r.mem, nil
}

// register creates, maps and registers a region of n bytes.
func (c *Client) register(n int) (*region, error) {
	if n <= 0 {
		return nil, fmt.Errorf("host allocation of %d bytes: %w", n, api.ErrInvalidArgument)
	}
	fd, err := unix.MemfdCreate("vgpu-host", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("host allocation of %d bytes: memfd: %w", n, err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		return nil, fmt.Errorf("host allocation of %d bytes: %w", n, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		return nil, fmt.Errorf("host allocation of %d bytes: seal: %w", n, err)
	}
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("host allocation of %d bytes: map: %w", n, err)
	}
	// Committed now, like a GPU driver's pinned memory, and charged to
	// this process's memory cgroup (Linux 5.14 or later).
	if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != nil {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("host allocation of %d bytes: populate: %w", n, err)
	}
	body, err := c.rpc.CallFD(api.OpHostRegister, fd, api.Encode(&api.HostRegister{Size: uint64(n)}))
	var reply api.HostRegion
	if err == nil {
		err = api.Decode(body, &reply)
	}
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("host allocation of %d bytes: %w", n, err)
	}
	r := &region{id: reply.Region, mem: mem}
	c.mu.Lock()
	c.regions = append(c.regions, r)
	c.mu.Unlock()
	return r, nil
}

// HostFree releases memory of HostAlloc once work already queued is done.
func (c *Client) HostFree(b []byte) error {
	c.mu.Lock()
	i := slices.IndexFunc(c.regions, func(r *region) bool { return sameStart(r.mem, b) })
	var r *region
	if i >= 0 {
		r = c.regions[i]
		c.regions = slices.Delete(c.regions, i, i+1)
	}
	c.mu.Unlock()
	if r == nil {
		return fmt.Errorf("host free of %d bytes: not memory of HostAlloc: %w", len(b), api.ErrInvalidArgument)
	}
	return c.unregister(r)
}

func (c *Client) unregister(r *region) error {
	c.flushAll()
	_, err := c.rpc.Call(api.OpHostUnregister, nil, api.Encode(&api.HostRegion{Region: c.regionID(r)}))
	r.unmap()
	return err
}

// regionID is r's id with the mediator now.
func (c *Client) regionID(r *region) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return r.id
}

// hostRegion finds the registered region that holds all of b, and b's
// offset in it.
func (c *Client) hostRegion(b []byte) (*region, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.regions {
		if off, ok := within(r.mem, b); ok {
			return r, off, true
		}
	}
	return nil, 0, false
}

// Staging: a stream copies other host memory through a ring of slots in a
// region of its own, in pieces of stagingSlot bytes. A slot is reused once
// the request that used it has completed (and, for a copy from the device,
// its bytes were copied out).
const (
	stagingSlot  = 1 << 20
	stagingSlots = 8
)

type staging struct {
	region *region
	next   int
	slots  [stagingSlots]stagingSlotState
}

type stagingSlotState struct {
	off  uint64
	buf  []byte
	user *inflight // the request that last used the slot
}

// slot returns the next free slot of the stream's ring, waiting for the
// request that used it. The caller holds s.mu.
func (s *Stream) slot() (*stagingSlotState, error) {
	if s.staging == nil {
		r, err := s.c.register(stagingSlot * stagingSlots)
		if err != nil {
			return nil, fmt.Errorf("stream %d staging buffer: %w", s.id, err)
		}
		s.staging = &staging{region: r}
		for i := range s.staging.slots {
			off := i * stagingSlot
			s.staging.slots[i] = stagingSlotState{off: uint64(off), buf: r.mem[off : off+stagingSlot]}
		}
	}
	st := s.staging
	sl := &st.slots[st.next]
	st.next = (st.next + 1) % stagingSlots
	if f := sl.user; f != nil {
		if f == s.cur {
			s.flush()
		}
		s.settle(f)
		sl.user = nil
	}
	return sl, nil
}

// closeStaging drops the stream's staging region. The caller holds s.mu or
// owns the stream.
func (s *Stream) closeStaging() {
	if s.staging == nil {
		return
	}
	r := s.staging.region
	s.staging = nil
	s.c.mu.Lock()
	s.c.regions = slices.DeleteFunc(s.c.regions, func(x *region) bool { return x == r })
	id := r.id
	s.c.mu.Unlock()
	_, _ = s.c.rpc.Call(api.OpHostUnregister, nil, api.Encode(&api.HostRegion{Region: id}))
	r.unmap()
}
