package accelerator

import (
	"fmt"
	"slices"
	"sync"

	"github.com/vgpu/vgpu/api"
)

// FrameSize is the unit in which a node hands out physical device memory.
const FrameSize = 2 << 20

// owner identifies who holds a frame: one mediator connection, which acts for
// one tenant. Zero means free.
type owner uint64

// frameTable tracks which connection owns each frame of one device, and
// which frames are sealed (read-only, see content.go).
//
// Invariants: a frame has at most one owner; a frame is scrubbed between
// owners (by the caller of release, before the frame is marked free); only a
// held frame is sealed, and it is unsealed (unseal) before it is released;
// a frame in a shared object that may be written (coherent or versioned) is
// never sealed, so the content index's hashes hold (shared.go, content.go).
type frameTable struct {
	mu     sync.RWMutex
	owners []owner              // by frame number
	held   map[owner]int        // frames each owner holds
	sealed []bool               // by frame number
	shared map[int][]api.Extent // by frame number: the runs of it in shared objects (shared.go)
	free   int
	hint   int // where the next search for a run starts
}

func newFrameTable(memory uint64) *frameTable {
	n := int(memory / FrameSize)
	return &frameTable{owners: make([]owner, n), held: map[owner]int{}, sealed: make([]bool, n), shared: map[int][]api.Extent{}, free: n}
}

// alloc grants n frames to o: one contiguous run, found first-fit from the
// last allocation, if there is one; otherwise any free frames, ascending.
func (t *frameTable) alloc(o owner, n int) ([]uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n <= 0 {
		return nil, fmt.Errorf("allocate %d frames: %w", n, api.ErrInvalidArgument)
	}
	if n > t.free {
		return nil, fmt.Errorf("allocate %d frames (%d MiB): %d of %d free: %w", n, n*FrameSize>>20, t.free, len(t.owners), api.ErrOutOfMemory)
	}
	frames := make([]uint64, 0, n)
	if start, ok := t.findRun(n); ok {
		for i := start; i < start+n; i++ {
			frames = append(frames, uint64(i))
		}
		t.hint = (start + n) % len(t.owners)
	} else {
		for i := 0; i < len(t.owners) && len(frames) < n; i++ {
			if t.owners[i] == 0 {
				frames = append(frames, uint64(i))
			}
		}
	}
	for i, f := range frames {
		t.owners[f] = o
		frames[i] = f * FrameSize
	}
	t.held[o] += n
	t.free -= n
	return frames, nil
}

// findRun looks for n free frames in a row, starting at the hint and wrapping.
// The second pass runs n-1 frames past the hint, so that a run which starts
// before the hint and ends after it is found too.
func (t *frameTable) findRun(n int) (int, bool) {
	total := len(t.owners)
	for _, span := range [][2]int{{t.hint, total}, {0, min(t.hint+n-1, total)}} {
		run := 0
		for i := span[0]; i < span[1]; i++ {
			if t.owners[i] != 0 {
				run = 0
				continue
			}
			if run++; run == n {
				return i - n + 1, true
			}
		}
	}
	return 0, false
}

// frameOf validates a frame address and returns its number.
func (t *frameTable) frameOf(addr uint64) (int, error) {
	if addr%FrameSize != 0 || addr/FrameSize >= uint64(len(t.owners)) {
		return 0, fmt.Errorf("frame address %#x is not a frame of this device: %w", addr, api.ErrInvalidAddress)
	}
	return int(addr / FrameSize), nil
}

// checkOwned verifies that o owns every frame addrs names, without changing
// anything, so that a release either happens whole or not at all.
func (t *frameTable) checkOwned(o owner, addrs []uint64) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	seen := make(map[int]bool, len(addrs))
	for _, a := range addrs {
		f, err := t.frameOf(a)
		if err != nil {
			return err
		}
		if t.owners[f] != o {
			return fmt.Errorf("frame %#x is not held by this connection: %w", a, api.ErrPermissionDenied)
		}
		if seen[f] {
			return fmt.Errorf("frame %#x named twice: %w", a, api.ErrInvalidArgument)
		}
		seen[f] = true
	}
	return nil
}

// release marks frames free. The caller has checked ownership and scrubbed them.
func (t *frameTable) release(addrs []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range addrs {
		o := t.owners[a/FrameSize]
		if t.held[o]--; t.held[o] == 0 {
			delete(t.held, o)
		}
		t.owners[a/FrameSize] = 0
	}
	t.free += len(addrs)
}

