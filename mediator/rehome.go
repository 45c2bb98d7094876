package mediator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Shared objects across a restart of their home node. The node forgets
// every object it was home to; what the mediators hold decides what comes
// back:
//
//   - A versioned object's published version, where its exporter's
//     mediator holds a copy of it. With Config.VersionCopies the exporting
//     session reads the version back once when it exports, after each
//     Publish it makes, and when a restart of its mediator restores it
//     (holdVersion; one transfer of the object, and a host copy of it, per
//     export), and keeps the grants it gave, less every tenant it revoked
//     (a revocation drops the grant here, and journals it, before the node
//     is told, so no restore can hand it back). The journal records the
//     grants with the export (journalOp.Tenants) and each revocation
//     (opRevoke), so a session restored after its mediator's restart
//     knows them. When its node connection
//     breaks and the node answers with another boot id, the session's
//     watcher sends the copy back (api.OpNodeRestore) under the object's
//     old id and version number, with those grants, before anything else
//     (rehomeExports); the new connection is then its exporter. The object
//     has no draft: that was the exporter's device memory, lost with the
//     restart (memory.Space.Lose). So the exporter's range reads the
//     version, and its writes and publishes fail with ErrUnavailable from
//     the node, saying so; freeing the buffer ends the object, as always.
//   - An importer finds, at its next use of the range, the connection it
//     was reached through closed; if the node now has another boot id, the
//     range imports the object again under the same id (rehomeImport),
//     over a connection of its own, and checks that the node names the
//     same exporting tenant, mode and size. The node checks the grant, so
//     a tenant revoked before the restart gets ErrPermissionDenied and
//     the range ends. A range that pinned the restored version goes on
//     reading it, and since the version's pages never change, the copies
//     the cache holds of it (keyed by object, version and page) stay valid:
//     no byte comes from the tenant, and pages it read before need not move
//     again. A range that pinned another version (older than the exporter's
//     copy, or published by another writer since) fails its reads with
//     ErrUnavailable naming the node and both versions until the tenant
//     Pins, which reads the restored one.
//   - Nothing else: coherent and immutable objects, and versioned ones
//     whose exporter's mediator holds no copy (Config.VersionCopies off, a
//     session restored from a journal that did not record its grants, a
//     version another writer published, or an exporter that is gone), fail every use
//     with ErrUnavailable naming the node and why they were not restored.
//     An importer that finds the object not there yet fails that use so,
//     and tries again at the next.
//
// Locks: rangeHome.mu guards the copy and grants, and is a leaf;
// rangeHome.moving serialises the re-imports of one range and is held
// across node calls, never under another lock.

// rangeHome is what a restart of a shared range's home needs.
type rangeHome struct {
	// boot is the node's boot id when the range was last made or moved,
	// "" if unknown; exporter is, for an import, the tenant the node named
	// as the exporter. Both are set before the range is shared, and then
	// only under moving.
	boot, exporter string
	moving         sync.Mutex
	// stale is why the version the range pinned was not restored, nil if
	// it was (or the range never moved); a Pin clears it.
	stale atomic.Pointer[error]

	mu sync.Mutex
	// grants are, for an export, the tenants granted and whether to
	// write, less those revoked; nil for an import or an export restored
	// after a mediator restart (not journaled). Guarded by mu.
	grants map[string]bool
	// held is, for an exported versioned object, the copy of a published
	// version this mediator holds; nil if none. Guarded by mu.
	held *heldVersion
}

// heldVersion is a copy of one published version of an object.
type heldVersion struct {
	version uint64
	data    []byte
}

// exported records an export's boot id and grants.
func (h *rangeHome) exported(boot string, grants []api.Grant) {
	h.boot = boot
	h.grants = map[string]bool{}
	for _, g := range grants {
		h.grants[g.Tenant] = g.Write
	}
}

// imported records an import's boot id and exporter.
func (h *rangeHome) imported(boot string, ir *api.NodeImportReply) {
	h.boot, h.exporter = boot, ir.Exporter
}

