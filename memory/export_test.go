package memory

import "github.com/vgpu/vgpu/api/vocab"

// translatePages translates whole pages, for writing if write: up to an
// allocation's end rounded to Page4K, which Translate refuses past the size
// asked for. The harness checks page-level invariants with it.
func (s *Space) translatePages(va, n uint64, write bool) (uint32, []vocab.Extent, error) {
	return s.translateOne(Range{VA: va, Len: n, Write: write}, (*allocation).end)
}

// chunkState is what a test may see of the chunk that holds va.
type chunkState struct {
	ok, resident, stored bool
	dev                  uint32
	hint                 vocab.Hint
	frame, key           uint64
}

func (s *Space) chunkState(va uint64) chunkState {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chunks[va&^(Page2M-1)]
	if c == nil {
		return chunkState{}
	}
	return chunkState{ok: true, resident: c.resident, stored: c.stored, dev: c.dev, hint: c.hint, frame: c.frame, key: c.key}
}
