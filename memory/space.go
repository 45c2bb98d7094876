// Package memory owns one tenant's device virtual address space in the
// mediator: which virtual ranges are allocated, on which device each lives,
// and the physical memory of that device they map to, through a radix page
// table of 4 KiB, 64 KiB and 2 MiB leaves with a TLB in front of it.
//
// Physical memory is leased from a FrameSource in 2 MiB frames, so a frame
// only ever holds this tenant's pages. Placement conserves contiguity, as in
// Mosaic (Ausavarungnirun et al., MICRO'17): virtual space is handed out in
// 2 MiB chunks, each backed by one frame at identical offsets. Allocations
// of 2 MiB or more take fresh chunks whose frames are granted in one call,
// so a contiguous grant makes the allocation physically contiguous. Smaller
// ones are packed into chunks of their device and residency hint that have
// room, 64 KiB aligned when they are at least 64 KiB, so every chunk has
// the one hint of all its allocations. Because offsets match, every
// 64 KiB or 2 MiB region that becomes fully populated is also physically
// contiguous and aligned, and the page table coalesces it into one large
// leaf in place; freeing part of it splinters the leaf, again without
// moving data.
//
// Oversubscription (see Oversubscribe) lets a space hold more memory than
// its device does: a chunk is then either resident (it has a frame and its
// pages are mapped) or evicted (no frame; its contents are in a Store, or
// all zero if it was never resident). Translate faults evicted chunks back
// in, evicting others to make room: by the class of their hint first
// (vocab.HintActivation and vocab.HintStaging, then vocab.HintNone, then
// vocab.HintKVCache, vocab.HintWeight last, as ephemeral buffers are cheapest
// to lose and weights costliest), then the least recently translated within
// a class, then the lowest address, so the choice is deterministic. The
// chunk, one frame, is the unit of residency, so a full resident chunk is
// still a single 2 MiB leaf and an eviction frees a whole frame.
//
// A Residency (SetResidency) is told of each eviction, once its contents
// are stored and before its frame is unmapped, returned or reused, and of
// each fault-in, once its frame is filled and before its store entry is
// dropped; a later process that replays those changes in order
// (RestoreEvicted, RestoreResident) after the same allocations, over a
// store that kept its entries (FileStore, a file that outlives the
// process), rebuilds the same residency. So that such a history need not
// grow for as long as the space lives, its owner may write down the
// space's Layout (Snapshot: every chunk with its frame or store key, every
// live allocation) in its place; RestoreLayout rebuilds an empty space
// from it, placing the next allocations where the original would.
//
// Seal makes an allocation immutable: translations for writing
// (TranslateWrite, a Range with Write) that touch it are refused. A chunk
// whose live allocations are all sealed therefore cannot change once it is
// resident, and when it is faulted in from the store it keeps its store
// entry, so evicting it again reads nothing back from the device (a clean
// eviction). Callers must translate for writing whatever a command writes.
//
// Invariants (between calls):
//   - Live allocations are disjoint; each covers its size rounded up to
//     Page4K, starts at an address aligned to 2 MiB, 64 KiB or 4 KiB by that
//     size, and lies in chunks of its own device and hint. Only the bytes
//     asked for are addressable: Translate and Span refuse the rounded tail.
//   - Exactly the pages of live allocations in resident chunks are mapped,
//     each to the same offset in its chunk's frame, so no two live pages
//     share physical memory.
//   - A chunk is held exactly while a live allocation has a page in it. A
//     frame is held exactly while it backs a resident chunk: it goes back to
//     the source when its chunk's last page is freed or the chunk is evicted
//     (unless a fault-in reuses it at once, which it never does with a frame
//     the source sealed), and each frame is returned at most once.
//   - A chunk holds at most one Store key. An evicted chunk holds one
//     exactly if it was ever resident. A resident chunk holds one only while
//     every live allocation in it is sealed (chunk.unsealed, the pages of
//     the others, is 0), and the entry then has the chunk's contents: the
//     key is kept at fault-in only if the chunk is all sealed, and dropped
//     when a new, unsealed allocation is placed in the resident chunk.
//     Otherwise a key is dropped when its chunk is faulted in; and always
//     when the chunk is freed or closed; never twice.
//   - Allocated is the sum of the live rounded sizes and never exceeds a
//     non-zero limit.
//   - The TLB holds no translation of an unmapped page.
//
// Lock order: allocMu, then mu. allocMu serialises the calls that change the
// address space (Alloc, Free, Seal, Close, and a Translate that faults) and
// is held across calls to the FrameSource, the Store and the Residency,
// which therefore must not call back into the Space. mu guards what Translate, Span, Hint
// and Stats read and is never held across a source or store call, so
// translations of resident memory go on while a Grant or an eviction waits
// on a remote node.
package memory

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/vgpu/vgpu/api/vocab"
)

// Page sizes of the page table, and the unit in which physical memory is
// leased.
const (
	Page4K    = 4 << 10
	Page64K   = 64 << 10
	Page2M    = 2 << 20
	FrameSize = Page2M
)

