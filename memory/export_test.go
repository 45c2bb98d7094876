package memory

import "github.com/vgpu/vgpu/api"

// translatePages translates whole pages: up to an allocation's end rounded
// to Page4K, which Translate refuses past the size asked for. The harness
// checks page-level invariants with it.
func (s *Space) translatePages(va, n uint64) (uint32, []api.Extent, error) {
	rs := [1]Range{{VA: va, Len: n}}
	var ts [1]Translation
	if err := s.translate(rs[:], ts[:], (*allocation).end); err != nil {
		return 0, nil, err
	}
	return ts[0].Dev, ts[0].Extents, nil
}

// chunkState is what a test may see of the chunk that holds va.
type chunkState struct {
	ok, resident, stored bool
	dev                  uint32
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
	return chunkState{ok: true, resident: c.resident, stored: c.stored, dev: c.dev, frame: c.frame, key: c.key}
}
