package mediator

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/coherence"
)

// Shared buffers. A tenant exports an allocation (api.OpExport): its frames
// become an object of their node, which is the object's home, with grants
// to named tenants; others import it (api.OpImport), through this mediator
// or another, and get an address range of their own for it. Copies to and
// from an exported or imported range go through the object: reads are
// served from this mediator's cache of the node's pages (coherence.Cache)
// when a valid copy is there, else read from the node a whole page at a
// time and cached under the node's lease; writes go through to the node,
// which applies them once no other copy is valid. The node pushes
// invalidations on the connection that read a page; the cache drops the
// copy and acknowledges on the same connection.
//
// A shared range may be a kernel's argument on its node only if exported
// (kernels read it; the node refuses writes to it but through the object);
// an imported range takes copies only.
//
// Lock order: a pageCache's mu is a leaf, held across cache calls only,
// never across a node call or a wait for one (replies' callbacks take it).

// CacheMemory is the default host memory a mediator's cache of shared
// pages may use, split among its nodes.
const CacheMemory = 256 << 20

// leaseMargin is taken off every lease, for clocks that run at slightly
// different rates (docs/coherence.md).
const leaseMargin = 5 * time.Millisecond

// importBase is where imported ranges start in a session's address space:
// above what memory.Space hands out.
const importBase = 1 << 48

// mclock is the mediator's clock for leases.
var mclock = time.Now()

func mnow() time.Duration { return time.Since(mclock) }

// pageCache is one node's pages as this mediator holds them.
type pageCache struct {
	mu    sync.Mutex
	cache *coherence.Cache
	m     *Mediator
	// stale is nil but in a test (PlantStaleAfterInval, export_test.go)
	// that plants a broken protocol, to show that the linearizability
	// checker catches one: invalidations are acknowledged but not applied,
	// so a copy is served until its lease runs out. It holds the highest
	// version each page was invalidated for; staleServes counts the copies
	// of older versions served since. Both are guarded by mu.
	stale       map[coherence.Key]uint64
	staleServes uint64
}

func newPageCache(m *Mediator, bytes int64) (*pageCache, error) {
	c, err := coherence.NewCache(max(bytes, 1), leaseMargin)
	if err != nil {
		return nil, err
	}
	return &pageCache{cache: c, m: m}, nil
}

// push takes a node's notice, on the connection's reader: an invalidation
// is applied, then acknowledged on the same connection.
func (pc *pageCache) push(rpc *wire.RPC, op wire.Op, body []byte) {
	if op == api.OpNodeRevoked {
		var m api.NodeRevoke
		if api.Decode(body, &m) != nil {
			return
		}
		pc.drop(m.Object) // other tenants here read it again from the node
		pc.m.revoked(rpc, m)
		rpc.Go(api.OpNodeRevokedAck, nil, body)
		return
	}
	if op != api.OpNodeInval {
		return
	}
	var m api.NodeInval
	if api.Decode(body, &m) != nil {
		return
	}
	pc.mu.Lock()
	if pc.stale != nil { // the planted bug
		k := coherence.Key{Object: m.Object, Page: m.Page}
		pc.stale[k] = max(pc.stale[k], m.Version)
	} else {
		pc.cache.Invalidate(m.Object, m.Page, m.Version)
	}
	pc.mu.Unlock()
	rpc.Go(api.OpNodeInvalAck, nil, body) // nobody waits: a lost ack costs the writer a lease
}

// sharedRange is an exported or imported range of a session.
type sharedRange struct {
	base, size uint64
	node       int
	// addr is, for an import, its node's address as the journal names it:
	// node is -1 where a restore found it no longer among this
	// mediator's, and a compaction writes the import again (journalcompact.go).
	addr string
	// via is the node connection the range is reached through; a range
	// whose home restarted moves to a new one when it is restored
	// (rehome.go).
	via      atomic.Pointer[wire.RPC]
	object   uint64
	mode     api.Mode
	write    bool
	pageSize uint64
	imported bool
	ended    atomic.Pointer[error] // why the node no longer serves it to this session
	// version is what a versioned range reads: the version it holds a pin
	// of at the node (0 before its first pin). Each range holds its own,
	// though ranges of the session share the node connection.
	version atomic.Uint64
	// home is what a restart of the object's home needs (rehome.go).
	home rangeHome
}

// conn is the node connection r is reached through.
func (r *sharedRange) conn() *wire.RPC { return r.via.Load() }

