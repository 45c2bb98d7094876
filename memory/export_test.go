package memory

import "github.com/vgpu/vgpu/api"

// translatePages translates whole pages: up to an allocation's end rounded
// to Page4K, which Translate refuses past the size asked for. The harness
// checks page-level invariants with it.
func (s *Space) translatePages(va, n uint64) (uint32, []api.Extent, error) {
	return s.translate(va, n, (*allocation).end)
}