// restored records, for an export a restore replayed, its boot id and
// the grants its journal records (nil: unknown).
func (h *rangeHome) restored(boot string, grants *[]api.Grant) {
	h.boot = boot
	if grants != nil {
		h.exported(boot, *grants)
	}
}

// grantList returns the grants an export keeps, nil if unknown.
func (h *rangeHome) grantList() *[]api.Grant {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.grants == nil {
		return nil
	}
	out := make([]api.Grant, 0, len(h.grants))
	for _, t := range slices.Sorted(maps.Keys(h.grants)) {
		out = append(out, api.Grant{Tenant: t, Write: h.grants[t]})
	}
	return &out
}

// revoke drops tenant's grant before the node is told, so that a restore
// never gives it back, whatever the node answers.
func (h *rangeHome) revoke(tenant string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.grants, tenant)
}

// holdVersion reads the latest published version of r, a versioned buffer
// the session exported, and keeps it as r's copy, with Config.VersionCopies;
// a failure keeps the copy it had, logged. The version is pinned for the
// read and unpinned after. The caller is the session's reader.
func (s *session) holdVersion(r *sharedRange) {
	if !s.m.cfg.VersionCopies || r.mode != api.ModeVersioned || r.imported {
		return
	}
	rpc := r.conn()
	body, err := rpc.Call(api.OpNodePin, nil, api.Encode(&api.NodeObject{Object: r.object}))
	var v api.BufVersion
	if err == nil {
		err = api.Decode(body, &v)
	}
	if err == nil {
		var data []byte
		data, err = readVersion(rpc, r, v.Version)
		if _, uerr := rpc.Call(api.OpNodeUnpin, nil, api.Encode(&api.NodeVersion{Object: r.object, Version: v.Version})); uerr != nil {
			s.log.WithError(uerr).Info("unpinning the version copied failed")
		}
		if err == nil {
			r.home.mu.Lock()
			r.home.held = &heldVersion{version: v.Version, data: data}
			r.home.mu.Unlock()
			return
		}
	}
	s.log.WithError(err).WithField("object", r.object).Info("no copy of the published version kept; a restart of its node will not restore it")
}

// readVersion reads every page of version v of r's object, which the
// connection has pinned.
func readVersion(rpc *wire.RPC, r *sharedRange, v uint64) ([]byte, error) {
	data := make([]byte, r.size)
	calls := make([]*wire.Call, 0, readsInFlight)
	bufs := make([][]byte, 0, readsInFlight)
	flush := func(first uint64) error {
		err := waitAll(calls)
		for i, b := range bufs {
			copy(data[first+uint64(i)*r.pageSize:], b[api.NodeGrantSize:])
		}
		calls, bufs = calls[:0], bufs[:0]
		return err
	}
	first := uint64(0)
	for off := uint64(0); off < r.size; off += r.pageSize {
		n := min(r.pageSize, r.size-off)
		buf := make([]byte, api.NodeGrantSize+n)
		req := api.Encode(&api.NodeObjAccess{Object: r.object, Version: v, Off: off, Len: n})
		calls, bufs = append(calls, rpc.Go(api.OpNodeObjRead, buf, req)), append(bufs, buf)
		if len(calls) == readsInFlight {
			if err := flush(first); err != nil {
				return nil, err
			}
			first = off + r.pageSize
		}
	}
	if err := flush(first); err != nil {
		return nil, err
	}
	return data, nil
}

// exportsOn lists the session's exported ranges on node idx.
func (sh *shareSet) exportsOn(idx int) []*sharedRange {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var out []*sharedRange
	for _, r := range sh.ranges {
		if !r.imported && r.node == idx {
			out = append(out, r)
		}
	}
	return out
}

