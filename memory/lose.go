package memory

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vgpu/vgpu/api/vocab"
)

// A device that loses its memory (its node restarted) takes with it the
// contents of every chunk resident on it. Lose records that: such chunks
// become lost, frameless and never placed into again, and every live
// allocation with a page in one fails each translation with the reason
// given, until it is freed or Restore gives it its contents back. What the
// space holds elsewhere survives: an evicted chunk keeps its store entry
// (or stays all zero), and so does a resident chunk that kept one (all its
// allocations sealed); both are simply evicted, and fault in again on the
// device's new frames.
//
// Invariants, besides the Space's:
//   - A lost chunk is neither resident nor evicted: it holds no frame and
//     no store key, is not listed among the partial chunks, and counts in
//     Space.lost. Every live allocation with a page in it has lost set.
//   - An allocation is restored whole or not at all.

// Lost describes an allocation whose contents Lose found gone.
type Lost struct {
	Allocation
	// Sums are the SHA-256 of its chunks' contents, as SetSums gave them;
	// nil if never given.
	Sums [][32]byte
}

// SetSums records the SHA-256 of each chunk of the sealed allocation that
// starts at va, which must fill its chunks alone (start on a chunk, size a
// multiple of Page2M): what Restore's caller may look its contents up by.
// The caller vouches that they are the sealed contents; the space forgets
// them with the allocation.
func (s *Space) SetSums(va uint64, sums [][32]byte) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	i, err := s.startOf("set sums of", va)
	if err != nil {
		return err
	}
	a := s.allocs[i]
	if err := wholeChunks(a); err != nil {
		return fmt.Errorf("set sums of %#x: %w", va, err)
	}
	if !a.sealed {
		return fmt.Errorf("set sums of %#x: the allocation is not sealed, so its contents may change: %w", va, vocab.ErrInvalidArgument)
	}
	if want := int(a.size / Page2M); len(sums) != want {
		return fmt.Errorf("set sums of %#x: %d sums for %d chunks: %w", va, len(sums), want, vocab.ErrInvalidArgument)
	}
	s.mu.Lock()
	a.sums = slices.Clone(sums)
	s.mu.Unlock()
	return nil
}

// wholeChunks says whether a fills its chunks alone, so that its contents
// are the contents of whole chunks.
func wholeChunks(a *allocation) error {
	if a.va%Page2M != 0 || a.want%Page2M != 0 {
		return fmt.Errorf("the %d-byte allocation at %#x does not fill whole chunks of %d bytes: %w", a.want, a.va, Page2M, vocab.ErrInvalidArgument)
	}
	return nil
}

// Lose records that device dev lost the memory of every frame the space
// held on it, and forgets those frames without returning them (the source
// no longer has them). It returns the live allocations whose contents went
// with them, which now fail every translation with why, in address order.
func (s *Space) Lose(dev uint32, why error) []Lost {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	for _, c := range slices.Clone(s.resident[dev]) {
		c.runs(func(first, pages int) {
			s.pt.unmapRange(c.va+uint64(first)*Page4K, uint64(pages)*Page4K)
		})
		s.tlb.invalidate(c.va, Page2M)
		s.dropResident(c)
		c.resident, c.frame, c.frameSealed = false, 0, false
		if c.stored { // the store has its contents: it is only evicted
			s.evicted++
			continue
		}
		c.lost = true
		s.lost++
		s.updatePartial(c)
	}
	for _, c := range s.chunks {
		if c.dev == dev {
			c.atSource = false // the source holds nothing of it now
		}
	}
	var lost []Lost
	for _, a := range s.allocs {
		if a.dev != dev || a.lost != nil {
			continue
		}
		for g := range s.segments(a) {
			if g.c.lost {
				a.lost = why
				lost = append(lost, Lost{Allocation: Allocation{VA: a.va, End: a.limit(), Dev: a.dev, Sealed: a.sealed}, Sums: slices.Clone(a.sums)})
				break
			}
		}
	}
	return lost
}

// Restore gives the lost allocation that starts at va its contents back:
// fill is called for each of its chunks, in order, with the chunk's index,
// the sum SetSums recorded for it, and FrameSize bytes to fill with its
// contents. An oversubscribing space puts them in its store, to be faulted
// in when next translated; another grants frames for them and writes them
// there. The allocation must fill its chunks alone and have sums. On any
// failure it stays lost, as it was but for its reason, which from then on
// also says why it was not restored; the error says so too.
func (s *Space) Restore(va uint64, fill func(i int, sum [32]byte, p []byte) error) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	i, err := s.startOf("restore", va)
	if err != nil {
		return err
	}
	a := s.allocs[i]
	err = s.restore(a, fill)
	if err != nil && a.lost != nil {
		s.mu.Lock()
		a.lost = fmt.Errorf("%w; not restored: %v", a.lost, err)
		s.mu.Unlock()
	}
	return err
}

// restore is Restore of a. The caller holds allocMu.
func (s *Space) restore(a *allocation, fill func(i int, sum [32]byte, p []byte) error) error {
	va := a.va
	switch {
	case a.lost == nil:
		return fmt.Errorf("restore %#x: the allocation is not lost: %w", va, vocab.ErrInvalidArgument)
	case a.sums == nil:
		return fmt.Errorf("restore %#x: no sums of its contents were recorded: %w", va, a.lost)
	}
	if err := wholeChunks(a); err != nil {
		return fmt.Errorf("restore %#x: %w", va, err)
	}
	var cs []*chunk
	for g := range s.segments(a) {
		cs = append(cs, g.c)
	}
	buf := framePool.Get().(*[FrameSize]byte)
	defer framePool.Put(buf)
	if s.store != nil {
		keys := make([]uint64, 0, len(cs))
		for k, c := range cs {
			err := fill(k, a.sums[k], buf[:])
			var key uint64
			if err == nil {
				key, err = s.store.Put(buf[:])
			}
			if err != nil {
				for _, key := range keys {
					s.store.Drop(key)
				}
				return fmt.Errorf("restore %#x: chunk %#x: %w", va, c.va, err)
			}
			keys = append(keys, key)
		}
		s.mu.Lock()
		for k, c := range cs {
			c.lost, c.stored, c.key, c.summed = false, true, keys[k], false
			s.lost--
			s.evicted++
		}
		a.lost = nil
		s.mu.Unlock()
		return nil
	}
	frames, err := s.grant(a.dev, len(cs))
	if err != nil {
		return fmt.Errorf("restore %#x: %w", va, err)
	}
	for k, c := range cs {
		err := fill(k, a.sums[k], buf[:])
		if err == nil {
			err = s.src.Write(a.dev, frames[k], buf[:])
		}
		if err != nil {
			err = fmt.Errorf("restore %#x: chunk %#x: %w", va, c.va, err)
			if rerr := s.src.Return(a.dev, frames); rerr != nil {
				err = errors.Join(err, fmt.Errorf("return the %d frames granted for it: %w", len(frames), rerr))
			}
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, c := range cs {
		c.lost, c.frame, c.resident = false, frames[k], true
		s.lost--
		s.addResident(c)
		s.mapChunk(c)
		c.lru = s.tick
	}
	a.lost = nil
	return nil
}