// pin makes a versioned range read the latest published version; other
// modes have nothing to pin. The new version is pinned before the old one
// is unpinned, so the range's reads always have a pinned version. Once the
// new pin holds, the range reads it: failing to unpin the old one is only
// logged, and the node forgets that pin when the connection ends.
func (r *sharedRange) pin(log logrus.FieldLogger) error {
	if r.mode != api.ModeVersioned {
		return nil
	}
	body, err := r.conn().Call(api.OpNodePin, nil, api.Encode(&api.NodeObject{Object: r.object}))
	var v api.BufVersion
	if err == nil {
		err = api.Decode(body, &v)
	}
	if err != nil {
		return fmt.Errorf("pin shared object %d: %w", r.object, err)
	}
	r.home.stale.Store(nil) // it reads the version it pinned now
	if err := r.unpinVersion(r.version.Swap(v.Version)); err != nil {
		log.WithError(err).Info("unpinning the version a shared range read before failed")
	}
	return nil
}

// unpin releases the range's pin, if it holds one. A session's ending
// needs no unpin: the node forgets a connection's pins when it ends.
func (r *sharedRange) unpin() error {
	return r.unpinVersion(r.version.Swap(0))
}

func (r *sharedRange) unpinVersion(v uint64) error {
	if v == 0 {
		return nil
	}
	if _, err := r.conn().Call(api.OpNodeUnpin, nil, api.Encode(&api.NodeVersion{Object: r.object, Version: v})); err != nil {
		return fmt.Errorf("unpin version %d of shared object %d: %w", v, r.object, err)
	}
	return nil
}

// versionOp publishes a versioned buffer's draft, or pins its latest
// version for the session's reads, once the work queued before is done.
func (s *session) versionOp(op wire.Op, body []byte) (uint64, error) {
	var m api.At
	if err := api.Decode(body, &m); err != nil {
		return 0, err
	}
	r, err := s.sharedAt(m.Addr, 1)
	if err == nil && (r == nil || r.mode != api.ModeVersioned) {
		err = fmt.Errorf("%v at %#x: not a versioned shared buffer of this session: %w", op, m.Addr, api.ErrInvalidArgument)
	}
	if err != nil {
		return 0, err
	}
	s.drainAll()
	if op == api.OpPin {
		err := r.pin(s.log)
		return r.version.Load(), err
	}
	if !r.write {
		return 0, fmt.Errorf("publish of shared object %d: this session may only read it: %w", r.object, api.ErrPermissionDenied)
	}
	body, err = r.conn().Call(api.OpNodePublish, nil, api.Encode(&api.NodeObject{Object: r.object}))
	var v api.BufVersion
	if err == nil {
		err = api.Decode(body, &v)
	}
	if err != nil {
		return 0, fmt.Errorf("publish shared object %d: %w", r.object, err)
	}
	if !r.imported {
		s.holdVersion(r)
	}
	return v.Version, nil
}

// revoked ends the imports of an object reached through rpc that a node's
// revocation names (all of them when it names no tenant: the object
// ended), so their next use fails now, without asking the node.
func (m *Mediator) revoked(rpc *wire.RPC, rv api.NodeRevoke) {
	err := fmt.Errorf("shared object %d: the exporter revoked this tenant's grant: %w", rv.Object, api.ErrPermissionDenied)
	if rv.Tenant == "" {
		err = fmt.Errorf("shared object %d: its exporter freed it: %w", rv.Object, api.ErrInvalidArgument)
	}
	m.mu.Lock()
	sessions := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		sessions = append(sessions, s)
	}
	m.mu.Unlock()
	for _, s := range sessions {
		if rv.Tenant != "" && rv.Tenant != s.tenant {
			continue
		}
		s.shares.revoked(rpc, rv.Object, rv.Tenant == "", &err)
	}
}

// pendingImport is an import between its request to the node and its
// range being recorded: a revocation pushed meanwhile is kept here.
type pendingImport struct {
	rpc    *wire.RPC
	object uint64
	err    *error
}

