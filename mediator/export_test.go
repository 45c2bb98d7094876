package mediator

import "github.com/vgpu/vgpu/coherence"

// PlantStaleAfterInval breaks m's page caches on purpose: from now on each
// acknowledges an invalidation without applying it, and serves the copy it
// should have dropped until the copy's lease runs out. A test plants it to
// show that the linearizability checker catches a broken protocol. The
// result reports how many copies older than an invalidation m has served.
func PlantStaleAfterInval(m *Mediator) (staleServes func() uint64) {
	for _, n := range m.nodeList() {
		n.cache.mu.Lock()
		n.cache.stale = make(map[coherence.Key]uint64)
		n.cache.mu.Unlock()
	}
	return func() uint64 {
		var s uint64
		for _, n := range m.nodeList() {
			n.cache.mu.Lock()
			s += n.cache.staleServes
			n.cache.mu.Unlock()
		}
		return s
	}
}

// SessionEvictions is how many chunks of session id of m have been evicted
// from the device so far: by its own fault-ins, or for another session of
// its container (containers.go, reclaim); 0 once the session has ended.
func SessionEvictions(m *Mediator, id uint64) uint64 {
	m.mu.Lock()
	s := m.sessions[id]
	m.mu.Unlock()
	if s == nil {
		return 0
	}
	return s.space.Stats().Evictions
}

// NodeRestores is how many chunks of sealed weights session id of m has
// had restored from another node's copy after a node restart
// (noderestart.go); 0 once the session has ended.
func NodeRestores(m *Mediator, id uint64) uint64 {
	return sessionCount(m, id, func(s *session) uint64 { return s.nodes.restored.Load() })
}

// sessionCount is count of session id of m; 0 once the session has ended.
func sessionCount(m *Mediator, id uint64, count func(*session) uint64) uint64 {
	m.mu.Lock()
	s := m.sessions[id]
	m.mu.Unlock()
	if s == nil {
		return 0
	}
	return count(s)
}

// HoldIssuing holds session id's issueMu, as the session does while it
// issues a command, until release is called.
func HoldIssuing(m *Mediator, id uint64) (release func()) {
	m.mu.Lock()
	s := m.sessions[id]
	m.mu.Unlock()
	s.issueMu.Lock()
	return s.issueMu.Unlock
}

// NodeReclaims is how many node connections of session id of m dropped
// and had their frames reclaimed (noderestart.go); 0 once the session has
// ended.
func NodeReclaims(m *Mediator, id uint64) uint64 {
	return sessionCount(m, id, func(s *session) uint64 { return s.nodes.reclaimed.Load() })
}