// maxAlloc bounds one allocation, so sizes and address arithmetic stay far
// from overflow and a single request cannot reserve the address space.
const maxAlloc = 1 << 40

// FrameSource leases 2 MiB frames of one device to this address space's
// tenant. Spaces that do not oversubscribe never call Read, Write or Zero.
type FrameSource interface {
	// Grant returns n frames of device dev as physical base addresses
	// (multiples of FrameSize), ascending and contiguous when it can. It
	// fails with vocab.ErrOutOfMemory when the device is full. Granted frames
	// read as zero (the node scrubs every frame it takes back).
	Grant(dev uint32, n int) ([]uint64, error)
	// Return gives frames back; the node scrubs them before anyone else
	// gets them.
	Return(dev uint32, frames []uint64) error
	// Read copies the contents of a held frame into p (FrameSize bytes).
	Read(dev uint32, frame uint64, p []byte) error
	// Write copies p (FrameSize bytes) into a held frame.
	Write(dev uint32, frame uint64, p []byte) error
	// Zero clears a held frame.
	Zero(dev uint32, frame uint64) error
}

// Refiller is a FrameSource that may fill a held frame from memory it holds
// already, named by the SHA-256 of its FrameSize bytes, rather than be sent
// them: a node that retains sealed frames (accelerator/content.go). A space
// whose source is one asks it first when it faults in a chunk whose
// contents were sealed at the source before they were evicted.
type Refiller interface {
	// Refill fills each of the held frames of dev with the bytes whose
	// SHA-256 is sums[i], if the source holds them, and says for each
	// whether it did.
	Refill(dev uint32, frames []uint64, sums [][32]byte) ([]bool, error)
}

// Stats is a consistent snapshot of a Space.
type Stats struct {
	Allocations int
	Allocated   uint64 // sum of live allocation sizes as rounded
	Mapped      uint64 // bytes of frames held (frames × FrameSize)
	Frames      int
	// Bytes mapped by leaves of each size; they sum to the bytes of live
	// allocations in resident chunks (Allocated, unless chunks are evicted).
	Mapped4K, Mapped64K, Mapped2M uint64
	TLBHits, TLBMisses            uint64
	// Bytes of resident chunks (equal to Mapped) and of evicted ones.
	Resident, Evicted uint64
	// Bytes of chunks whose contents their device lost (Lose).
	Lost uint64
	// Chunks faulted in and chunks evicted, since the space was made.
	Faults, Evictions uint64
	// Evictions that read the chunk back from the device, and those that
	// did not since the store still had its sealed contents; they sum to
	// Evictions.
	WriteBacks, CleanEvictions uint64
	// Faults the source filled from memory it held (Refiller), with no
	// bytes sent.
	Refills uint64
	// SealedFrames are the resident chunks whose frames the source made
	// read-only (Range.SealFrames): none of them is reused for another
	// chunk.
	SealedFrames int
}

// basePagesOnly is a test hook: while set, NewSpace builds page tables that
// never coalesce, so benchmarks can measure what large leaves save.
var basePagesOnly bool

var errClosed = fmt.Errorf("address space closed: %w", vocab.ErrInvalidArgument)

// Space is one tenant's device virtual address space. It is safe for
// concurrent use.
type Space struct {
	src   FrameSource
	limit uint64

	allocMu sync.Mutex
	// Guarded by allocMu.
	vas      vaFree
	partial  map[pool][]*chunk   // chunks with free pages, by address
	held     map[devFrame]bool   // the frames of resident chunks
	resident map[uint32][]*chunk // per device, the resident chunks, unordered
	pinEpoch uint64              // marks the chunks a fault-in pins (chunk.pin)

	mu sync.Mutex
	// Guarded by mu and allocMu together: writers hold both, so holding
	// either is enough to read.
	closed    bool
	chunks    map[uint64]*chunk // by virtual address
	allocs    []*allocation     // live, sorted by address
	allocated uint64
	frames    int // resident chunks, each holding one frame
	evicted   int // evicted chunks
	lost      int // chunks whose contents their device lost (lose.go)
	pt        pageTable
	// Oversubscription, off while store is nil.
	store                      Store
	lend                       frameStore // store, if it lends its buffers
	residency                  Residency  // told of residency changes, or nil (residency.go)
	maxFrames                  int        // cap on frames; 0 means none
	faults, evictions          uint64
	writeBacks, cleanEvictions uint64
	refills                    uint64
	// Guarded by mu alone, since every translation updates them.
	tlb  tlb
	tick uint64 // stamps chunk.lru
}

type allocation struct {
	va, size uint64 // size rounded to Page4K
	want     uint64 // size as asked: the tenant may touch [va, va+want)
	dev      uint32
	hint     vocab.Hint
	sealed   bool // immutable: translations for writing are refused
	// lost, when set, is why the allocation's contents are gone (its
	// device lost the memory of a chunk of it, lose.go): every translation
	// of it fails with it, until Restore gives them back.
	lost error
	// sums are the SHA-256 of each of its whole chunks' contents, as the
	// caller learnt them once sealed (SetSums); nil if never given.
	sums [][32]byte
}