// sharedAt returns the shared range holding [va, va+n), if va lies in one;
// a range that starts in one and leaves it is refused, as is one that has
// ended or whose node connection is closed.
func (s *session) sharedAt(va, n uint64) (*sharedRange, error) {
	r := s.shares.find(va)
	if r == nil {
		return nil, nil
	}
	if n > r.base+r.size-va {
		return nil, fmt.Errorf("%d bytes at %#x run past the end of shared buffer [%#x, +%d): %w", n, va, r.base, r.size, api.ErrInvalidAddress)
	}
	if err := r.ended.Load(); err != nil {
		return nil, *err
	}
	if closed(r.conn()) && r.imported {
		// Imported again if its node did not restart, or restarted and
		// has it back (rehomeImport).
		if err := s.rehomeImport(r); err != nil {
			return nil, err
		}
	} else if closed(r.conn()) {
		// The node forgot the connection's grants and pins with it, and
		// pushes a later revocation to nobody: copies cached here must
		// not outlive it.
		return nil, fmt.Errorf("shared object %d: the connection to node %s it was reached through is lost: %w",
			r.object, s.m.node(r.node).addr, api.ErrUnavailable)
	}
	return r, nil
}

// export makes the allocation at m.Addr a shared object of its node.
func (s *session) export(body []byte) (*api.Shared, error) {
	var m api.Export
	if err := api.Decode(body, &m); err != nil {
		return nil, err
	}
	if m.Mode != api.ModeCoherent && m.Mode != api.ModeImmutable && m.Mode != api.ModeVersioned {
		return nil, fmt.Errorf("export in mode %v: want immutable, versioned or coherent: %w", m.Mode, api.ErrInvalidArgument)
	}
	if s.evicts {
		return nil, fmt.Errorf("export of %#x: an oversubscribed session's memory moves, so it cannot be shared: %w", m.Addr, api.ErrInvalidArgument)
	}
	if err := s.checkUnheld("export", m.Addr, false); err != nil {
		return nil, err // the node would refuse the graph's writes to it
	}
	if r, _ := s.sharedAt(m.Addr, 1); r != nil {
		return nil, fmt.Errorf("export of %#x: it is shared already (object %d): %w", m.Addr, r.object, api.ErrInvalidArgument)
	}
	if s.shares.count() >= MaxShared {
		return nil, fmt.Errorf("session has %d shared buffers, the limit: %w", MaxShared, api.ErrInvalidArgument)
	}
	if len(m.Grants) > api.MaxGrants {
		return nil, fmt.Errorf("export of %#x with %d grants: at most %d: %w", m.Addr, len(m.Grants), api.MaxGrants, api.ErrInvalidArgument)
	}
	for _, g := range m.Grants {
		if _, err := vocab.ParseTenant(g.Tenant); err != nil {
			return nil, fmt.Errorf("export of %#x: grant: %w", m.Addr, err)
		}
	}
	// A whole allocation, so that its free (at its start) ends the object.
	if err := s.space.CheckStart("export", m.Addr); err != nil {
		return nil, err
	}
	s.drainAll()
	s.issueMu.Lock()
	defer s.issueMu.Unlock()
	if m.Mode == api.ModeImmutable {
		if err := s.space.Seal(m.Addr); err != nil {
			return nil, fmt.Errorf("export %#x: %w", m.Addr, err)
		}
	}
	dev, end, err := s.space.Span(m.Addr)
	if err != nil {
		return nil, fmt.Errorf("export %#x: %w", m.Addr, err)
	}
	_, xs, err := s.space.Translate(m.Addr, end-m.Addr)
	if err != nil {
		return nil, fmt.Errorf("export %#x: %w", m.Addr, err)
	}
	v := s.vdevs[dev]
	reply, err := v.rpc.Call(api.OpNodeExport, nil, api.Encode(&api.NodeExport{Device: v.dev.info.Index, Extents: xs, Mode: m.Mode, Grants: m.Grants}))
	var obj api.NodeObject
	if err == nil {
		err = api.Decode(reply, &obj)
	}
	if err != nil {
		return nil, fmt.Errorf("export %#x on node %s: %w", m.Addr, s.m.node(v.dev.node).addr, err)
	}
	r := &sharedRange{base: m.Addr, size: end - m.Addr, node: v.dev.node,
		object: obj.Object, mode: m.Mode, write: m.Mode != api.ModeImmutable, pageSize: pageSizeOf(0)}
	r.via.Store(v.rpc)
	r.home.exported(s.m.node(v.dev.node).bootIfUp(), m.Grants)
	if err := r.pin(s.log); err != nil {
		// Unpinned, the exporter could not read the object, nor write the
		// buffer but through it, nor export it again: end it.
		if uerr := s.unexport(r); uerr != nil {
			err = errors.Join(err, fmt.Errorf("end shared object %d: %w", r.object, uerr))
		}
		return nil, fmt.Errorf("export %#x: %w", m.Addr, err)
	}
	s.shares.add(r)
	s.jr.add(journalOp{Op: opExport, VA: m.Addr, Object: obj.Object, Mode: m.Mode, Tenants: r.home.grantList()})
	s.holdVersion(r)
	return &api.Shared{Node: s.m.node(v.dev.node).addr, Object: obj.Object}, nil
}

