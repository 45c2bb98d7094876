package mediator

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Host memory a tenant shares with the mediator (api.OpHostRegister): a
// memfd the tenant passes over its socket, mapped here. Copies naming a
// region move bytes between the mapping and the node connection directly,
// so bulk data never crosses the tenant's socket and is never copied in
// between.
//
// Safety: the mapping must never be touched past the file's end (that
// would fault in the mediator), so a region is accepted only if its memfd
// is sealed against shrinking, and is mapped at the size asked, no larger
// than the file. Nor may the mediator's copies touch a hole: the page a
// fault would put there is charged to the mediator's memory cgroup, not
// the tenant's. So the memfd must have memory behind every byte mapped
// when it is registered (the tenant wrote each page: its pages, charged to
// its container), and the mediator seals it against hole punching
// (F_SEAL_FUTURE_WRITE, once its own writable mapping exists; the tenant's
// mapping made before stays writable), so it keeps them. The tenant may
// change the bytes at any time; that only races with its own copies. A
// region is unmapped only after the session's streams have drained, and
// commands look it up when they execute, so none reads a region after it
// is gone.

// Limits on host regions. A mapping costs the mediator address space, not
// memory (the pages are the tenant's, above), but address space is finite
// (128 TiB for a process on x86-64) and the mediator's own heap needs it
// too: the bytes mapped are bounded per session, per container (all its
// sessions) and for the whole mediator, so no tenant can leave the
// mediator unable to allocate.
const (
	MaxHostRegions    = 64
	maxHostRegionSize = 1 << 40
	// MaxHostMappedPerContainer bounds the bytes of host regions a
	// container's sessions have mapped together.
	MaxHostMappedPerContainer = 1 << 40
	// MaxHostMapped bounds the bytes of host regions mapped in the
	// mediator, all sessions together.
	MaxHostMapped = 32 << 40
)

type hostRegion struct {
	id  uint32
	mem []byte
}

// registerHost maps the memfd that came with a register request.
func (s *session) registerHost(body []byte) (uint32, error) {
	var m api.HostRegister
	if err := api.Decode(body, &m); err != nil {
		return 0, err
	}
	fd, err := s.c.TakeFD()
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if m.Size == 0 || m.Size > maxHostRegionSize || m.Size > math.MaxInt {
		return 0, fmt.Errorf("host region of %d bytes: want 1 to %d: %w", m.Size, uint64(maxHostRegionSize), api.ErrInvalidArgument)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err == nil && seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) != 0 {
		return 0, fmt.Errorf("host region of %d bytes: the memfd is sealed against writing (seals %#x), but copies from the device write into it: %w", m.Size, seals, api.ErrInvalidArgument)
	}
	if err == nil && seals&unix.F_SEAL_SHRINK == 0 {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	}
	if err != nil {
		return 0, fmt.Errorf("host region of %d bytes: the descriptor must be a memfd that is or can be sealed against shrinking: %v: %w", m.Size, err, api.ErrInvalidArgument)
	}
	// Only shmem: a hugetlbfs memfd could have pages punched out that a
	// fault cannot bring back, which would kill the mediator.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return 0, fmt.Errorf("host region of %d bytes: the descriptor is not an ordinary memfd (file system %#x): %w", m.Size, fs.Type, api.ErrInvalidArgument)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Size) < m.Size {
		return 0, fmt.Errorf("host region of %d bytes: the memfd holds %d: %w", m.Size, st.Size, api.ErrInvalidArgument)
	}
	if n := s.regions.count(); n >= MaxHostRegions {
		return 0, fmt.Errorf("session has %d host regions, the limit: %w", n, api.ErrInvalidArgument)
	}
	budgets := s.hostBudgets()
	for i, b := range budgets {
		if err := b.reserve(m.Size); err != nil {
			release(budgets[:i], m.Size)
			return 0, fmt.Errorf("host region of %d bytes: %w", m.Size, err)
		}
	}
	mem, err := unix.Mmap(fd, 0, int(m.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		release(budgets, m.Size)
		if errors.Is(err, unix.ENOMEM) {
			return 0, fmt.Errorf("map host region of %d bytes: %v: %w", m.Size, err, api.ErrOutOfMemory)
		}
		return 0, fmt.Errorf("map host region of %d bytes: %v: %w", m.Size, err, api.ErrInvalidArgument)
	}
	if err := keepsPages(fd, m.Size); err != nil {
		release(budgets, m.Size)
		_ = unix.Munmap(mem)
		return 0, fmt.Errorf("host region of %d bytes: %w", m.Size, err)
	}
	return s.regions.add(mem), nil
}

// keepsPages seals fd against hole punching and checks that its first
// size bytes have memory behind them; sealed first, so that no hole can
// appear after the check. A descriptor refused here stays sealed.
func keepsPages(fd int, size uint64) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); err != nil {
		return fmt.Errorf("the memfd cannot be sealed against hole punching: %v: %w", err, api.ErrInvalidArgument)
	}
	// SEEK_HOLE finds a page never written (or written, then punched out)
	// whose first touch by the mediator would be the mediator's memory.
	hole, err := unix.Seek(fd, 0, unix.SEEK_HOLE)
	if err != nil {
		return fmt.Errorf("find holes in the memfd: %v: %w", err, api.ErrInvalidArgument)
	}
	if uint64(hole) < size {
		return fmt.Errorf("the memfd has a hole at offset %d: write every page before registering it: %w", hole, api.ErrInvalidArgument)
	}
	return nil
}

// hostBudgets are the budgets a region of s is charged to: its
// container's, if any, and the mediator's. A host-socket session (the
// host's own programs) is bounded by its region limits and the mediator's.
func (s *session) hostBudgets() []*budget {
	if s.ctr != nil {
		return []*budget{&s.ctr.hostMapped, &s.m.hostMapped}
	}
	return []*budget{&s.m.hostMapped}
}

