package memory

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vgpu/vgpu/api/vocab"
)

// Layout is what a space holds at one moment, as a later process needs it
// to rebuild the space without replaying its history: its chunks, with
// where each one's contents are, and its live allocations. A snapshot of a
// space (Snapshot) is its owner's way to keep a journal of its history
// (Residency, the allocations and frees) as short as what is live, however
// long the space lives: the owner writes the layout down in place of the
// history, and rebuilds from it with RestoreLayout, then replays what
// changed after it as before. The page table, the TLB, the order of
// recency and the statistics are not in it: a rebuilt space translates
// the same addresses to the same frames, and places the next allocation
// where the original would have (placement depends only on which pages of
// which chunks are taken), but it may choose other victims to evict.
type Layout struct {
	// Chunks are the space's chunks, by address.
	Chunks []ChunkLayout `json:"chunks"`
	// Allocs are its live allocations, by address.
	Allocs []AllocLayout `json:"allocs"`
}

// ChunkLayout is one chunk of a Layout.
type ChunkLayout struct {
	VA   uint64     `json:"va"`
	Dev  uint32     `json:"dev"`
	Hint vocab.Hint `json:"hint"`
	// Resident says that the chunk holds Frame; otherwise it is evicted,
	// its contents in the store under Key, or all zero with no Key.
	Resident bool   `json:"resident,omitempty"`
	Frame    uint64 `json:"frame,omitempty"`
	// Key is its store entry (0: none). A resident chunk holds one only
	// while all its allocations are sealed (a clean chunk).
	Key uint64 `json:"key,omitempty"`
	// Sum is the owner's checksum of Key's entry, written down beside it;
	// the space neither fills nor reads it.
	Sum uint32 `json:"sum,omitempty"`
	// FrameSealed says the source made the resident chunk's Frame
	// read-only (Range.SealFrames): the rebuilt space must not reuse it.
	FrameSealed bool `json:"frame_sealed,omitempty"`
}

// AllocLayout is one live allocation of a Layout.
type AllocLayout struct {
	VA     uint64     `json:"va"`
	Size   uint64     `json:"size"` // as asked, not rounded
	Dev    uint32     `json:"dev"`
	Hint   vocab.Hint `json:"hint"`
	Sealed bool       `json:"sealed,omitempty"`
}

// Snapshot calls use with the space's layout, holding allocMu while it
// runs, so that no allocation, free, seal or residency change (and so no
// call to the space's Residency) comes between the layout and what use
// does with it: an owner that journals the space writes the layout there.
// use must not call into the space. A space with a chunk whose device
// lost its contents (Lose) has no layout: a rebuilt space could not tell
// it from one that holds them, so Snapshot refuses, and the owner keeps
// its history.
func (s *Space) Snapshot(use func(Layout) error) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	if s.closed {
		return fmt.Errorf("snapshot: %w", errClosed)
	}
	if s.lost > 0 {
		return fmt.Errorf("snapshot: %d chunks' contents were lost by their device: %w", s.lost, vocab.ErrUnavailable)
	}
	l := Layout{Chunks: make([]ChunkLayout, 0, len(s.chunks)), Allocs: make([]AllocLayout, 0, len(s.allocs))}
	s.mu.Lock() // a translation sets chunk.frameSealed under mu alone
	for _, va := range slices.Sorted(maps.Keys(s.chunks)) {
		c := s.chunks[va]
		cl := ChunkLayout{VA: c.va, Dev: c.dev, Hint: c.hint, Resident: c.resident}
		if c.resident {
			cl.Frame, cl.FrameSealed = c.frame, c.frameSealed
		}
		if c.stored {
			cl.Key = c.key
		}
		l.Chunks = append(l.Chunks, cl)
	}
	s.mu.Unlock()
	for _, a := range s.allocs {
		l.Allocs = append(l.Allocs, AllocLayout{VA: a.va, Size: a.want, Dev: a.dev, Hint: a.hint, Sealed: a.sealed})
	}
	return use(l)
}