func (a *allocation) end() uint64 { return a.va + a.size }

// limit is the end of what the tenant may address: the rounded tail is
// accounted and mapped, but touching it is a bug worth reporting.
func (a *allocation) limit() uint64 { return a.va + a.want }

// pool is the chunks that small allocations may share: those of one device
// and one hint, so that each chunk has one eviction class.
type pool struct {
	dev  uint32
	hint vocab.Hint
}

type devFrame struct {
	dev   uint32
	frame uint64
}

// segment is the part of an allocation that lies in one chunk.
type segment struct {
	c            *chunk
	first, pages int
}

// NewSpace returns an empty address space whose frames come from src.
// limit caps Allocated; 0 means no cap.
func NewSpace(src FrameSource, limit uint64) *Space {
	return &Space{
		src:      src,
		limit:    limit,
		vas:      newVAFree(),
		chunks:   make(map[uint64]*chunk),
		partial:  make(map[pool][]*chunk),
		held:     make(map[devFrame]bool),
		resident: make(map[uint32][]*chunk),
		pt:       newPageTable(basePagesOnly),
		tlb:      newTLB(),
	}
}

// Footprint is the memory an allocation of size bytes takes (size rounded
// up to Page4K), or an error if no allocation may have that size.
func Footprint(size uint64) (uint64, error) {
	if size == 0 || size > maxAlloc {
		return 0, fmt.Errorf("size %d: must be 1 to %d bytes: %w", size, uint64(maxAlloc), vocab.ErrInvalidArgument)
	}
	return (size + Page4K - 1) &^ (Page4K - 1), nil
}

// Alloc is AllocHint with vocab.HintNone.
func (s *Space) Alloc(dev uint32, size uint64) (va uint64, err error) {
	return s.AllocHint(dev, size, vocab.HintNone)
}

// AllocHint reserves size bytes on device dev, maps them and returns their
// virtual address. The allocation takes size rounded up to Page4K, which
// counts against the limit; only the size asked for may be addressed. The
// hint sets its eviction class (see the package comment); it shares chunks
// only with allocations of the same device and hint.
func (s *Space) AllocHint(dev uint32, size uint64, hint vocab.Hint) (va uint64, err error) {
	if !hint.Valid() {
		return 0, fmt.Errorf("alloc on device %d: residency hint %v: %w", dev, hint, vocab.ErrInvalidArgument)
	}
	rounded, err := Footprint(size)
	if err != nil {
		return 0, fmt.Errorf("alloc on device %d: %w", dev, err)
	}
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	if s.closed {
		return 0, fmt.Errorf("alloc %d bytes on device %d: %w", size, dev, errClosed)
	}
	if s.limit != 0 && rounded > s.limit-s.allocated {
		return 0, fmt.Errorf("alloc %d bytes (%d rounded to pages) on device %d: %d of %d bytes in use: %w",
			size, rounded, dev, s.allocated, s.limit, vocab.ErrQuotaExceeded)
	}
	var a *allocation
	if p := (pool{dev, hint}); rounded >= Page2M {
		a, err = s.allocChunks(p, rounded, size)
	} else {
		a, err = s.allocPages(p, rounded, size)
	}
	if err != nil {
		return 0, fmt.Errorf("alloc %d bytes on device %d: %w", size, dev, err)
	}
	return a.va, nil
}

// allocChunks places an allocation of at least Page2M in fresh chunks.
func (s *Space) allocChunks(p pool, size, want uint64) (*allocation, error) {
	cs, err := s.newChunks(p, int((size+Page2M-1)/Page2M))
	if err != nil {
		return nil, err
	}
	segs := make([]segment, len(cs))
	for i, c := range cs {
		segs[i] = segment{c: c, pages: int(min(size-uint64(i)*Page2M, Page2M) / Page4K)}
	}
	return s.commit(p, size, want, segs, cs), nil
}

// allocPages places an allocation smaller than Page2M in the first chunk of
// pool p with room at a suitably aligned offset, or in a fresh one. Packing
// first fit keeps the number of frames held low.
func (s *Space) allocPages(p pool, size, want uint64) (*allocation, error) {
	pages, align := int(size/Page4K), 1
	if size >= Page64K {
		align = pagesPer64K
	}
	for _, c := range s.partial[p] {
		if first, ok := c.findFree(pages, align); ok {
			if c.resident && c.stored {
				// The kept entry will miss what the tenant writes here.
				s.dropKey(c)
			}
			return s.commit(p, size, want, []segment{{c: c, first: first, pages: pages}}, nil), nil
		}
	}
	cs, err := s.newChunks(p, 1)
	if err != nil {
		return nil, err
	}
	return s.commit(p, size, want, []segment{{c: cs[0], pages: pages}}, cs), nil
}

