package accelerator

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/vgpu/vgpu/api"
)

// FrameSize is the unit in which a node hands out physical device memory.
const FrameSize = 2 << 20

// MaxSharedRuns bounds the runs of shared objects on one frame, which the
// frame table keeps, and writes and exports search, under the lock every
// tenant of the device waits for. A mediator exports whole allocations,
// whose runs are whole pages of at least 4 KiB, so a frame holds at most
// this many of them; an export that would put more on a frame is refused.
const MaxSharedRuns = FrameSize / 4096

// owner identifies who holds a frame: one mediator connection, which acts for
// one tenant. Zero means free.
type owner uint64

// retainedOwner holds the sealed frames the node keeps after their holders
// freed them (content.go): no connection's owner, as owners count up from 1.
const retainedOwner = ^owner(0)

// frameTable tracks which connection owns each frame of one device, and
// which frames are sealed (read-only, see content.go).
//
// Invariants: a frame has at most one owner; a frame is scrubbed between
// owners (by the caller of release, before the frame is marked free); only a
// held frame is sealed (retainedOwner's count as held), and it is unsealed
// (unseal) before it is released;
// a frame in a shared object that may be written (coherent or versioned) is
// never sealed, so the content index's hashes hold (shared.go, content.go);
// gen changes, under mu, with every change of the table.
type frameTable struct {
	mu sync.RWMutex
	// gen counts the table's changes: owners, held counts, seals and
	// shared runs alike. A check of extents made while gen was g holds
	// for as long as gen is g (a graph's run skips them then: graph.go).
	gen    atomic.Uint64
	owners []owner              // by frame number
	held   map[owner]int        // frames each owner holds
	sealed []bool               // by frame number
	shared map[int][]api.Extent // by frame number: the runs of it in shared objects (shared.go), sorted, disjoint, at most MaxSharedRuns
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
	t.gen.Add(1)
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
	t.gen.Add(1)
	for _, a := range addrs {
		o := t.owners[a/FrameSize]
		if t.held[o]--; t.held[o] == 0 {
			delete(t.held, o)
		}
		t.owners[a/FrameSize] = 0
	}
	t.free += len(addrs)
}

// move hands frames that from holds to to: sealed ones to retainedOwner
// and back (content.go). The caller holds the content index's lock.
func (t *frameTable) move(from, to owner, addrs []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen.Add(1)
	for _, a := range addrs {
		t.owners[a/FrameSize] = to
	}
	if t.held[from] -= len(addrs); t.held[from] == 0 {
		delete(t.held, from)
	}
	t.held[to] += len(addrs)
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
				if s, ok := t.sharedOverlap(int(f), x); ok {
					return fmt.Errorf("extent [%#x, +%d) overlaps [%#x, +%d) of a shared object, which is written only through the object: %w", x.Addr, x.Len, s.Addr, s.Len, api.ErrPermissionDenied)
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
	t.gen.Add(1)
	t.sealed[addr/FrameSize] = true
}

// unseal makes the frames at addrs writable again and returns those of them
// that were sealed.
func (t *frameTable) unseal(addrs []uint64) []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen.Add(1)
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
			if _, ok := t.sharedOverlap(int(f), x); ok {
				return true
			}
		}
	}
	return false
}

// sharedOverlap returns a run of a shared object in frame f that overlaps
// x (not empty), if there is one, by bisection: a frame's runs are sorted
// and disjoint, so their ends ascend too. The caller holds mu.
func (t *frameTable) sharedOverlap(f int, x api.Extent) (api.Extent, bool) {
	runs := t.shared[f]
	i := sort.Search(len(runs), func(i int) bool { return runs[i].Addr+runs[i].Len > x.Addr })
	if i < len(runs) && runs[i].Addr < x.Addr+x.Len {
		return runs[i], true
	}
	return api.Extent{}, false
}

// runsByFrame splits xs, which the caller checked lie in held frames, at
// frame boundaries, and returns the pieces of each frame sorted by
// address; empty extents have none.
func runsByFrame(xs []api.Extent) map[int][]api.Extent {
	out := map[int][]api.Extent{}
	for _, x := range xs {
		for a := x.Addr; a < x.Addr+x.Len; {
			f := int(a / FrameSize)
			end := min(x.Addr+x.Len, uint64(f+1)*FrameSize)
			out[f] = append(out[f], api.Extent{Addr: a, Len: end - a})
			a = end
		}
	}
	for _, ps := range out {
		slices.SortFunc(ps, func(a, b api.Extent) int { return cmp.Compare(a.Addr, b.Addr) })
	}
	return out
}

// shareable says why xs, distinct extents in held frames, cannot become
// runs of a shared object, or returns nil: a byte of them is part of one
// already, or they would put more than MaxSharedRuns runs on a frame.
func (t *frameTable) shareable(xs []api.Extent) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.shareableLocked(runsByFrame(xs))
}

func (t *frameTable) shareableLocked(byFrame map[int][]api.Extent) error {
	for f, ps := range byFrame {
		if have := len(t.shared[f]); len(ps) > MaxSharedRuns-have {
			return fmt.Errorf("%d more runs of shared objects on frame %#x, which holds %d: at most %d a frame: %w",
				len(ps), uint64(f)*FrameSize, have, MaxSharedRuns, api.ErrInvalidArgument)
		}
		for _, p := range ps {
			if s, ok := t.sharedOverlap(f, p); ok {
				return fmt.Errorf("[%#x, +%d) overlaps [%#x, +%d), which is part of a shared object already: %w",
					p.Addr, p.Len, s.Addr, s.Len, api.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// share records xs, distinct extents in held frames, as runs of a shared
// object, if shareable allows, all or none. Each frame's runs stay sorted.
func (t *frameTable) share(xs []api.Extent) error {
	byFrame := runsByFrame(xs)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen.Add(1)
	if err := t.shareableLocked(byFrame); err != nil {
		return err
	}
	for f, ps := range byFrame {
		runs := append(t.shared[f], ps...)
		slices.SortFunc(runs, func(a, b api.Extent) int { return cmp.Compare(a.Addr, b.Addr) })
		t.shared[f] = runs
	}
	return nil
}

// unshare forgets xs, which share recorded, as runs of a shared object.
func (t *frameTable) unshare(xs []api.Extent) {
	byFrame := runsByFrame(xs)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen.Add(1)
	for f, ps := range byFrame {
		// Both lists are sorted: one pass drops the runs of ps.
		i := 0
		t.shared[f] = slices.DeleteFunc(t.shared[f], func(s api.Extent) bool {
			for i < len(ps) && ps[i].Addr < s.Addr {
				i++
			}
			return i < len(ps) && ps[i] == s
		})
		if len(t.shared[f]) == 0 {
			delete(t.shared, f)
		}
	}
}

// usage reports total and free frames, and how many more the node keeps
// sealed for contents freed (retainedOwner's), which an allocation reclaims
// when the free ones run out.
func (t *frameTable) usage() (total, free, retained int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.owners), t.free, t.held[retainedOwner]
}