// ownedBy lists the frames o holds.
func (t *frameTable) ownedBy(o owner) []uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []uint64
	for i, w := range t.owners {
		if w == o {
			out = append(out, uint64(i)*FrameSize)
		}
	}
	return out
}

// checkAccess verifies that every byte of xs lies in frames o owns, and
// that xs come to no more bytes than o holds: an honest list names each
// byte once, and one that repeats them must not turn into more work or
// host memory (a fill, a gathered launch argument, an object's snapshot)
// than the memory o was granted.
func (t *frameTable) checkAccess(o owner, xs []api.Extent) error { return t.check(o, xs, false) }

// checkWrite is checkAccess for memory to be changed: no byte of xs may lie
// in a sealed frame either.
func (t *frameTable) checkWrite(o owner, xs []api.Extent) error { return t.check(o, xs, true) }

func (t *frameTable) check(o owner, xs []api.Extent, write bool) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	limit := uint64(len(t.owners)) * FrameSize
	held := uint64(t.held[o]) * FrameSize
	var total uint64 // at most 65536 extents of at most limit bytes each: no overflow
	for _, x := range xs {
		if x.Len == 0 {
			continue
		}
		if x.Addr >= limit || x.Len > limit-x.Addr {
			return fmt.Errorf("extent [%#x, +%d) lies outside device memory of %d bytes: %w", x.Addr, x.Len, limit, api.ErrInvalidAddress)
		}
		for f := x.Addr / FrameSize; f <= (x.Addr+x.Len-1)/FrameSize; f++ {
			if t.owners[f] != o {
				return fmt.Errorf("extent [%#x, +%d) touches frame %#x not held by this connection: %w", x.Addr, x.Len, f*FrameSize, api.ErrPermissionDenied)
			}
			if write && t.sealed[f] {
				return fmt.Errorf("extent [%#x, +%d) touches sealed frame %#x, which is read-only: %w", x.Addr, x.Len, f*FrameSize, api.ErrPermissionDenied)
			}
			if write {
				for _, s := range t.shared[int(f)] {
					if s.Addr < x.Addr+x.Len && x.Addr < s.Addr+s.Len {
						return fmt.Errorf("extent [%#x, +%d) overlaps [%#x, +%d) of a shared object, which is written only through the object: %w", x.Addr, x.Len, s.Addr, s.Len, api.ErrPermissionDenied)
					}
				}
			}
		}
		if total += x.Len; total > held {
			return fmt.Errorf("%d extents come to more than the %d bytes this connection holds on the device (extent [%#x, +%d) passes it): %w", len(xs), held, x.Addr, x.Len, api.ErrInvalidArgument)
		}
	}
	return nil
}

// isSealed reports whether the frame at addr, which the caller holds, is sealed.
func (t *frameTable) isSealed(addr uint64) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.sealed[addr/FrameSize]
}

// seal marks the frame at addr, which the caller holds, read-only.
func (t *frameTable) seal(addr uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sealed[addr/FrameSize] = true
}

// unseal makes the frames at addrs writable again and returns those of them
// that were sealed.
func (t *frameTable) unseal(addrs []uint64) []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []uint64
	for _, a := range addrs {
		if f := a / FrameSize; t.sealed[f] {
			t.sealed[f] = false
			out = append(out, a)
		}
	}
	return out
}

// isShared reports whether any byte of xs is part of a shared object.
func (t *frameTable) isShared(xs []api.Extent) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, x := range xs {
		for f := x.Addr / FrameSize; x.Len > 0 && f <= (x.Addr+x.Len-1)/FrameSize; f++ {
			for _, s := range t.shared[int(f)] {
				if s.Addr < x.Addr+x.Len && x.Addr < s.Addr+s.Len {
					return true
				}
			}
		}
	}
	return false
}

// share records xs as runs of a shared object (on), or no longer (off).
func (t *frameTable) share(xs []api.Extent, on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, x := range xs {
		for a := x.Addr; a < x.Addr+x.Len; {
			f := int(a / FrameSize)
			end := min(x.Addr+x.Len, uint64(f+1)*FrameSize)
			piece := api.Extent{Addr: a, Len: end - a}
			if on {
				t.shared[f] = append(t.shared[f], piece)
			} else if i := slices.Index(t.shared[f], piece); i >= 0 {
				if t.shared[f] = slices.Delete(t.shared[f], i, i+1); len(t.shared[f]) == 0 {
					delete(t.shared, f)
				}
			}
			a = end
		}
	}
}

// usage reports total and free frames.
func (t *frameTable) usage() (total, free int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.owners), t.free
}