// rehomeExports restores, on rpc, a new connection to node idx, which
// restarted, each versioned object the session exported there whose copy
// it holds, and returns why each of its exports there was not restored
// (nil for those that were). The node's watcher calls it as soon as the
// node answers, so that importers find the objects early.
func (s *session) rehomeExports(idx int, rpc *wire.RPC) map[*sharedRange]error {
	out := map[*sharedRange]error{}
	for _, r := range s.shares.exportsOn(idx) {
		if out[r] = r.home.restoreOn(rpc, r); out[r] == nil {
			s.nodes.rehomed.Add(1)
		}
	}
	return out
}

// restoreOn sends r's held copy to the node at the other end of rpc as
// the object it was, with the grants r keeps.
func (h *rangeHome) restoreOn(rpc *wire.RPC, r *sharedRange) error {
	grants := h.grantList()
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	switch {
	case r.mode != api.ModeVersioned:
		return fmt.Errorf("only versioned objects are restored, and this one is %v", r.mode)
	case grants == nil:
		return errors.New("its grants are not known: its session was restored after its mediator restarted from a journal that did not record them")
	case held == nil:
		return errors.New("its exporter's mediator holds no copy of its published version (it keeps one with --version-copies)")
	}
	for off := uint64(0); ; {
		n := min(uint64(wire.MaxChunk), uint64(len(held.data))-off)
		m := api.NodeRestore{Object: r.object, Version: held.version, Size: uint64(len(held.data)), Grants: *grants, Off: off}
		if _, err := rpc.Call(api.OpNodeRestore, nil, api.Encode(&m), held.data[off:off+n]); err != nil {
			return fmt.Errorf("the node refused its version %d: %w", held.version, err)
		}
		if off += n; off == uint64(len(held.data)) {
			return nil
		}
	}
}

// adoptRehomed installs on rpc, the new connection to node idx (boot id
// now, was boot), the exports there that rehomed says were restored, and
// ends the others with why. The caller holds issueMu, after the node's
// devices point at rpc.
func (s *session) adoptRehomed(idx int, rpc *wire.RPC, boot, now string, rehomed map[*sharedRange]error) {
	addr := s.m.node(idx).addr
	for _, r := range s.shares.exportsOn(idx) {
		why, ok := rehomed[r]
		if !ok {
			why = errors.New("it was exported after the node's watcher restored the others")
		}
		if why == nil {
			old := r.version.Swap(0) // its pin went with the node
			r.via.Store(rpc)
			r.home.boot = now
			if why = r.pin(s.log); why == nil {
				r.home.staleIf(r, old, addr, boot, now)
				continue
			}
		}
		err := fmt.Errorf("shared object %d: %w; it is not restored: %v", r.object, homeRestarted(addr, boot, now), why)
		r.ended.Store(&err)
		s.log.WithError(err).Info("a shared buffer the session exported is lost with its node")
	}
	// A restored object whose export ended meanwhile ends: its connection
	// is the session's now, and would keep it.
	for r, why := range rehomed {
		if why == nil && s.shares.find(r.base) != r {
			if _, err := rpc.Call(api.OpNodeUnexport, nil, api.Encode(&api.NodeObject{Object: r.object})); err != nil {
				s.log.WithError(err).Info("ending a restored object whose buffer was freed failed")
			}
		}
	}
}

// homeRestarted says that the node at addr, home of a shared object,
// restarted (boot id boot, now now) and forgot it.
func homeRestarted(addr, boot, now string) error {
	return fmt.Errorf("its home, node %s, restarted (boot %s, now %s), forgetting it: %w", addr, boot, now, api.ErrUnavailable)
}

// staleIf records, for r, which read version old and now reads what it
// pinned after its home restarted (at addr, boot id boot, now now), that
// old was not restored, if it differs.
func (h *rangeHome) staleIf(r *sharedRange, old uint64, addr, boot, now string) {
	if v := r.version.Load(); old != 0 && v != old {
		err := fmt.Errorf("shared object %d: version %d, which this range read, is not restored: node %s restarted (boot %s, now %s), and the object came back as version %d, which a Pin reads: %w",
			r.object, old, addr, boot, now, v, api.ErrUnavailable)
		h.stale.Store(&err)
	}
}