// RestoreLayout rebuilds an empty space as l says, as Snapshot gave it:
// the chunks at their addresses, each resident one in its frame — asked of
// the source one frame at a time, in l's order, each grant having to be
// that frame, and written nothing to: it holds the contents already —
// the evicted ones with their store keys, whose entries the owner has
// given the store back; then the allocations. A layout that no space
// could have had (misaligned, overlapping or unsealed where it must be
// sealed, a chunk no allocation uses, a key where the space does not
// oversubscribe, more frames than its cap, past its limit) is refused
// before any frame is asked for, and a failed grant returns those taken:
// on failure the space stays empty.
func (s *Space) RestoreLayout(l Layout) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	if s.closed {
		return fmt.Errorf("restore layout: %w", errClosed)
	}
	if len(s.chunks) > 0 {
		return fmt.Errorf("restore layout: the space holds %d chunks already: %w", len(s.chunks), vocab.ErrInvalidArgument)
	}
	chunks, allocs, allocated, err := s.checkLayout(l)
	if err != nil {
		return fmt.Errorf("restore layout: %w", err)
	}
	var granted []devFrame
	for _, c := range chunks {
		if !c.resident {
			continue
		}
		got, err := s.grant(c.dev, 1)
		if err == nil && got[0] != c.frame {
			granted = append(granted, devFrame{c.dev, got[0]})
			err = fmt.Errorf("chunk %#x: granted frame %#x, want %#x: %w", c.va, got[0], c.frame, vocab.ErrInvalidArgument)
		}
		if err != nil {
			return errors.Join(fmt.Errorf("restore layout: %w", err), s.returnFrames("granted for a refused layout", granted))
		}
		granted = append(granted, devFrame{c.dev, c.frame})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range chunks {
		s.vas.takeAt(c.va, Page2M)
		s.chunks[c.va] = c
		s.updatePartial(c)
		if c.resident {
			s.addResident(c)
			s.mapChunk(c)
			c.lru = s.tick
		} else {
			s.evicted++
		}
	}
	s.allocs, s.allocated = allocs, allocated
	return nil
}