// newChunks reserves n adjacent chunks of virtual address space for pool p
// and backs them with frames of its device. An oversubscribing space backs
// only as many as its cap allows, and none if the device is full; the
// others start evicted, all zero, and are faulted in when first translated.
// On failure nothing stays reserved.
func (s *Space) newChunks(p pool, n int) ([]*chunk, error) {
	bytes := uint64(n) * Page2M
	va, ok := s.vas.take(bytes)
	if !ok {
		return nil, fmt.Errorf("no free run of %d bytes of virtual address space: %w", bytes, vocab.ErrOutOfMemory)
	}
	k := n
	if s.maxFrames != 0 {
		k = max(0, min(n, s.maxFrames-s.frames))
	}
	var frames []uint64
	if k > 0 {
		var err error
		frames, err = s.grant(p.dev, k)
		if err != nil && (s.store == nil || !errors.Is(err, vocab.ErrOutOfMemory)) {
			s.vas.put(va, bytes)
			return nil, err
		}
	}
	cs := make([]*chunk, n)
	for i := range cs {
		cs[i] = &chunk{va: va + uint64(i)*Page2M, dev: p.dev, hint: p.hint}
		if i < len(frames) {
			cs[i].frame, cs[i].resident = frames[i], true
		}
	}
	return cs, nil
}

// grant asks the source for n frames of dev and checks the answer: frames
// that are misaligned, repeated or already held would alias memory, so a
// grant with any of them is refused. What was certainly granted (aligned,
// distinct, not held) is given back.
func (s *Space) grant(dev uint32, n int) ([]uint64, error) {
	frames, err := s.src.Grant(dev, n)
	if err != nil {
		return nil, fmt.Errorf("grant %d frames of device %d: %w", n, dev, err)
	}
	var bad error
	seen := make(map[uint64]bool, len(frames))
	var ours []uint64
	for _, f := range frames {
		switch {
		case f%FrameSize != 0:
			bad = fmt.Errorf("frame %#x is not a multiple of %#x", f, FrameSize)
		case seen[f] || s.held[devFrame{dev, f}]:
			bad = fmt.Errorf("frame %#x is granted twice", f)
		default:
			seen[f] = true
			ours = append(ours, f)
		}
	}
	if bad == nil && len(frames) != n {
		bad = fmt.Errorf("got %d frames", len(frames))
	}
	if bad == nil {
		return frames, nil
	}
	err = fmt.Errorf("grant %d frames of device %d: source broke its contract: %v: %w", n, dev, bad, vocab.ErrInternal)
	if len(ours) > 0 {
		if rerr := s.src.Return(dev, ours); rerr != nil {
			err = errors.Join(err, fmt.Errorf("return the %d frames of device %d from that grant: %w", len(ours), dev, rerr))
		}
	}
	return nil, err
}

// commit records an allocation of size bytes made of segs, in address
// order; fresh are the chunks newly created for it.
func (s *Space) commit(p pool, size, want uint64, segs []segment, fresh []*chunk) *allocation {
	for _, g := range segs {
		g.c.mark(g.first, g.pages, true)
		g.c.unsealed += g.pages
		s.updatePartial(g.c)
	}
	a := &allocation{va: segs[0].c.va + uint64(segs[0].first)*Page4K, size: size, want: want, dev: p.dev, hint: p.hint}

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range fresh {
		s.chunks[c.va] = c
		if c.resident {
			s.addResident(c)
			c.lru = s.tick
		} else {
			s.evicted++
		}
	}
	for _, g := range segs {
		if g.c.resident {
			off := uint64(g.first) * Page4K
			s.pt.mapRange(g.c.va+off, g.c.frame+off, uint64(g.pages)*Page4K)
		}
	}
	i := sort.Search(len(s.allocs), func(i int) bool { return s.allocs[i].va > a.va })
	s.allocs = slices.Insert(s.allocs, i, a)
	s.allocated += size
	return a
}

// addResident records that c holds its frame. The caller holds both locks.
func (s *Space) addResident(c *chunk) {
	s.held[devFrame{c.dev, c.frame}] = true
	c.ri = len(s.resident[c.dev])
	s.resident[c.dev] = append(s.resident[c.dev], c)
	s.frames++
}

// dropResident records that c no longer holds its frame. The caller holds
// both locks.
func (s *Space) dropResident(c *chunk) {
	delete(s.held, devFrame{c.dev, c.frame})
	list := s.resident[c.dev]
	last := list[len(list)-1]
	list[c.ri], last.ri = last, c.ri
	list[len(list)-1] = nil
	if list = list[:len(list)-1]; len(list) == 0 {
		delete(s.resident, c.dev)
	} else {
		s.resident[c.dev] = list
	}
	s.frames--
}

