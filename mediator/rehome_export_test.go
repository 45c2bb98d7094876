package mediator

// VersionRehomes is how many shared objects session id of m exported and
// restored on their restarted home (rehome.go); 0 once the session has
// ended.
func VersionRehomes(m *Mediator, id uint64) uint64 {
	return sessionCount(m, id, func(s *session) uint64 { return s.nodes.rehomed.Load() })
}

// Reimports is how many imports session id of m made again on their
// restarted home (rehome.go); 0 once the session has ended.
func Reimports(m *Mediator, id uint64) uint64 {
	return sessionCount(m, id, func(s *session) uint64 { return s.nodes.reimported.Load() })
}