// checkLayout checks l against the space, empty, and returns its chunks,
// pages marked, its allocations and the bytes they take. The caller holds
// allocMu.
func (s *Space) checkLayout(l Layout) ([]*chunk, []*allocation, uint64, error) {
	chunks := make([]*chunk, 0, len(l.Chunks))
	byVA := make(map[uint64]*chunk, len(l.Chunks))
	frames := map[devFrame]bool{}
	resident := 0
	for _, cl := range l.Chunks {
		c := &chunk{va: cl.VA, dev: cl.Dev, hint: cl.Hint, resident: cl.Resident, frame: cl.Frame, stored: cl.Key != 0, key: cl.Key, frameSealed: cl.FrameSealed}
		switch {
		case cl.VA%Page2M != 0 || cl.VA < vaBase || cl.VA >= vaTop:
			return nil, nil, 0, fmt.Errorf("chunk %#x: not a chunk's address: %w", cl.VA, vocab.ErrInvalidArgument)
		case len(chunks) > 0 && cl.VA <= chunks[len(chunks)-1].va:
			return nil, nil, 0, fmt.Errorf("chunk %#x: not after chunk %#x: %w", cl.VA, chunks[len(chunks)-1].va, vocab.ErrInvalidArgument)
		case !cl.Hint.Valid():
			return nil, nil, 0, fmt.Errorf("chunk %#x: residency hint %v: %w", cl.VA, cl.Hint, vocab.ErrInvalidArgument)
		case cl.Resident && (cl.Frame%FrameSize != 0 || frames[devFrame{cl.Dev, cl.Frame}]):
			return nil, nil, 0, fmt.Errorf("chunk %#x: frame %#x is misaligned or another chunk's: %w", cl.VA, cl.Frame, vocab.ErrInvalidArgument)
		case !cl.Resident && (cl.Frame != 0 || cl.FrameSealed):
			return nil, nil, 0, fmt.Errorf("chunk %#x: evicted, in frame %#x (sealed: %v): %w", cl.VA, cl.Frame, cl.FrameSealed, vocab.ErrInvalidArgument)
		case s.store == nil && (!cl.Resident || cl.Key != 0):
			return nil, nil, 0, fmt.Errorf("chunk %#x: evicted or stored, but the space does not oversubscribe: %w", cl.VA, vocab.ErrInvalidArgument)
		}
		if cl.Resident {
			frames[devFrame{cl.Dev, cl.Frame}] = true
			resident++
		}
		chunks = append(chunks, c)
		byVA[c.va] = c
	}
	if s.maxFrames != 0 && resident > s.maxFrames {
		return nil, nil, 0, fmt.Errorf("%d resident chunks, the space holds at most %d frames: %w", resident, s.maxFrames, vocab.ErrOutOfMemory)
	}
	allocs := make([]*allocation, 0, len(l.Allocs))
	var allocated uint64
	for _, al := range l.Allocs {
		size, err := Footprint(al.Size)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("allocation %#x: %w", al.VA, err)
		}
		align := uint64(Page4K)
		switch {
		case size >= Page2M:
			align = Page2M
		case size >= Page64K:
			align = Page64K
		}
		a := &allocation{va: al.VA, size: size, want: al.Size, dev: al.Dev, hint: al.Hint, sealed: al.Sealed}
		switch {
		case al.VA%align != 0:
			return nil, nil, 0, fmt.Errorf("allocation %#x of %d bytes: not aligned to %d: %w", al.VA, size, align, vocab.ErrInvalidArgument)
		case len(allocs) > 0 && al.VA < allocs[len(allocs)-1].end():
			return nil, nil, 0, fmt.Errorf("allocation %#x: overlaps or precedes the one at %#x: %w", al.VA, allocs[len(allocs)-1].va, vocab.ErrInvalidArgument)
		case a.end() < a.va || size < Page2M && a.va/Page2M != (a.end()-1)/Page2M:
			return nil, nil, 0, fmt.Errorf("allocation %#x of %d bytes: crosses a chunk it should lie in: %w", al.VA, size, vocab.ErrInvalidArgument)
		}
		for cur := a.va; cur < a.end(); {
			c := byVA[cur&^(Page2M-1)]
			if c == nil || c.dev != a.dev || c.hint != a.hint {
				return nil, nil, 0, fmt.Errorf("allocation %#x: no chunk of its device and hint at %#x: %w", a.va, cur&^(Page2M-1), vocab.ErrInvalidArgument)
			}
			next := min(a.end(), c.va+Page2M)
			first, pages := int((cur-c.va)/Page4K), int((next-cur)/Page4K)
			c.mark(first, pages, true) // disjoint: allocations are ordered and do not overlap
			if !a.sealed {
				c.unsealed += pages
			}
			cur = next
		}
		allocated += size
		allocs = append(allocs, a)
	}
	if s.limit != 0 && allocated > s.limit {
		return nil, nil, 0, fmt.Errorf("%d bytes allocated, past the space's limit of %d: %w", allocated, s.limit, vocab.ErrQuotaExceeded)
	}
	for _, c := range chunks {
		switch {
		case c.n == 0:
			return nil, nil, 0, fmt.Errorf("chunk %#x: no allocation uses it: %w", c.va, vocab.ErrInvalidArgument)
		case c.resident && c.stored && c.unsealed > 0:
			return nil, nil, 0, fmt.Errorf("chunk %#x: resident with a store entry, but not all sealed: %w", c.va, vocab.ErrInvalidArgument)
		}
	}
	return chunks, allocs, allocated, nil
}