// updatePartial lists c among its pool's chunks with room exactly when it
// has some room and some use (an unused chunk is about to be released).
func (s *Space) updatePartial(c *chunk) {
	want := c.n > 0 && c.n < pagesPer2M && !c.lost // nothing new goes into a lost chunk
	if want == c.partial {
		return
	}
	p := pool{c.dev, c.hint}
	list := s.partial[p]
	i, _ := slices.BinarySearchFunc(list, c.va, func(x *chunk, va uint64) int { return cmp.Compare(x.va, va) })
	if want {
		list = slices.Insert(list, i, c)
	} else {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(s.partial, p)
	} else {
		s.partial[p] = list
	}
	c.partial = want
}

// Free releases the allocation that starts at va and returns the frames it
// leaves unused. If the source fails to take them back, the allocation is
// still freed and the frames are forgotten, not retried: the outcome of a
// failed Return is unknown, and returning a frame twice could release one
// the node has since leased to someone else. The error says so.
func (s *Space) Free(va uint64) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	i, err := s.startOf("free", va)
	if err != nil {
		return err
	}
	a := s.allocs[i]
	var unused, keys []uint64
	s.mu.Lock()
	s.allocs = slices.Delete(s.allocs, i, i+1)
	for g := range s.segments(a) {
		c := g.c
		c.mark(g.first, g.pages, false)
		if !a.sealed {
			c.unsealed -= g.pages
		}
		s.updatePartial(c)
		if c.resident {
			s.pt.unmapRange(c.va+uint64(g.first)*Page4K, uint64(g.pages)*Page4K)
		}
		if c.n == 0 {
			delete(s.chunks, c.va)
			s.vas.put(c.va, Page2M)
			switch {
			case c.resident:
				s.dropResident(c)
				unused = append(unused, c.frame)
			case c.lost:
				s.lost--
			default:
				s.evicted--
			}
			if c.stored {
				keys = append(keys, c.key)
			}
		}
	}
	s.tlb.invalidate(a.va, a.size)
	s.allocated -= a.size
	s.mu.Unlock()

	for _, k := range keys {
		s.store.Drop(k)
	}
	if len(unused) == 0 {
		return nil
	}
	if err := s.src.Return(a.dev, unused); err != nil {
		return fmt.Errorf("free %#x: freed, but returning %d frames of device %d failed: %w", va, len(unused), a.dev, err)
	}
	return nil
}

// startOf returns the index of the live allocation that starts at va, the
// address that op (which must change the address space) was given. The
// caller holds allocMu.
func (s *Space) startOf(op string, va uint64) (int, error) {
	if s.closed {
		return 0, fmt.Errorf("%s %#x: %w", op, va, errClosed)
	}
	i, ok := s.find(va)
	if !ok {
		return 0, fmt.Errorf("%s %#x: no live allocation there (never allocated, or already freed): %w", op, va, vocab.ErrInvalidAddress)
	}
	if a := s.allocs[i]; a.va != va {
		return 0, fmt.Errorf("%s %#x: not the start of an allocation (it lies inside the one at %#x): %w", op, va, a.va, vocab.ErrInvalidAddress)
	}
	return i, nil
}

// CheckStart verifies that va is where a live allocation starts, as op
// (one that acts on a whole allocation, as Free does) needs.
func (s *Space) CheckStart(op string, va uint64) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	_, err := s.startOf(op, va)
	return err
}

// segments yields the part of a in each of its chunks, in order. The caller
// holds allocMu.
func (s *Space) segments(a *allocation) iter.Seq[segment] {
	return func(yield func(segment) bool) {
		for cur := a.va; cur < a.end(); {
			c := s.chunks[cur&^(Page2M-1)]
			next := min(a.end(), c.va+Page2M)
			if !yield(segment{c: c, first: int((cur - c.va) / Page4K), pages: int((next - cur) / Page4K)}) {
				return
			}
			cur = next
		}
	}
}

// Seal makes the allocation that starts at va immutable: from now on,
// translations for writing that touch it are refused, which is what lets
// chunks holding only sealed allocations skip the write-back when evicted.
// Sealing is for good; sealing again does nothing.
func (s *Space) Seal(va uint64) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	i, err := s.startOf("seal", va)
	if err != nil {
		return err
	}
	a := s.allocs[i]
	if a.sealed {
		return nil
	}
	s.mu.Lock()
	a.sealed = true
	s.mu.Unlock()
	for g := range s.segments(a) {
		g.c.unsealed -= g.pages
	}
	return nil
}

// Hint returns the residency hint of the live allocation that contains va,
// and whether it is sealed.
func (s *Space) Hint(va uint64) (hint vocab.Hint, sealed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.containing("hint of", va)
	if err != nil {
		return 0, false, err
	}
	return a.hint, a.sealed, nil
}

// containing returns the live allocation that contains va, which op was
// given. The caller holds mu.
func (s *Space) containing(op string, va uint64) (*allocation, error) {
	if s.closed {
		return nil, fmt.Errorf("%s %#x: %w", op, va, errClosed)
	}
	i, ok := s.find(va)
	if !ok {
		return nil, fmt.Errorf("%s %#x: no live allocation contains it: %w", op, va, vocab.ErrInvalidAddress)
	}
	return s.allocs[i], nil
}

