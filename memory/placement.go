package memory

import (
	"cmp"
	"math/bits"
	"slices"

	"github.com/vgpu/vgpu/api/vocab"
)

// The virtual address space handed out. It starts above zero so that 0 (and
// any small integer a buggy tenant passes) is never a valid address, and
// ends at 2^48, the virtual address width of current GPUs.
const (
	vaBase = 1 << 32
	vaTop  = 1 << 48
)

// vaRun is the half-open virtual range [start, end).
type vaRun struct{ start, end uint64 }

// vaFree is the unused virtual address space in whole chunks: sorted,
// disjoint, never adjacent runs (adjacent ones are merged), so first fit
// reuses low addresses and the page table's top level stays small.
type vaFree struct{ runs []vaRun }

func newVAFree() vaFree { return vaFree{runs: []vaRun{{vaBase, vaTop}}} }

// take removes the first run of n bytes (a multiple of Page2M) and returns
// its start.
func (v *vaFree) take(n uint64) (uint64, bool) {
	for i, r := range v.runs {
		if r.end-r.start < n {
			continue
		}
		if r.end-r.start == n {
			v.runs = slices.Delete(v.runs, i, i+1)
		} else {
			v.runs[i].start += n
		}
		return r.start, true
	}
	return 0, false
}

// takeAt removes [start, start+n), which lies in one free run, as take
// would have handed it out: a space being rebuilt (RestoreLayout) takes
// back the chunks it had.
func (v *vaFree) takeAt(start, n uint64) {
	i, _ := slices.BinarySearchFunc(v.runs, start, func(r vaRun, s uint64) int {
		return cmp.Compare(r.end, s+1)
	})
	r := v.runs[i]
	switch {
	case r.start == start && r.end == start+n:
		v.runs = slices.Delete(v.runs, i, i+1)
	case r.start == start:
		v.runs[i].start += n
	case r.end == start+n:
		v.runs[i].end = start
	default:
		v.runs[i].end = start
		v.runs = slices.Insert(v.runs, i+1, vaRun{start + n, r.end})
	}
}

// put gives back [start, start+n), which take handed out.
func (v *vaFree) put(start, n uint64) {
	end := start + n
	i, _ := slices.BinarySearchFunc(v.runs, start, func(r vaRun, s uint64) int {
		return cmp.Compare(r.start, s)
	})
	joinLeft := i > 0 && v.runs[i-1].end == start
	joinRight := i < len(v.runs) && v.runs[i].start == end
	switch {
	case joinLeft && joinRight:
		v.runs[i-1].end = v.runs[i].end
		v.runs = slices.Delete(v.runs, i, i+1)
	case joinLeft:
		v.runs[i-1].end = end
	case joinRight:
		v.runs[i].start = start
	default:
		v.runs = slices.Insert(v.runs, i, vaRun{start, end})
	}
}

// chunk is a 2 MiB-aligned stretch of virtual addresses of one device,
// backed by one frame at the same offsets: page i of the chunk lives at
// frame + i*Page4K. This identity placement is how the allocator conserves
// contiguity (Mosaic's CoCoA): pages that are virtually contiguous inside a
// chunk are physically contiguous and aligned alike, so any 64 KiB or 2 MiB
// region that fills up, whichever allocations fill it, coalesces in place.
//
// An oversubscribing space may evict a chunk: it then has no frame, and its
// contents are in the space's Store under key (stored), or all zero. A
// resident chunk whose allocations are all sealed may keep its key, whose
// entry then still has its contents.
type chunk struct {
	va, frame uint64 // frame is meaningful while resident
	dev       uint32
	hint      vocab.Hint              // of every allocation in it
	used      [pagesPer2M / 64]uint64 // bit i set when page i is allocated
	n         int                     // pages allocated
	unsealed  int                     // pages of allocations not sealed
	partial   bool                    // listed in Space.partial
	lost      bool                    // its device lost its contents (lose.go): never resident again unless restored
	resident  bool                    // holds frame, its pages mapped
	stored    bool                    // its contents are in the store under key
	key       uint64
	ri        int    // index in Space.resident while resident
	lru       uint64 // Space.tick when last translated
	pin       uint64 // Space.pinEpoch while a fault-in must not evict it
	// frameSealed says the source made frame read-only (Range.SealFrames),
	// as it stays until it is returned: no other chunk may reuse it. Set
	// under mu alone, as a translation of resident chunks holds no more.
	frameSealed bool
	// atSource says the source sealed the chunk's frame once, before an
	// eviction, and has not missed a refill since: it may hold the
	// contents still (Refiller). Guarded by allocMu.
	atSource bool
	// sum is the SHA-256 of the stored contents, when summed (reset when
	// they change, at a write-back); guarded by allocMu.
	sum    [32]byte
	summed bool
}

// findFree returns the first page index, a multiple of align, that starts
// pages free pages.
func (c *chunk) findFree(pages, align int) (int, bool) {
	for start := 0; start+pages <= pagesPer2M; {
		p := c.firstUsed(start, start+pages)
		if p < 0 {
			return start, true
		}
		start = (p/align + 1) * align
	}
	return 0, false
}

// firstUsed returns the index of the first allocated page in [from, to), or
// -1 if there is none.
func (c *chunk) firstUsed(from, to int) int {
	for i := from; i < to; {
		w := c.used[i/64] >> (i % 64)
		if w != 0 {
			if j := i + bits.TrailingZeros64(w); j < to {
				return j
			}
			return -1
		}
		i = (i/64 + 1) * 64
	}
	return -1
}

// mark sets pages [first, first+pages) allocated or free; they are all in
// the opposite state.
func (c *chunk) mark(first, pages int, allocated bool) {
	for i, end := first, first+pages; i < end; {
		n := min(end-i, 64-i%64)
		m := (^uint64(0) >> (64 - n)) << (i % 64)
		if allocated {
			c.used[i/64] |= m
		} else {
			c.used[i/64] &^= m
		}
		i += n
	}
	if allocated {
		c.n += pages
	} else {
		c.n -= pages
	}
}

// runs calls f for each maximal run of allocated pages, in order.
func (c *chunk) runs(f func(first, pages int)) {
	for i := 0; i < pagesPer2M; {
		w := c.used[i/64] >> (i % 64)
		if w == 0 {
			i = (i/64 + 1) * 64
			continue
		}
		i += bits.TrailingZeros64(w)
		j := i
		for j < pagesPer2M {
			free := ^c.used[j/64] >> (j % 64)
			if free == 0 {
				j = (j/64 + 1) * 64
				continue
			}
			j += bits.TrailingZeros64(free)
			break
		}
		j = min(j, pagesPer2M)
		f(i, j-i)
		i = j
	}
}
