package mediator

import (
	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api/wire"
)

// Shared buffers across a dropped node connection. When the session's
// connection to a node drops and the node did not restart, the reclaim
// (noderestart.go) hands the new connection the parked frames and, with
// them, the objects the session exported there: the node kept them, grants
// and all, and importers here and in other mediators went on using them
// through the cut. What the node forgot with the dropped connection is
// what it imported and pinned, and where its invalidations and
// revocations went. So, once the reclaim is checked, each live shared
// range reached through the dropped connection is rebuilt as a restore
// rebuilds it (resumeshared.go), before the session serves its next
// request:
//
//   - An export goes on as the same object over the new connection, its
//     latest version pinned again (readopt).
//   - An import is made again at its address over the new connection
//     (remakeImport), the node checking the tenant's grant anew: a grant
//     revoked, or an object ended, during the cut ends that range with
//     the node's error, typed, and the session's other ranges go on. The
//     range points at the new connection before the import is asked, so
//     that a revocation the node pushes as it answers ends it.
//   - A range that had ended stays ended.
//
// The cache drops its copies of the objects rebuilt: invalidations the
// node pushed on the dropped connection during the cut went nowhere. The
// leases they were read under bound those copies anyway (the node waits a
// lease out before a write), but no copy read over the dropped connection
// is served after it.
//
// Imports over a connection the session dialled for imports only, from a
// node where it has no device, are not watched: once it drops, the next
// use of such a range dials the node again and, if it did not restart,
// makes the import again the same way, its copies dropped
// (rehomeImport); if it restarted, rehome.go says what comes back.

// rebuildShared rebuilds the session's shared ranges that were reached
// through old, its connection to node that dropped, on rpc, the
// connection that reclaimed its frames there, and returns how many it
// rebuilt and how many of them ended. The caller is the session's reader,
// holding issueMu, with the node's devices pointing at rpc.
func (s *session) rebuildShared(node int, old, rpc *wire.RPC) (rebuilt, ended int) {
	n := s.m.node(node)
	for _, r := range s.shares.reachedThrough(old) {
		n.cache.drop(r.object)
		rebuilt++
		if r.imported {
			r.via.Store(rpc)
			s.remakeImport(r, n.addr, "after its node connection dropped, the", false)
		} else if err := s.readopt(r, rpc); err != nil {
			s.log.WithError(err).WithField("object", r.object).Warn("a shared buffer the session exported is not pinned again after its node connection dropped; its range fails with why")
			r.ended.Store(&err)
		}
		if r.ended.Load() != nil {
			ended++
		}
	}
	if rebuilt > 0 {
		s.log.WithFields(logrus.Fields{"node": n.addr, "shared": rebuilt, "ended": ended}).Info("shared buffers rebuilt on the reclaimed node connection")
	}
	return rebuilt, ended
}

// onNode reports whether the session has a device on node idx, and so a
// connection there that its watcher redials. Any of its goroutines may
// ask: a device's node never changes.
func (s *session) onNode(idx int) bool {
	for _, v := range s.vdevs {
		if v.dev.node == idx {
			return true
		}
	}
	return false
}

// drop drops the cache's copies of object's pages: the object ended, was
// revoked, or was read over a node connection that dropped.
func (pc *pageCache) drop(object uint64) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.cache.Drop(object)
}

// reachedThrough lists the live ranges reached through rpc.
func (sh *shareSet) reachedThrough(rpc *wire.RPC) []*sharedRange {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var out []*sharedRange
	for _, r := range sh.ranges {
		if r.conn() == rpc && r.ended.Load() == nil {
			out = append(out, r)
		}
	}
	return out
}