// rehomeImport imports r, an import whose connection closed, again under
// the same id, if its node did not restart (any mode), or restarted and
// has the object back (a versioned one); nil if r may be used now. Called
// at the range's use, by any of the session's goroutines.
func (s *session) rehomeImport(r *sharedRange) error {
	r.home.moving.Lock()
	defer r.home.moving.Unlock()
	if !closed(r.conn()) {
		return nil // moved meanwhile
	}
	n := s.m.node(r.node)
	lost := fmt.Errorf("shared object %d: the connection to node %s it was reached through is lost: %w", r.object, n.addr, api.ErrUnavailable)
	if r.home.boot == "" {
		return lost
	}
	rpc, err := s.importConn(r.node)
	if err != nil {
		return fmt.Errorf("%w, and the node does not answer: %v", lost, err)
	}
	now, err := bootOf(rpc)
	if err != nil {
		return lost
	}
	if now == r.home.boot {
		if s.onNode(r.node) {
			return lost // the session's node connection there: its watcher rebuilds the range (dropshared.go)
		}
		// Not restarted: the node only forgot the connection's import and
		// pins. Imported again over the new one (which reimport takes
		// from importConn, and points r at once the import holds, so
		// that no other goroutine's use meets it before), the grant
		// checked anew, as after a drop of the session's own node
		// connection (dropshared.go).
		s.m.node(r.node).cache.drop(r.object)
		s.remakeImport(r, n.addr, "after its node connection dropped, the", false)
		if err := r.ended.Load(); err != nil {
			return *err
		}
		return nil
	}
	boot := r.home.boot
	gone := homeRestarted(n.addr, boot, now)
	if r.mode != api.ModeVersioned {
		return fmt.Errorf("shared object %d: %w; it is not restored: only a versioned object's published version comes back, and this one is %v", r.object, gone, r.mode)
	}
	reply, err := rpc.Call(api.OpNodeImport, nil, api.Encode(&api.NodeObject{Object: r.object}))
	var ir api.NodeImportReply
	if err == nil {
		err = api.Decode(reply, &ir)
	}
	switch {
	case errors.Is(err, api.ErrPermissionDenied):
		err = fmt.Errorf("shared object %d: restored after node %s restarted, without a grant for this tenant: %w", r.object, n.addr, err)
		r.ended.Store(&err)
		return err
	case err != nil:
		return fmt.Errorf("shared object %d: %w; it is not restored (%v): only a versioned object's published version comes back, sent by its exporter's mediator from the copy it holds", r.object, gone, err)
	case ir.Mode != r.mode || ir.Size != r.size || !ir.HasExporter || ir.Exporter != r.home.exporter:
		err = fmt.Errorf("shared object %d came back after node %s restarted as a %v object of %d bytes exported by %q, not the %v object of %d bytes of %q imported: %w",
			r.object, n.addr, ir.Mode, ir.Size, ir.Exporter, r.mode, r.size, r.home.exporter, api.ErrUnavailable)
		r.ended.Store(&err)
		return err
	}
	old := r.version.Swap(0) // its pin went with the node
	r.via.Store(rpc)
	r.home.boot = now
	if err := r.pin(s.log); err != nil {
		return err
	}
	r.home.staleIf(r, old, n.addr, boot, now)
	s.nodes.reimported.Add(1)
	s.log.WithFields(logrus.Fields{"node": n.addr, "object": r.object, "version": r.version.Load()}).Info("shared buffer imported again from its restarted home")
	return nil
}

// importConn is the session's connection for imports from node idx, made
// if it has none that is open.
func (s *session) importConn(idx int) (*wire.RPC, error) {
	if rpc := s.shares.conn(idx); rpc != nil && !closed(rpc) {
		return rpc, nil
	}
	n := s.m.node(idx)
	rpc, _, err := dialNode(n.addr, s.m.nodeTenant(s.tenant), s.m.cfg.NodeTLS, n.cache.push)
	if err != nil {
		return nil, err
	}
	return s.shares.keepConn(idx, rpc), nil
}