// find returns the index of the live allocation whose addressable range
// contains va.
func (s *Space) find(va uint64) (int, bool) {
	return s.findIn(va, (*allocation).limit)
}

// findIn returns the index of the live allocation a with va in [a.va, end(a)).
func (s *Space) findIn(va uint64, end func(*allocation) uint64) (int, bool) {
	i := sort.Search(len(s.allocs), func(i int) bool { return s.allocs[i].va > va }) - 1
	if i < 0 || va >= end(s.allocs[i]) {
		return 0, false
	}
	return i, true
}

// Translate returns the device and the physical runs that back [va, va+n),
// in order, adjacent runs merged. The range must be non-empty and lie
// inside one live allocation: a kernel or copy may never cross from one
// buffer into another, even if both are the tenant's.
//
// In an oversubscribing space, Translate first faults in every evicted chunk
// of the range, which may evict other chunks: runs returned by an earlier
// Translate are valid only until the next one (see Resident). If the range
// spans more chunks than the space may keep resident, or no frame can be
// found or freed for it, it fails with vocab.ErrOutOfMemory.
func (s *Space) Translate(va, n uint64) (dev uint32, xs []vocab.Extent, err error) {
	return s.translateOne(Range{VA: va, Len: n}, (*allocation).limit)
}

// TranslateWrite is Translate for a range the caller will write: it fails
// with vocab.ErrPermissionDenied if the range lies in a sealed allocation.
func (s *Space) TranslateWrite(va, n uint64) (dev uint32, xs []vocab.Extent, err error) {
	return s.translateOne(Range{VA: va, Len: n, Write: true}, (*allocation).limit)
}

// translateOne translates one range as translate does.
func (s *Space) translateOne(r Range, end func(*allocation) uint64) (uint32, []vocab.Extent, error) {
	rs := [1]Range{r}
	var ts [1]Translation
	if err := s.translate(rs[:], ts[:], nil, end); err != nil {
		return 0, nil, err
	}
	return ts[0].Dev, ts[0].Extents, nil
}

// Range is the virtual range [VA, VA+Len) of one operand of a command.
type Range struct {
	VA, Len uint64
	// Write says the command writes the range, which is refused if it lies
	// in a sealed allocation.
	Write bool
	// SealFrames says the command makes the frames of the range read-only
	// at the source (a node's seal), as they stay until returned: a fault-in
	// then never reuses them for another chunk, since it could not fill
	// them. The range must be whole chunks of a sealed allocation.
	SealFrames bool
}

// Translation is where a Range lives: its device and physical runs.
type Translation struct {
	Dev     uint32
	Extents []vocab.Extent
}

// TranslateAll translates the ranges of one command, each as Translate
// does, or TranslateWrite for those with Write. In an oversubscribing space it makes them resident together, so
// that faulting one in never evicts another: a command whose operands are
// translated one by one could find the first evicted by the second.
func (s *Space) TranslateAll(rs []Range) ([]Translation, error) {
	ts := make([]Translation, len(rs))
	if err := s.translate(rs, ts, nil, (*allocation).limit); err != nil {
		return nil, err
	}
	return ts, nil
}

// TranslateInto is TranslateAll into ts, one Translation per range, with
// the extents cut from spare's capacity as far as it goes (and from the
// heap beyond). A caller that uses the translations before it reuses ts
// and spare can keep both on its stack: a launch, which encodes them into
// its node message at once, then allocates nothing for them.
func (s *Space) TranslateInto(rs []Range, ts []Translation, spare []vocab.Extent) error {
	return s.translate(rs, ts, spare, (*allocation).limit)
}

// Resident reports whether every chunk of the ranges is resident, that is
// whether translating them would neither fault nor evict. The ranges must
// be valid, as for Translate; invalid ones report true (translating them
// fails without side effects). A caller that pipelines commands on
// translated runs must let the commands in flight finish before a
// translation that is not resident, since it may evict their memory.
func (s *Space) Resident(rs ...Range) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.store == nil || s.closed {
		return true
	}
	for _, r := range rs {
		if _, err := s.resolve(r, (*allocation).limit); err != nil {
			continue
		}
		for cva := r.VA &^ (Page2M - 1); cva < r.VA+r.Len; cva += Page2M {
			if !s.chunks[cva].resident {
				return false
			}
		}
	}
	return true
}

// translate is TranslateAll with the end of each allocation given by end:
// its addressable limit, or (for tests of whole pages) its rounded end. It
// fills ts, one Translation per range, their extents cut from spare's
// capacity first (extents).
func (s *Space) translate(rs []Range, ts []Translation, spare []vocab.Extent, end func(*allocation) uint64) error {
	s.mu.Lock()
	if s.store != nil {
		// Check every range first, so an invalid one neither faults nor
		// stamps anything.
		for _, r := range rs {
			if _, err := s.resolve(r, end); err != nil {
				s.mu.Unlock()
				return err
			}
		}
		if !s.touch(rs) {
			s.mu.Unlock()
			return s.translateFaulting(rs, ts, spare, end)
		}
	}
	defer s.mu.Unlock()
	return s.extents(rs, ts, spare, end)
}