// pageSizeOf is the node's coherence page (a node says it at import; an
// exporter's node is ours, of the same build).
func pageSizeOf(n uint32) uint64 {
	if n == 0 {
		return 64 << 10
	}
	return uint64(n)
}

// importShared maps a shared object into the session's address space.
func (s *session) importShared(body []byte) (*api.ImportReply, error) {
	var m api.Shared
	if err := api.Decode(body, &m); err != nil {
		return nil, err
	}
	idx := -1
	for i, n := range s.m.nodeList() {
		if n.addr == m.Node {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("import of object %d: node %q is not one of this mediator's: %w", m.Object, m.Node, api.ErrInvalidArgument)
	}
	// Checked before the node holds a pin for the import: only this
	// goroutine (the session's reader) adds shared buffers.
	if s.shares.count() >= MaxShared {
		return nil, fmt.Errorf("session has %d shared buffers, the limit: %w", MaxShared, api.ErrInvalidArgument)
	}
	rpc, err := s.nodeRPC(idx)
	if err != nil {
		return nil, err
	}
	// Only this goroutine (the session's reader) imports, one at a time.
	pending := &pendingImport{rpc: rpc, object: m.Object}
	s.shares.setImporting(pending)
	defer s.shares.setImporting(nil)
	reply, err := rpc.Call(api.OpNodeImport, nil, api.Encode(&api.NodeObject{Object: m.Object}))
	var ir api.NodeImportReply
	if err == nil {
		err = api.Decode(reply, &ir)
	}
	if err != nil {
		return nil, fmt.Errorf("import of object %d of node %s: %w", m.Object, m.Node, err)
	}
	if ir.PageSize == 0 || ir.Size == 0 {
		return nil, fmt.Errorf("node %s describes object %d with page size %d, size %d: %w", m.Node, m.Object, ir.PageSize, ir.Size, api.ErrProtocol)
	}
	r := &sharedRange{size: ir.Size, node: idx, addr: m.Node, object: m.Object,
		mode: ir.Mode, write: ir.Write, pageSize: pageSizeOf(ir.PageSize), imported: true}
	r.via.Store(rpc)
	r.home.imported(s.m.node(idx).bootIfUp(), &ir)
	if err := r.pin(s.log); err != nil {
		return nil, err
	}
	s.shares.addImport(r, ir.Size, pending)
	s.jr.add(journalOp{Op: opImport, VA: r.base, Size: ir.Size, Object: m.Object, Node: m.Node})
	return &api.ImportReply{Addr: r.base, Size: ir.Size, Mode: ir.Mode, Write: ir.Write}, nil
}

// readsInFlight bounds the page reads one copy has in flight (16 MiB).
const readsInFlight = 256

// MaxShared bounds the buffers a session exports and imports.
const MaxShared = 256

// nodeRPC is the session's connection to node idx, dialled for an import
// if none of its devices is there.
func (s *session) nodeRPC(idx int) (*wire.RPC, error) {
	if rpc := s.vdevRPC(idx); rpc != nil {
		return rpc, nil
	}
	// A lost connection is replaced: the imports made over it are made
	// again over the new one at their next use (sharedAt, rehomeImport),
	// as are new ones.
	return s.importConn(idx)
}

// closed reports whether rpc's connection has ended.
func closed(rpc *wire.RPC) bool {
	select {
	case <-rpc.Closed():
		return true
	default:
		return false
	}
}

// revoke withdraws a tenant's grant to a buffer the session exported.
func (s *session) revoke(body []byte) error {
	var m api.Revoke
	if err := api.Decode(body, &m); err != nil {
		return err
	}
	r, err := s.sharedAt(m.Addr, 1)
	if err == nil && (r == nil || r.imported || r.base != m.Addr) {
		err = fmt.Errorf("revoke at %#x: not a buffer this session exported: %w", m.Addr, api.ErrInvalidArgument)
	}
	if err != nil {
		return err
	}
	r.home.revoke(m.Tenant)
	s.jr.add(journalOp{Op: opRevoke, VA: m.Addr, Tenant: m.Tenant})
	_, err = r.conn().Call(api.OpNodeRevoke, nil, api.Encode(&api.NodeRevoke{Object: r.object, Tenant: m.Tenant}))
	return err
}

// unshare forgets the shared range at va (an import being freed, or an
// export whose allocation is freed, which ends the object on its node),
// reporting whether there was one.
func (s *session) unshare(va uint64, importsOnly bool) (bool, error) {
	r := s.shares.remove(va, importsOnly)
	if r == nil {
		return false, nil
	}
	// Journaled before the node is told: a restore that finds it ends the
	// object again (restoreShares), should the node not have heard.
	op := opUnexport
	if r.imported {
		op = opUnimport
	}
	s.jr.add(journalOp{Op: op, VA: va})
	if r.imported {
		// Other sessions here may still read the copies; the node may free
		// the version once no import pins it.
		return true, r.unpin()
	}
	return true, s.unexport(r)
}

// unexport ends the object r exported. The node tells the importers, whose
// mediators forget the object; so does this one, whose other sessions may
// have imported it.
func (s *session) unexport(r *sharedRange) error {
	_, err := r.conn().Call(api.OpNodeUnexport, nil, api.Encode(&api.NodeObject{Object: r.object}))
	s.m.node(r.node).cache.drop(r.object)
	return err
}

// pages calls f for each piece of [off, off+n) of the range that lies in
// one coherence page: the page, the piece's offset in the page and in the
// copy, and its length.
func (r *sharedRange) pages(off, n uint64, f func(page uint32, inPage, at, k uint64) error) error {
	for at := uint64(0); at < n; {
		o := off + at
		page, inPage := o/r.pageSize, o%r.pageSize
		k := min(n-at, r.pageSize-inPage)
		if err := f(uint32(page), inPage, at, k); err != nil {
			return err
		}
		at += k
	}
	return nil
}

// readShared copies len(dst) bytes at offset off of a shared range into dst:
// cached pages from the cache at once, others when the node's reply to a
// read of their whole page arrives, which is then cached. The reads count
// towards c, which is answered once they have all arrived.
//
// The command paid for len(dst) bytes of the tenant's bandwidth; a miss
// moves its whole page from the node, so before its read is sent it pays
// for the rest of the page too (what the node link carries for it, however
// few bytes the tenant asked for). Hits pay nothing more. The wait is this
// stream's alone, as the command's own (issueOne): the cache's lock is not
// held, nor the session's. A wait ended by the session's end fails the
// copy, with the reads already sent still counted towards c. The copy a
// miss caches is the tenant's, in its share of the cache (coherence.Cache).
func (st *stream) readShared(r *sharedRange, off uint64, dst []byte, c *completion, idx int) error {
	if err := r.home.stale.Load(); err != nil {
		return *err
	}
	pc := st.s.m.node(r.node).cache
	misses := 0
	return r.pages(off, uint64(len(dst)), func(page uint32, inPage, at, k uint64) error {
		if misses == readsInFlight {
			// Bounds the page buffers a copy holds at once. Waited for
			// without pc.mu, which the replies' callbacks take.
			st.unblock()
			st.calls.wait()
			misses = 0
		}
		version := r.version.Load() // 0 but for versioned buffers
		key := coherence.Key{Object: r.object, Version: version, Page: page}
		pc.mu.Lock()
		data, v, ok := pc.cache.Lookup(key, mnow())
		if ok {
			if pc.stale != nil && v < pc.stale[key] {
				pc.staleServes++
			}
			copy(dst[at:at+k], data[inPage:inPage+k])
			pc.mu.Unlock()
			st.s.sharedHits.Add(1)
			return nil
		}
		pc.mu.Unlock()
		plen := min(r.pageSize, r.size-uint64(page)*r.pageSize)
		if plen > k {
			if err := st.s.bw.wait(plen-k, st.s.ending, st.unblock); err != nil {
				return fmt.Errorf("read of page %d of shared object %d: %w", page, r.object, err)
			}
		}
		misses++
		pc.mu.Lock()
		t := pc.cache.StartRead(key, mnow())
		t.Owner = st.s.tenant
		pc.mu.Unlock()
		st.s.sharedMisses.Add(1)
		buf := make([]byte, api.NodeGrantSize+plen)
		req := api.Encode(&api.NodeObjAccess{Object: r.object, Version: version, Off: uint64(page) * r.pageSize, Len: plen})
		piece := dst[at : at+k]
		// The reply is cached on the connection's reader, in order with
		// the invalidations that follow it there.
		c.send(r.conn(), api.OpNodeObjRead, buf, func(call *wire.Call) {
			pc.mu.Lock()
			defer pc.mu.Unlock()
			var g api.NodeGrant
			err := call.Err
			if err == nil {
				err = api.Decode(buf[:api.NodeGrantSize], &g)
			}
			if err == nil {
				data := buf[api.NodeGrantSize:]
				copy(piece, data[inPage:inPage+k])
				// The bytes are the reader's either way; a Drop meanwhile only
				// means they are not kept.
				_, _ = pc.cache.Fill(t, coherence.ReadGrant{Version: g.Version, Lease: time.Duration(g.LeaseNs), Sealed: g.Sealed}, data, mnow())
			} else {
				_ = pc.cache.AbortRead(t)
			}
			if err != nil {
				c.fail(idx, api.OpNodeObjRead, fmt.Errorf("read of page %d of shared object %d: %w", page, r.object, err))
			}
		}, req)
		return nil
	})
}

// writeShared writes src at offset off of a shared range through to the
// node, a page at a time; c is answered once the node has applied it all.
// Until then the cache keeps no copy of those pages, so a later read goes
// to the node, which answers it after the write.
func (st *stream) writeShared(r *sharedRange, off uint64, src []byte, c *completion, idx int) error {
	if !r.write {
		return fmt.Errorf("write of shared object %d: this session may only read it: %w", r.object, api.ErrPermissionDenied)
	}
	pc := st.s.m.node(r.node).cache
	return r.pages(off, uint64(len(src)), func(page uint32, inPage, at, k uint64) error {
		pc.mu.Lock()
		err := pc.cache.StartWrite(r.object, page)
		pc.mu.Unlock()
		if err != nil {
			return err
		}
		req := api.Encode(&api.NodeObjAccess{Object: r.object, Off: off + at})
		c.send(r.conn(), api.OpNodeObjWrite, nil, func(call *wire.Call) {
			var g api.NodeGrant
			err := call.Err
			if err == nil {
				err = api.Decode(call.Body, &g)
			}
			pc.mu.Lock()
			_ = pc.cache.FinishWrite(r.object, page, g.Version) // 0 when it failed
			pc.mu.Unlock()
			if err != nil {
				c.fail(idx, api.OpNodeObjWrite, fmt.Errorf("write of page %d of shared object %d: %w", page, r.object, err))
			}
		}, req, src[at:at+k])
		return nil
	})
}

// viaShared issues a copy to or from a shared range, reporting whether cmd
// was one; its node calls count towards c.
func (st *stream) viaShared(cmd *command, c *completion, idx int) (bool, error) {
	var va, n uint64
	switch cmd.op {
	case api.OpCopyToDevice:
		va, n = cmd.toDev.Dst, uint64(len(cmd.toDev.Payload))
	case api.OpCopyFromDevice:
		va, n = cmd.fromDev.Src, cmd.fromDev.Len
	case api.OpCopyToDeviceHost, api.OpCopyFromDeviceHost:
		va, n = cmd.host.Addr, cmd.host.Len
	default:
		return false, nil
	}
	r, err := st.s.sharedAt(va, n)
	if r == nil || err != nil {
		return err != nil, err
	}
	off := va - r.base
	st.nb.flush() // what the stream gathered goes first
	switch cmd.op {
	case api.OpCopyToDevice:
		err = st.writeShared(r, off, cmd.toDev.Payload, c, idx)
		c.in += n
	case api.OpCopyToDeviceHost:
		var src []byte
		if src, err = st.s.hostBytes(&cmd.host); err == nil {
			err = st.writeShared(r, off, src, c, idx)
			c.in += n
		}
	case api.OpCopyFromDeviceHost:
		var dst []byte
		if dst, err = st.s.hostBytes(&cmd.host); err == nil {
			err = st.readShared(r, off, dst, c, idx)
			c.outN += n
		}
	default: // OpCopyFromDevice: into the reply
		st.unblock() // before a wait for a buffer
		if err = st.s.takeBuffer(st.s.outBufs); err != nil {
			return true, err
		}
		c.out, c.outLen = getOut(n), int(n)
		err = st.readShared(r, off, (*c.out)[:n], c, idx) // c gives the buffer back
	}
	return true, err
}