// unmap unmaps r and gives its bytes back to the budgets.
func (s *session) unmap(r *hostRegion) error {
	release(s.hostBudgets(), uint64(len(r.mem)))
	return unix.Munmap(r.mem)
}

// release gives n bytes back to each of budgets.
func release(budgets []*budget, n uint64) {
	for _, b := range budgets {
		b.release(n)
	}
}

// unregisterHost unmaps a region once the work queued before is done.
func (s *session) unregisterHost(body []byte) error {
	var m api.HostRegion
	if err := api.Decode(body, &m); err != nil {
		return err
	}
	s.drainAll()
	r := s.regions.remove(m.Region)
	if r == nil {
		return fmt.Errorf("host region %d does not exist: %w", m.Region, api.ErrInvalidArgument)
	}
	return s.unmap(r)
}

// unmapAll unmaps every region; the session's streams have stopped.
func (s *session) unmapAll() {
	for _, r := range s.regions.takeAll() {
		_ = s.unmap(r)
	}
}

// hostBytes returns the bytes of a copy's region, checked.
func (s *session) hostBytes(m *api.CopyHost) ([]byte, error) {
	r := s.regions.get(m.Region)
	if r == nil {
		return nil, fmt.Errorf("host region %d does not exist: %w", m.Region, api.ErrInvalidArgument)
	}
	size := uint64(len(r.mem))
	if m.Len == 0 || m.Off > size || m.Len > size-m.Off {
		return nil, fmt.Errorf("%d bytes at offset %d of host region %d, which has %d: %w", m.Len, m.Off, m.Region, size, api.ErrInvalidArgument)
	}
	return r.mem[m.Off : m.Off+m.Len], nil
}

// checkHost refuses, when it is decoded, a copy that cannot be valid.
func (s *session) checkHost(m *api.CopyHost) error {
	_, err := s.hostBytes(m)
	return err
}

// toDeviceHost issues a copy from a host region, a chunk per node write,
// each translated under issueMu.
func (st *stream) toDeviceHost(m *api.CopyHost, c *completion, idx int) error {
	src, err := st.s.hostBytes(m)
	if err != nil {
		return err
	}
	sent, err := st.dedup(m, src, c, idx)
	if err != nil {
		return err
	}
	for off := uint64(0); off < m.Len; off += wire.MaxChunk {
		n := min(wire.MaxChunk, m.Len-off)
		if sent.covers(off, n) {
			continue
		}
		// The zeros that end a chunk travel as a fill, not as bytes: a
		// model's weights padded with zeros to whole frames, so that
		// their last frame deduplicates too, cost the weights' bytes.
		data := src[off : off+n]
		z := zeroTail(data)
		if z < zeroFillMin {
			z = 0
		}
		if err := st.writeChunk(m.Addr+off, data[:len(data)-z], false, c, idx); err != nil {
			return err
		}
		if err := st.writeChunk(m.Addr+off+uint64(len(data)-z), data[len(data)-z:], true, c, idx); err != nil {
			return err
		}
	}
	c.in += m.Len
	return nil
}

// zeroFillMin is the shortest run of zeros ending a chunk that a copy sends
// as a fill: a fill is a request of its own, and a node's work.
const zeroFillMin = 4 << 10

var zeroPage [4 << 10]byte

// zeroTail is the length of the run of zero bytes that ends b: page by page
// while whole pages are zero (a vectorised compare), then byte by byte.
func zeroTail(b []byte) int {
	end := len(b)
	for end >= len(zeroPage) && bytes.Equal(b[end-len(zeroPage):end], zeroPage[:]) {
		end -= len(zeroPage)
	}
	for end > 0 && b[end-1] == 0 {
		end--
	}
	return len(b) - end
}

// writeChunk issues the write of b, at most wire.MaxChunk bytes, at va, or
// if zeros says b is all zero a fill of its length, translated under
// issueMu. An empty b issues nothing.
func (st *stream) writeChunk(va uint64, b []byte, zeros bool, c *completion, idx int) error {
	if len(b) == 0 {
		return nil
	}
	n := uint64(len(b))
	st.s.issueMu.Lock()
	dev, xs, err := st.s.space.TranslateWrite(va, n)
	if err == nil {
		v := st.on(dev)
		at := api.NodeAccess{Device: v.dev.info.Index, Extents: xs}
		if zeros {
			c.call(v, idx, api.OpNodeFill, nil, api.Encode(&at))
		} else {
			c.call(v, idx, api.OpNodeWrite, nil, api.Encode(&at), b)
		}
	}
	st.s.issueMu.Unlock()
	if err != nil {
		return fmt.Errorf("copy %d bytes to %#x: %w", n, va, err)
	}
	return nil
}

// fromDeviceHost issues a copy into a host region, a chunk per node read,
// whose reply the connection reads straight into the region.
func (st *stream) fromDeviceHost(m *api.CopyHost, c *completion, idx int) error {
	dst, err := st.s.hostBytes(m)
	if err != nil {
		return err
	}
	for off := uint64(0); off < m.Len; off += wire.MaxChunk {
		n := min(wire.MaxChunk, m.Len-off)
		st.s.issueMu.Lock()
		dev, xs, err := st.s.space.Translate(m.Addr+off, n)
		if err == nil {
			v := st.on(dev)
			c.call(v, idx, api.OpNodeRead, dst[off:off+n], api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: xs}))
		}
		st.s.issueMu.Unlock()
		if err != nil {
			return fmt.Errorf("copy %d bytes from %#x: %w", n, m.Addr+off, err)
		}
	}
	c.outN += m.Len
	return nil
}