// translateFaulting makes the ranges resident and translates them, holding
// allocMu throughout so that nothing is evicted in between.
func (s *Space) translateFaulting(rs []Range, ts []Translation, spare []vocab.Extent, end func(*allocation) uint64) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	for _, r := range rs { // again: a Free or Close may have come between
		if _, err := s.resolve(r, end); err != nil {
			return err
		}
	}
	if err := s.faultIn(rs); err != nil {
		what := fmt.Sprintf("%#x+%d", rs[0].VA, rs[0].Len)
		if len(rs) > 1 {
			what = fmt.Sprintf("%d ranges from %#x+%d", len(rs), rs[0].VA, rs[0].Len)
		}
		return fmt.Errorf("translate %s: %w", what, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.touch(rs)
	return s.extents(rs, ts, spare, end)
}

// resolve checks that r is a valid range and returns its allocation. The
// caller holds mu or allocMu.
func (s *Space) resolve(r Range, end func(*allocation) uint64) (*allocation, error) {
	va, n := r.VA, r.Len
	if s.closed {
		return nil, fmt.Errorf("translate %#x+%d: %w", va, n, errClosed)
	}
	if n == 0 {
		return nil, fmt.Errorf("translate %#x+0: empty range: %w", va, vocab.ErrInvalidAddress)
	}
	i, ok := s.findIn(va, end)
	if !ok {
		return nil, fmt.Errorf("translate %#x+%d: no live allocation contains %#x: %w", va, n, va, vocab.ErrInvalidAddress)
	}
	a := s.allocs[i]
	if n > end(a)-va {
		return nil, fmt.Errorf("translate %#x+%d: runs past %#x, the end of the %d-byte allocation at %#x: %w",
			va, n, end(a), a.want, a.va, vocab.ErrInvalidAddress)
	}
	if a.lost != nil {
		return nil, fmt.Errorf("translate %#x+%d: the allocation at %#x: %w", va, n, a.va, a.lost)
	}
	if r.Write && a.sealed {
		return nil, fmt.Errorf("translate %#x+%d for writing: the allocation at %#x is sealed: %w", va, n, a.va, vocab.ErrPermissionDenied)
	}
	if r.SealFrames {
		// Frames are sealed whole, so a range that were not whole chunks
		// would seal other allocations' pages, and an unsealed allocation
		// may still be written.
		switch {
		case va%Page2M != 0 || n%Page2M != 0:
			return nil, fmt.Errorf("translate %#x+%d to seal its frames: not whole chunks of %d bytes: %w", va, n, Page2M, vocab.ErrInvalidArgument)
		case !a.sealed:
			return nil, fmt.Errorf("translate %#x+%d to seal its frames: the allocation at %#x is not sealed: %w", va, n, a.va, vocab.ErrInvalidArgument)
		}
	}
	return a, nil
}

// touch stamps every chunk of the valid ranges rs as just used and reports
// whether all of them are resident. The caller holds mu.
func (s *Space) touch(rs []Range) bool {
	s.tick++
	all := true
	for _, r := range rs {
		for cva := r.VA &^ (Page2M - 1); cva < r.VA+r.Len; cva += Page2M {
			c := s.chunks[cva]
			c.lru = s.tick
			all = all && c.resident
		}
	}
	return all
}

// extents translates each range into ts, and marks the chunks of ranges
// with SealFrames as holding sealed frames. The ranges' extents are cut
// one after another from one buffer, spare's capacity first, each capped
// at its length so that none can grow into the next. The caller holds mu.
func (s *Space) extents(rs []Range, ts []Translation, spare []vocab.Extent, end func(*allocation) uint64) error {
	xs := spare[:0]
	for k, r := range rs {
		a, err := s.resolve(r, end)
		if err != nil {
			return err
		}
		va, n := r.VA, r.Len
		first := len(xs) // this range's extents are xs[first:]
		stop := va + n
		for cur := va; cur < stop; {
			l, ok := s.lookup(cur)
			if !ok {
				return fmt.Errorf("translate %#x+%d: page %#x of the allocation at %#x is not mapped: %w",
					va, n, cur, a.va, vocab.ErrInternal)
			}
			next := min(stop, l.base+l.size())
			pa := l.pa + (cur - l.base)
			if k := len(xs) - 1; k >= first && xs[k].Addr+xs[k].Len == pa {
				xs[k].Len += next - cur
			} else {
				xs = append(xs, vocab.Extent{Addr: pa, Len: next - cur})
			}
			cur = next
		}
		ts[k] = Translation{Dev: a.dev, Extents: xs[first:len(xs):len(xs)]}
		if r.SealFrames {
			for cva := va; cva < stop; cva += Page2M {
				s.chunks[cva].frameSealed = true
			}
		}
	}
	return nil
}

// lookup returns the leaf that maps va: from the TLB, or else from a walk
// of the page table, which then fills the TLB. This is the per-address path
// of every translation. The caller holds mu.
func (s *Space) lookup(va uint64) (leaf, bool) {
	if l, ok := s.tlb.lookup(va); ok {
		return l, true
	}
	l, ok := s.pt.walk(va)
	if ok {
		s.tlb.fill(l)
	}
	return l, ok
}

// Span returns the device and the end address of the live allocation that
// contains va, the range a kernel given a pointer to va may touch.
func (s *Space) Span(va uint64) (dev uint32, end uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.containing("span", va)
	if err != nil {
		return 0, 0, err
	}
	return a.dev, a.limit(), nil
}

// Allocation describes a live allocation: it starts at VA, the tenant may
// address [VA, End), it lives on Dev, and whether it is sealed.
type Allocation struct {
	VA, End uint64
	Dev     uint32
	Sealed  bool
}

// AllocationAt describes the live allocation that contains va, which may
// lie anywhere in its addressable range: what a caller that keys state on
// whole allocations (their start, as Free and Seal take) needs of a
// pointer into one.
func (s *Space) AllocationAt(va uint64) (Allocation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.containing("allocation at", va)
	if err != nil {
		return Allocation{}, err
	}
	return Allocation{VA: a.va, End: a.limit(), Dev: a.dev, Sealed: a.sealed}, nil
}

// Close frees every allocation and returns every frame, one Return per
// device. The Space is unusable afterwards, even if a Return fails: the
// frames are forgotten for the reason Free gives, and the errors reported.
func (s *Space) Close() error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	if s.closed {
		return fmt.Errorf("close: %w", errClosed)
	}
	s.mu.Lock()
	s.closed = true
	chunks := s.chunks
	s.chunks, s.allocs = nil, nil
	s.allocated, s.frames, s.evicted, s.lost = 0, 0, 0, 0
	s.pt = pageTable{}
	s.tlb = tlb{hits: s.tlb.hits, misses: s.tlb.misses}
	s.mu.Unlock()

	byDev := make(map[uint32][]uint64)
	for _, c := range chunks {
		if c.resident {
			byDev[c.dev] = append(byDev[c.dev], c.frame)
		}
		if c.stored {
			s.store.Drop(c.key)
		}
	}
	s.partial, s.held, s.resident = nil, nil, nil
	var errs []error
	for _, dev := range slices.Sorted(maps.Keys(byDev)) {
		frames := byDev[dev]
		slices.Sort(frames)
		if err := s.src.Return(dev, frames); err != nil {
			errs = append(errs, fmt.Errorf("close: return %d frames of device %d: %w", len(frames), dev, err))
		}
	}
	return errors.Join(errs...)
}

