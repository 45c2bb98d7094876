package memory

import (
	"errors"
	"fmt"

	"github.com/vgpu/vgpu/api/vocab"
)

// Residency is told of every change of where an oversubscribing space's
// chunks live, so that its owner can write the changes down and a later
// process can rebuild the space with RestoreEvicted and RestoreResident,
// in the same order. A chunk created by an allocation is not reported:
// the allocation's own record, with the frames it was granted, says
// whether it starts resident.
//
// Its methods are called with the space's allocMu held and mu not held,
// and must not call back into the space.
type Residency interface {
	// Evicted: chunk va of device dev is in the store under key. Called
	// once its contents are stored, before its frame is unmapped, returned
	// to the source or reused.
	Evicted(dev uint32, va, key uint64)
	// Resident: chunk va of device dev is in frame, filled and mapped;
	// keep says that it holds its store entry still (all its allocations
	// are sealed). Called before an entry it does not keep is dropped.
	Resident(dev uint32, va, frame uint64, keep bool)
}

// SetResidency makes the space tell r of its residency changes. Call it
// before the first Alloc.
func (s *Space) SetResidency(r Residency) {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	s.residency = r
}

// toldEvicted tells the space's Residency that c is evicted under key.
// The caller holds allocMu.
func (s *Space) toldEvicted(c *chunk, key uint64) {
	if s.residency != nil {
		s.residency.Evicted(c.dev, c.va, key)
	}
}

// toldResident tells the space's Residency that c is resident. The caller
// holds allocMu.
func (s *Space) toldResident(c *chunk) {
	if s.residency != nil {
		s.residency.Resident(c.dev, c.va, c.frame, c.stored && c.unsealed == 0)
	}
}

// restoredChunk returns the chunk at va, which must be a chunk's address,
// or an error naming va. The caller holds allocMu.
func (s *Space) restoredChunk(op string, va uint64) (*chunk, error) {
	c := s.chunks[va]
	switch {
	case s.closed:
		return nil, fmt.Errorf("%s %#x: %w", op, va, errClosed)
	case s.store == nil:
		return nil, fmt.Errorf("%s %#x: the space does not oversubscribe: %w", op, va, vocab.ErrInvalidArgument)
	case c == nil:
		return nil, fmt.Errorf("%s %#x: no chunk there: %w", op, va, vocab.ErrInvalidAddress)
	case c.lost:
		return nil, fmt.Errorf("%s %#x: its chunk's device lost it: %w", op, va, vocab.ErrInvalidArgument)
	}
	return c, nil
}

// RestoreEvicted evicts the resident chunk at va as a Residency was told
// (Evicted), with its contents in the store under key already: it reads
// nothing from the source, and returns the chunk's frame to it. A restart
// replays a space's history through it.
func (s *Space) RestoreEvicted(va, key uint64) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	c, err := s.restoredChunk("restore eviction of", va)
	switch {
	case err != nil:
		return err
	case !c.resident:
		return fmt.Errorf("restore eviction of %#x: the chunk is evicted already: %w", va, vocab.ErrInvalidArgument)
	case key == 0 || c.stored && c.key != key:
		return fmt.Errorf("restore eviction of %#x: key %d, the chunk holds %d: %w", va, key, c.key, vocab.ErrInvalidArgument)
	}
	frame := devFrame{c.dev, c.frame}
	s.mu.Lock()
	s.evictLocked(c, key)
	s.mu.Unlock()
	return s.returnFrames("of a restored eviction", []devFrame{frame})
}

// RestoreResident makes the evicted chunk at va resident in frame, as a
// Residency was told (Resident): it asks the source for one frame of the
// chunk's device, which must be frame, and maps the chunk there without
// writing to it (the frame holds the contents already). Unless keep, the
// chunk's store entry is dropped. A restart replays a space's history
// through it.
func (s *Space) RestoreResident(va, frame uint64, keep bool) error {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	c, err := s.restoredChunk("restore residency of", va)
	switch {
	case err != nil:
		return err
	case c.resident:
		return fmt.Errorf("restore residency of %#x: the chunk is resident already: %w", va, vocab.ErrInvalidArgument)
	case keep && (!c.stored || c.unsealed > 0):
		return fmt.Errorf("restore residency of %#x: it keeps a store entry, but not all of it is sealed and stored: %w", va, vocab.ErrInvalidArgument)
	case s.maxFrames != 0 && s.frames >= s.maxFrames:
		return fmt.Errorf("restore residency of %#x: the space holds %d frames, its most: %w", va, s.frames, vocab.ErrOutOfMemory)
	}
	got, err := s.grant(c.dev, 1)
	if err != nil {
		return err
	}
	if got[0] != frame {
		err := fmt.Errorf("restore residency of %#x: granted frame %#x, want %#x: %w", va, got[0], frame, vocab.ErrInvalidArgument)
		return errors.Join(err, s.returnFrames("granted in its place", []devFrame{{c.dev, got[0]}}))
	}
	s.mu.Lock()
	c.frame, c.resident = frame, true
	s.evicted--
	s.addResident(c)
	s.mapChunk(c)
	c.lru = s.tick
	s.mu.Unlock()
	if c.stored && !keep {
		s.dropKey(c)
	}
	return nil
}
