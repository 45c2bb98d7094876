package mediator

import "github.com/vgpu/vgpu/coherence"

// PlantStaleAfterInval breaks m's page caches on purpose: from now on each
// acknowledges an invalidation without applying it, and serves the copy it
// should have dropped until the copy's lease runs out. A test plants it to
// show that the linearizability checker catches a broken protocol. The
// result reports how many copies older than an invalidation m has served.
func PlantStaleAfterInval(m *Mediator) (staleServes func() uint64) {
	for _, n := range m.nodes {
		n.cache.mu.Lock()
		n.cache.stale = make(map[coherence.Key]uint64)
		n.cache.mu.Unlock()
	}
	return func() uint64 {
		var s uint64
		for _, n := range m.nodes {
			n.cache.mu.Lock()
			s += n.cache.staleServes
			n.cache.mu.Unlock()
		}
		return s
	}
}