// Stats returns a snapshot of the space's accounting.
func (s *Space) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{
		Allocations:    len(s.allocs),
		Allocated:      s.allocated,
		Mapped:         uint64(s.frames) * FrameSize,
		Frames:         s.frames,
		Mapped4K:       s.pt.mapped[class4K],
		Mapped64K:      s.pt.mapped[class64K],
		Mapped2M:       s.pt.mapped[class2M],
		TLBHits:        s.tlb.hits,
		TLBMisses:      s.tlb.misses,
		Resident:       uint64(s.frames) * Page2M,
		Evicted:        uint64(s.evicted) * Page2M,
		Lost:           uint64(s.lost) * Page2M,
		Faults:         s.faults,
		Evictions:      s.evictions,
		WriteBacks:     s.writeBacks,
		CleanEvictions: s.cleanEvictions,
		Refills:        s.refills,
		SealedFrames:   s.sealedFrames(),
	}
}

// sealedFrames counts the resident chunks whose frames are sealed. The
// caller holds mu.
func (s *Space) sealedFrames() int {
	n := 0
	for _, c := range s.chunks {
		if c.resident && c.frameSealed {
			n++
		}
	}
	return n
}

// RestoreFrameSeal marks the frames of the resident chunks of [va, va+n)
// sealed, as a translation with SealFrames did before a restart: a space
// being rebuilt replays it where its owner journaled that translation.
// Evicted chunks of the range are skipped (an eviction since returned the
// sealed frame); a range not wholly in chunks of the space is refused.
func (s *Space) RestoreFrameSeal(va, n uint64) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if n == 0 || va+n < va {
		return fmt.Errorf("restore frame seal %#x+%d: an empty or wrapping range: %w", va, n, vocab.ErrInvalidArgument)
	}
	var cs []*chunk
	for cva := va &^ (Page2M - 1); cva < va+n; cva += Page2M {
		c := s.chunks[cva]
		if c == nil {
			return fmt.Errorf("restore frame seal %#x+%d: no chunk at %#x: %w", va, n, cva, vocab.ErrInvalidArgument)
		}
		cs = append(cs, c)
	}
	for _, c := range cs {
		c.frameSealed = c.frameSealed || c.resident
	}
	return nil
}
