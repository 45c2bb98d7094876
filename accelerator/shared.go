package accelerator

// Shared objects: buffers a tenant exports to other tenants, who may reach
// this node through other mediators. The node is their home: it keeps each
// object's coherence directory (coherence.Home) and applies every write
// (write-through), so an acknowledged write lives here and kernels here see
// it. Readers' mediators cache pages under leases; before a write of a
// coherent object is applied, the node pushes an invalidation (FlagPush,
// api.OpNodeInval) to every connection that holds an unexpired lease on the
// page and waits for its acknowledgement (api.OpNodeInvalAck) or for the
// lease to run out, so a dead or cut-off mediator, or one that reads no
// pushes, delays a write by one lease at most.
//
// An object is the exporter's frames, which stay the exporter's: the
// object ends when the exporter's connection frees them or ends (an
// attached one's parked frames keep it until they are reclaimed, the
// reclaimer becoming its exporter, or freed: reattach.go). While it
// lives, its frames are marked shared: the exporter's ordinary writes to
// them are refused, so every change goes through the directory (the
// exporter's mediator writes through the object, as importers do).
//
// Invariants:
//   - A connection reads or writes an object only with a grant: the
//     exporter always; another connection if its tenant is granted (to
//     write, granted writing). A revoked grant fails the next access, and
//     a write still waiting to be applied, or a publish still copying,
//     when it is revoked is not applied: once a revocation returns, the
//     tenant changes nothing.
//   - Data of an object changes only in commitReady, under the object's
//     lock, for a write the directory has committed: no cache anywhere then
//     holds an unexpired copy of the page at an older version.
//   - A version of a versioned object is the draft as it was at one
//     instant: while a publish copies the draft (outside the object's lock,
//     publishing), commitReady applies no write of the object; writes that
//     arrive meanwhile wait and land in the next draft. The copy reads no
//     byte of the object's frames once the object has ended (stopCopy),
//     since they may then change hands.
//   - One tenant's objects cost another nothing but the use it makes of
//     them: the node keeps, per connection, the objects it exported and
//     those it imported, read under a lease or pinned (connObjects), so a
//     free or a connection's end visits only those; no lock is held for
//     long but the wait of a write or a revocation, which releases it
//     (sync.Cond); and device work on an object (a publish's copy, an
//     export's first version) is work of the tenant that asks for it, in
//     steps on the device's scheduler (memwork.go).
//   - An immutable export seals the frames the object covers whole, and no
//     other: a frame it covers in part may hold the exporter's other
//     allocations, or runs of an object that may be written (see export).
//
// Lock order: an object's mu, then objectTable.mu or a frame table's lock.
// objectTable.mu is a leaf: no lock is taken under it, and above all no
// object's mu, so whoever holds or waits for one object's lock holds up
// only that object's users. An object's copyMu is a leaf too. Pushes are
// only queued under an object's mu, for the connection's pusher to write
// (push.go), so a mediator that does not read stalls nobody; writing a
// frame never waits for a lock of this file.

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/coherence"
)

// Coherence parameters of this node's objects.
const (
	// PageSize is the coherence page: the unit of invalidation and caching.
	PageSize = 64 << 10
	// ReadLease is how long a reader's copy of a coherent page stays valid
	// without the node's word, and so the longest a write waits for a
	// reader that does not answer.
	ReadLease = 200 * time.Millisecond
	// MaxPins bounds the pins one connection holds on one versioned object,
	// so a mediator that never unpins cannot grow the directory without
	// end. A mediator's session pins once per import of the object, and
	// once more while it moves one to a newer version.
	MaxPins = 1024
	// MaxPinnedVersions bounds the older versions of one versioned object
	// that the node keeps for readers who pinned them. Each is a copy of the
	// object in the node's host memory that no tenant's quota counts, so
	// without it a reader that never unpinned would make every publish cost
	// memory: a publish that would keep more fails with
	// api.ErrQuotaExceeded, and the node keeps at most this many versions
	// besides the published one.
	MaxPinnedVersions = 8
	// MaxObjects bounds the objects one connection has exported and not
	// yet ended: each costs the node a directory and bookkeeping that
	// the connection's frames do not count (a mediator exports at most
	// 256 buffers per session).
	MaxObjects = 1024
	// MaxExportExtents bounds the extents of the objects one connection
	// has exported and not yet ended, which the node keeps in host memory
	// (16 bytes each, and as much again in the frame table) for the
	// objects' lives: without it, MaxObjects objects of as many extents
	// as the wire allows (wire.MaxList) would cost a gigabyte. A mediator
	// sends one extent per frame of an allocation at most (fewer where
	// frames are contiguous), and a frame holds at most MaxSharedRuns
	// runs of objects (frames.go).
	MaxExportExtents = 1 << 20
)

// epoch is the origin of the node's clock for leases.
var epoch = time.Now()

func now() time.Duration { return time.Since(epoch) }

// objectTable is the node's objects. Its mu is a leaf (see the lock order
// above): it guards the maps and counters here, and conn.exports and
// conn.exportExtents, and is held only to read or change them.
type objectTable struct {
	mu     sync.Mutex
	byID   map[uint64]*object
	ending map[uint64]*object  // ended, telling their importers
	ended  api.CoherenceStatus // what ended objects cost
	// byConn is, for each connection that has any, the objects it has to
	// do with; a connection with none has no entry.
	byConn map[*conn]*connObjects
	// maxExtents bounds conn.exportExtents (MaxExportExtents; tests
	// lower it).
	maxExtents int
}

// connObjects are the objects one connection has to do with, so that its
// frees visit only its own exports, and its end only the objects that
// know it. Under objectTable.mu.
type connObjects struct {
	exported map[uint64]*object // by id: exported by the connection, not ended yet
	// used lists the objects whose users include the connection (the
	// reverse of object.users): those it imported, read under a lease or
	// pinned, whose readers, importers and pins must forget it when it
	// ends. An object leaves it when it ends.
	used map[*object]bool
	// pending is the object being restored (restore.go), nil if none;
	// restored counts the bytes of those restored, live or pending.
	pending  *restoring
	restored uint64
}

// exporting says whether c has exported objects that have not ended.
func (t *objectTable) exporting(c *conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return c.exports > 0
}

// objectsOf returns c's entry, made if it has none. The caller holds t.mu.
func (t *objectTable) objectsOf(c *conn) *connObjects {
	r := t.byConn[c]
	if r == nil {
		r = &connObjects{exported: map[uint64]*object{}, used: map[*object]bool{}}
		t.byConn[c] = r
	}
	return r
}

// tidy drops c's entry if it lists nothing. The caller holds t.mu.
func (t *objectTable) tidy(c *conn) {
	if r := t.byConn[c]; r != nil && len(r.exported) == 0 && len(r.used) == 0 && r.pending == nil {
		delete(t.byConn, c)
	}
}

// randomID is a random object id.
func randomID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return binary.LittleEndian.Uint64(b[:])
}

// add adds a directory's counters to st.
func add(st *api.CoherenceStatus, h coherence.HomeStats) {
	st.Reads += h.Reads
	st.Writes += h.Writes
	st.Invals += h.Invals
	st.InvalAcks += h.InvalAcks
	st.Expired += h.Expired
}

// status sums the counters of every object, ended ones included. It takes
// each object's lock in turn, without the table's.
func (t *objectTable) status() api.CoherenceStatus {
	t.mu.Lock()
	st := t.ended
	live := slices.Collect(maps.Values(t.byID))
	t.mu.Unlock()
	st.Objects = len(live)
	for _, o := range live {
		o.mu.Lock()
		add(&st, o.home.Stats())
		st.Versions += len(o.versions)
		for _, b := range o.versions {
			st.VersionBytes += uint64(len(b))
		}
		o.mu.Unlock()
	}
	return st
}

type object struct {
	id       uint64
	exporter *conn
	dev      *device
	xs       []api.Extent // the object's bytes, in order
	size     uint64

	mu      sync.Mutex
	changed *sync.Cond // an acknowledgement arrived or a write committed
	grants  map[string]bool
	home    *coherence.Home
	readers map[coherence.CacheID]*conn // connections that read: where invalidations go
	// importers are the connections that imported the object: a
	// revocation is pushed to those of the tenant, whose mediators may
	// serve reads from copies other connections fetched.
	importers map[coherence.CacheID]*conn
	data      map[coherence.WriteID]*objWrite
	revoking  []*revocation // revocations pushed, waiting for acknowledgements
	gone      bool
	// users are the connections whose connObjects.used lists o (use).
	users map[*conn]bool
	// Versioned objects: the published versions' bytes that are live (the
	// published one and every pinned one; home counts the pins). The frames
	// hold the draft, where writes land.
	versions map[uint64][]byte
	// publishing: a publish is copying the draft, without mu. commitReady
	// applies no write meanwhile, and other publishes wait for it.
	publishing bool

	// copyMu is held while a copy of the draft reads a piece of the
	// frames; stopCopy, under it, says the object has ended and the copy
	// is to read no more. A leaf: taken under mu or alone.
	copyMu   sync.Mutex
	stopCopy bool
}

// revocation is one push of a revocation to importers (tell): those of
// them that have not acknowledged it yet. Each waits for its own
// acknowledgements, which echo its sequence number, so revocations that
// overlap, or an acknowledgement that comes after its revocation gave up
// waiting, do not end another's wait.
type revocation struct {
	seq     uint64
	waiting map[coherence.CacheID]bool
}

// revocations numbers revocations, node-wide.
var revocations atomic.Uint64

// objWrite is a write waiting for its commit; whoever commits it applies it.
type objWrite struct {
	writer  *conn // whose grant must still hold when it is applied
	off     uint64
	payload []byte
	version uint64
	done    bool
	err     error
}

func newObjectTable() *objectTable {
	return &objectTable{byID: map[uint64]*object{}, ending: map[uint64]*object{}, byConn: map[*conn]*connObjects{},
		maxExtents: MaxExportExtents}
}

// use records c as a user of o, which it imported, read under a lease or
// pinned: its end is to forget it there. The caller holds o.mu, and o is
// not gone.
func (o *object) use(c *conn) {
	if o.users[c] {
		return
	}
	o.users[c] = true
	t := c.node.objects
	t.mu.Lock()
	t.objectsOf(c).used[o] = true
	t.mu.Unlock()
}

func cacheID(c *conn) coherence.CacheID { return coherence.CacheID(c.owner) }

// export makes the connection's frames at m.Extents an object.
func (c *conn) export(m *api.NodeExport) (uint64, error) {
	d, err := c.device(m.Device)
	if err != nil {
		return 0, err
	}
	if !m.Mode.Valid() || m.Mode == api.ModePrivate {
		return 0, fmt.Errorf("export in mode %v: want immutable, versioned or coherent: %w", m.Mode, api.ErrInvalidArgument)
	}
	if len(m.Grants) > api.MaxGrants { // a mediator's word is no bound on the node's memory
		return 0, fmt.Errorf("export with %d grants: at most %d: %w", len(m.Grants), api.MaxGrants, api.ErrInvalidArgument)
	}
	t := c.node.objects
	t.mu.Lock()
	if c.exports >= MaxObjects {
		t.mu.Unlock()
		return 0, fmt.Errorf("export: this connection has %d shared objects, the limit: %w", MaxObjects, api.ErrQuotaExceeded)
	}
	if have := c.exportExtents; len(m.Extents) > t.maxExtents-have {
		t.mu.Unlock()
		return 0, fmt.Errorf("export of %d extents: this connection's shared objects have %d, and at most %d: %w",
			len(m.Extents), have, t.maxExtents, api.ErrQuotaExceeded)
	}
	c.exports++ // taken back below unless the object is made
	c.exportExtents += len(m.Extents)
	t.mu.Unlock()
	made := false
	defer func() {
		if !made {
			t.mu.Lock()
			c.exports--
			c.exportExtents -= len(m.Extents)
			t.mu.Unlock()
		}
	}()
	size := api.ExtentsLen(m.Extents)
	if size == 0 {
		return 0, fmt.Errorf("export of 0 bytes: %w", api.ErrInvalidArgument)
	}
	if err := checkDistinct(m.Extents); err != nil {
		return 0, fmt.Errorf("%s: export: %w", d.Info().Name, err)
	}
	check := d.frames.checkWrite // the object's writes go to these bytes
	if m.Mode == api.ModeImmutable {
		check = d.frames.checkAccess // sealed below, if not already
	}
	if err := check(c.owner, m.Extents); err != nil {
		return 0, fmt.Errorf("%s: export: %w", d.Info().Name, err)
	}
	// Checked before anything changes; share checks again, under the
	// frame table's lock.
	if err := d.frames.shareable(m.Extents); err != nil {
		return 0, fmt.Errorf("%s: export: %w", d.Info().Name, err)
	}
	pages := (size + PageSize - 1) / PageSize
	home, err := coherence.NewHome(coherence.HomeConfig{Mode: m.Mode, Pages: uint32(pages), Lease: ReadLease})
	if err != nil {
		return 0, err
	}
	if m.Mode == api.ModeImmutable {
		// Nobody writes the object's bytes again: every write path refuses
		// bytes of a shared object (frameTable.check), and the directory,
		// sealed, refuses writes through the object. On top of that the
		// node seals the frames the object covers whole, unless the
		// exporter sealed them (OpNodeSeal) first. It seals no frame the
		// object covers in part, and refuses no export for one: such a
		// frame may hold the exporter's other allocations (small ones
		// share frames), which a seal would make read-only, and runs of a
		// coherent or versioned object, whose writes a seal would let
		// change a sealed frame; refusing would refuse the immutable
		// export of every small allocation. The object's bytes there are
		// read-only all the same, as above, and the exporter's mediator
		// refuses its tenant's writes to them too
		// (memory.Space.TranslateWrite). A frame covered whole holds no
		// run of another object: shareable refused any overlap.
		for f, runs := range runsByFrame(m.Extents) {
			addr := uint64(f) * FrameSize
			if api.ExtentsLen(runs) == FrameSize && !d.frames.isSealed(addr) && !d.frames.isShared([]api.Extent{{Addr: addr, Len: FrameSize}}) {
				d.frames.seal(addr)
			}
		}
		if err := home.Seal(); err != nil {
			return 0, err
		}
	}
	o := &object{exporter: c, dev: d, xs: m.Extents, size: size, grants: map[string]bool{}, home: home,
		readers: map[coherence.CacheID]*conn{}, importers: map[coherence.CacheID]*conn{}, data: map[coherence.WriteID]*objWrite{},
		users: map[*conn]bool{}, versions: map[uint64][]byte{}}
	if m.Mode == api.ModeVersioned {
		// Version 1 is what the buffer holds now: a copy, as device work
		// of the exporter. Nobody else knows the object yet.
		snap, took, err := o.copyDraft()
		d.chargeOff(c.share, took)
		if err != nil {
			return 0, err
		}
		o.versions[1] = snap
	}
	o.changed = sync.NewCond(&o.mu)
	for _, g := range m.Grants {
		o.grants[g.Tenant] = g.Write
	}
	if m.Mode != api.ModeImmutable {
		// The object's writes (commitReady) bypass the write paths, which
		// would give aliased frames memory of their own first.
		if err := c.node.content.own(c.share, d, m.Extents); err != nil {
			return 0, err
		}
	}
	if err := d.frames.share(m.Extents); err != nil {
		return 0, fmt.Errorf("%s: export: %w", d.Info().Name, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// Random ids: a mediator that outlives a restart of this node must not
	// find an old object's cached pages under a new object's id.
	for o.id == 0 || t.byID[o.id] != nil || t.ending[o.id] != nil {
		o.id = randomID()
	}
	t.byID[o.id] = o
	t.objectsOf(c).exported[o.id] = o
	made = true
	return o.id, nil
}

// checkDistinct refuses an object's extents that are empty or overlap: an
// object's page is one place in device memory.
func checkDistinct(xs []api.Extent) error {
	sorted := slices.Clone(xs)
	slices.SortFunc(sorted, func(a, b api.Extent) int { return cmp.Compare(a.Addr, b.Addr) })
	for i, x := range sorted {
		if x.Len == 0 {
			return fmt.Errorf("extent [%#x, +0) is empty: %w", x.Addr, api.ErrInvalidArgument)
		}
		if i > 0 {
			if p := sorted[i-1]; x.Addr-p.Addr < p.Len {
				return fmt.Errorf("extents [%#x, +%d) and [%#x, +%d) overlap: %w", p.Addr, p.Len, x.Addr, x.Len, api.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// framesOf lists the frames extents touch, once each, in order; an empty
// extent touches none.
func framesOf(xs []api.Extent) []uint64 {
	var out []uint64
	for _, x := range xs {
		for f := x.Addr &^ (FrameSize - 1); x.Len > 0 && f < x.Addr+x.Len; f += FrameSize {
			if len(out) == 0 || out[len(out)-1] != f {
				out = append(out, f)
			}
		}
	}
	return out
}

// lookup returns the live object id names, with its lock held, whoever
// asks.
func (t *objectTable) lookup(id uint64) (*object, error) {
	t.mu.Lock()
	o := t.byID[id]
	t.mu.Unlock()
	if o == nil {
		return nil, fmt.Errorf("shared object %d does not exist (or its exporter freed it): %w", id, api.ErrInvalidArgument)
	}
	o.mu.Lock()
	if o.gone {
		o.mu.Unlock()
		return nil, fmt.Errorf("shared object %d: its exporter freed it: %w", id, api.ErrInvalidArgument)
	}
	return o, nil
}

// object returns the object id names if c may use it (to write, if
// write), with its lock held.
func (c *conn) object(id uint64, write bool) (*object, error) {
	o, err := c.node.objects.lookup(id)
	if err != nil {
		return nil, err
	}
	if err := o.may(c, write); err != nil {
		o.mu.Unlock()
		return nil, err
	}
	return o, nil
}

// may says why c may not use o (to write, if write), or nil if it may.
// The caller holds o.mu.
func (o *object) may(c *conn, write bool) error {
	w, granted := o.grants[c.tenant]
	switch {
	case o.exporter == c:
	case !granted:
		return fmt.Errorf("shared object %d: tenant %q has no grant: %w", o.id, c.tenant, api.ErrPermissionDenied)
	case write && !w:
		return fmt.Errorf("shared object %d: tenant %q may only read it: %w", o.id, c.tenant, api.ErrPermissionDenied)
	}
	return nil
}

func (c *conn) importObject(m *api.NodeObject) (*api.NodeImportReply, error) {
	o, err := c.object(m.Object, false)
	if err != nil {
		return nil, err
	}
	defer o.mu.Unlock()
	o.importers[cacheID(c)] = c
	o.use(c)
	return &api.NodeImportReply{Size: o.size, Mode: o.home.Mode(), Write: o.exporter == c || o.grants[c.tenant],
		PageSize: PageSize, LeaseNs: int64(ReadLease), HasExporter: true, Exporter: o.exporter.tenant}, nil
}

func (c *conn) revoke(m *api.NodeRevoke) error {
	o, err := c.object(m.Object, false)
	if err != nil {
		return err
	}
	defer o.mu.Unlock()
	if o.exporter != c {
		return fmt.Errorf("shared object %d: only its exporter may revoke grants: %w", m.Object, api.ErrPermissionDenied)
	}
	if _, ok := o.grants[m.Tenant]; !ok {
		return fmt.Errorf("shared object %d: tenant %q has no grant: %w", m.Object, m.Tenant, api.ErrInvalidArgument)
	}
	delete(o.grants, m.Tenant)
	// The tenant's pins go with its grant: it may read no version, and
	// they would hold up the exporter's publishes (MaxPinnedVersions).
	// Its connections that pinned are among the users, importers or not.
	for u := range o.users {
		if u.tenant == m.Tenant && u != o.exporter {
			o.home.Forget(cacheID(u))
		}
	}
	o.prune()
	o.tell(m.Tenant)
	return nil
}

// tell pushes a revocation of tenant's grant (of every grant, if tenant is
// "") to the connections that imported the object, and waits until they
// have acknowledged (their mediators stop serving reads from copies), or a
// lease has passed, for one that does not answer. The caller holds o.mu.
func (o *object) tell(tenant string) {
	rv := &revocation{seq: revocations.Add(1), waiting: map[coherence.CacheID]bool{}}
	body := api.Encode(&api.NodeRevoke{Object: o.id, Tenant: tenant, Seq: rv.seq})
	for id, rc := range o.importers {
		if tenant == "" || rc.tenant == tenant {
			rv.waiting[id] = true
			rc.pushes.push(api.OpNodeRevoked, body)
		}
	}
	if len(rv.waiting) == 0 {
		return
	}
	o.revoking = append(o.revoking, rv)
	defer func() { o.revoking = slices.DeleteFunc(o.revoking, func(x *revocation) bool { return x == rv }) }()
	deadline := now() + ReadLease
	wake := time.AfterFunc(ReadLease+time.Millisecond, func() {
		o.mu.Lock()
		o.changed.Broadcast()
		o.mu.Unlock()
	})
	defer wake.Stop()
	for len(rv.waiting) > 0 && now() < deadline {
		o.changed.Wait()
	}
}

// revokedAck takes a reader's acknowledgement of a revocation: it ends the
// reader's part in the wait of the revocation it names.
func (c *conn) revokedAck(m *api.NodeRevoke) error {
	t := c.node.objects
	t.mu.Lock()
	o := t.byID[m.Object]
	if o == nil {
		o = t.ending[m.Object]
	}
	t.mu.Unlock()
	if o == nil {
		return nil // it ended meanwhile
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rv := range o.revoking {
		if rv.seq == m.Seq {
			delete(rv.waiting, cacheID(c))
		}
	}
	o.changed.Broadcast()
	return nil
}

// span checks that [off, off+n) lies in one page of o and returns it.
func (o *object) span(off, n uint64) (uint32, []api.Extent, error) {
	if n == 0 || off >= o.size || n > o.size-off || off/PageSize != (off+n-1)/PageSize {
		return 0, nil, fmt.Errorf("%d bytes at offset %d of shared object %d (%d bytes): want 1 or more bytes within one %d-byte page: %w",
			n, off, o.id, o.size, PageSize, api.ErrInvalidArgument)
	}
	return uint32(off / PageSize), subExtents(o.xs, off, n), nil
}

// subExtents returns the runs of xs that hold bytes [off, off+n) of them.
func subExtents(xs []api.Extent, off, n uint64) []api.Extent {
	var out []api.Extent
	for _, x := range xs {
		if n == 0 {
			break
		}
		if off >= x.Len {
			off -= x.Len
			continue
		}
		k := min(n, x.Len-off)
		out = append(out, api.Extent{Addr: x.Addr + off, Len: k})
		off, n = 0, n-k
	}
	return out
}

// readObject answers a read of one page: its grant, then its bytes.
func (c *conn) readObject(h wire.Header, m *api.NodeObjAccess) error {
	grant, data, err := c.readPage(m)
	if err != nil {
		return err
	}
	// Sent without the object's lock: a reader that does not read its
	// socket stalls only its own connection.
	return c.c.Reply(h, grant, data)
}

// readPage serves a read under the object's lock: the grant and a copy of
// the bytes as of now.
func (c *conn) readPage(m *api.NodeObjAccess) ([]byte, []byte, error) {
	o, err := c.object(m.Object, false)
	if err != nil {
		return nil, nil, err
	}
	defer o.mu.Unlock()
	page, xs, err := o.span(m.Off, m.Len)
	if err != nil {
		return nil, nil, err
	}
	g, err := o.home.Read(cacheID(c), page, m.Version, now())
	if err != nil {
		return nil, nil, err
	}
	if g.Lease > 0 {
		o.readers[cacheID(c)] = c
		o.use(c)
	}
	grant := api.Encode(&api.NodeGrant{Version: g.Version, LeaseNs: int64(g.Lease), Sealed: g.Sealed})
	if o.home.Mode() == api.ModeVersioned {
		snap := o.versions[m.Version]
		if snap == nil {
			return nil, nil, fmt.Errorf("shared object %d: version %d is gone: %w", o.id, m.Version, api.ErrInternal)
		}
		return grant, snap[m.Off : m.Off+m.Len], nil // versions never change
	}
	data := make([]byte, 0, m.Len)
	err = o.dev.Read(xs, func(parts ...[]byte) error {
		for _, p := range parts {
			data = append(data, p...)
		}
		return nil
	})
	return grant, data, err
}

// writeObject applies a write of one page once the directory commits it,
// and answers with the page's new version.
func (c *conn) writeObject(h wire.Header, m *api.NodeObjAccess) error {
	o, err := c.object(m.Object, true)
	if err != nil {
		return err
	}
	if err := o.noDraft(); err != nil {
		o.mu.Unlock()
		return err
	}
	page, _, err := o.span(m.Off, uint64(len(m.Payload)))
	if err != nil {
		o.mu.Unlock()
		return err
	}
	w, err := o.home.BeginWrite(cacheID(c), page, now())
	if err != nil {
		o.mu.Unlock()
		return err
	}
	mine := &objWrite{writer: c, off: m.Off, payload: m.Payload}
	o.data[w.ID] = mine
	if len(w.Inval) > 0 {
		body := api.Encode(&api.NodeInval{Object: o.id, Page: page, Version: w.Version})
		for _, r := range w.Inval {
			if rc := o.readers[r]; rc != nil {
				rc.pushes.push(api.OpNodeInval, body)
			}
		}
		// Wake the waiters when the leases run out, in case nobody answers.
		time.AfterFunc(max(0, w.Deadline-now())+time.Millisecond, func() {
			o.mu.Lock()
			o.changed.Broadcast()
			o.mu.Unlock()
		})
	}
	for !mine.done && !o.gone {
		o.commitReady(page)
		if !mine.done {
			o.changed.Wait()
		}
	}
	o.mu.Unlock()
	if !mine.done {
		return fmt.Errorf("shared object %d: its exporter freed it during the write: %w", o.id, api.ErrUnavailable)
	}
	if mine.err != nil {
		return mine.err
	}
	return c.c.Reply(h, api.Encode(&api.NodeGrant{Version: mine.version}))
}

// commitReady applies and commits every write of page the directory lets
// through now; none while a publish copies the draft, whose publisher
// commits those it held off when the copy ends. A write whose writer lost its grant while it waited
// (for another reader's acknowledgement, or a publish) is not applied,
// since its revocation has returned to the exporter; it is still
// committed, so the writes behind it go ahead. The caller holds o.mu.
func (o *object) commitReady(page uint32) {
	for !o.publishing {
		w, ok := o.home.Ready(page, now())
		if !ok {
			return
		}
		ow := o.data[w.ID]
		delete(o.data, w.ID)
		var err error
		if ow != nil {
			if err = o.may(ow.writer, true); err == nil {
				err = o.dev.Write(subExtents(o.xs, ow.off, uint64(len(ow.payload))), ow.payload)
			}
		}
		w, cerr := o.home.Commit(page)
		if ow != nil {
			ow.err = errors.Join(err, cerr)
			ow.version, ow.done = w.Version, true
		}
		o.changed.Broadcast()
	}
}

// copyDraft copies o's draft, on the calling goroutine at full speed,
// and returns it with the time it took, for the caller to charge to the
// tenant that asked once nothing waits for the copy (chargeOff): paced by
// that tenant's turns on the scheduler, a throttled publisher's copy held
// off the object's writes, the exporter's included, for as long as its
// share stretched it. It stops, failing, once the object has ended
// (stopCopy), reading nothing of frames that may have changed hands.
func (o *object) copyDraft() ([]byte, time.Duration, error) {
	snap := make([]byte, 0, o.size)
	from := newExtentCursor(o.xs)
	piece := func() error {
		o.copyMu.Lock()
		defer o.copyMu.Unlock()
		if o.stopCopy {
			return fmt.Errorf("shared object %d: its exporter freed it during the publish: %w", o.id, api.ErrUnavailable)
		}
		return o.dev.Read(from.next(pieceBytes), func(parts ...[]byte) error {
			for _, p := range parts {
				snap = append(snap, p...)
			}
			return nil
		})
	}
	took, err := o.dev.timed(func() error {
		for from.left > 0 {
			if err := piece(); err != nil {
				return err
			}
		}
		return nil
	})
	return snap, took, err
}

// prune frees the versions nobody can read any more. The caller holds o.mu.
func (o *object) prune() {
	live := o.home.Live()
	for v := range o.versions {
		if !slices.Contains(live, v) {
			delete(o.versions, v)
		}
	}
}

// mayPublish says why c may not publish o's draft now, or returns nil.
// The caller holds o.mu.
func (o *object) mayPublish(c *conn) error {
	if o.gone {
		return fmt.Errorf("shared object %d: its exporter freed it during the publish: %w", o.id, api.ErrUnavailable)
	}
	if err := o.may(c, true); err != nil {
		return err
	}
	if err := o.noDraft(); err != nil {
		return err
	}
	if mode := o.home.Mode(); mode != api.ModeVersioned {
		return fmt.Errorf("shared object %d: publish of a %v object: %w", o.id, mode, api.ErrInvalidArgument)
	}
	if n := o.home.PinnedVersions(); n > MaxPinnedVersions {
		return fmt.Errorf("shared object %d: readers pin %d of its versions, more than the %d older ones the node keeps besides the published one; publish again once they unpin: %w",
			o.id, n, MaxPinnedVersions, api.ErrQuotaExceeded)
	}
	return nil
}

// publish makes a versioned object's draft its next version. The copy of
// the draft is done without o.mu, at full speed: meanwhile the object's
// writes wait (publishing), and nothing else does. It is device work of
// c's tenant, charged once o.mu is released: the reply, and the tenant's
// next work, wait its turn for it. The version is made at the end, under o.mu, if c may still
// write o then: a publish whose grant was revoked while it copied
// publishes nothing.
func (c *conn) publish(m *api.NodeObject) (uint64, error) {
	o, err := c.object(m.Object, true)
	if err != nil {
		return 0, err
	}
	var took time.Duration
	defer func() { // after the unlock below
		if o.dev != nil { // a restored object copies nothing (restore.go)
			o.dev.chargeOff(c.share, took)
		}
	}()
	defer o.mu.Unlock()
	for o.publishing && !o.gone { // one copy at a time
		o.changed.Wait()
	}
	if err := o.mayPublish(c); err != nil {
		return 0, err
	}
	o.publishing = true
	o.mu.Unlock()
	snap, took, err := o.copyDraft()
	o.mu.Lock()
	o.publishing = false
	var v uint64
	if err == nil {
		err = o.mayPublish(c)
	}
	if err == nil {
		if v, err = o.home.Publish(); err == nil {
			o.versions[v] = snap
			o.prune()
		}
	}
	// The writes the copy held off land now, in the draft after the
	// version made if any, before another publish waiting for this one can
	// hold them off again.
	for _, ow := range o.data {
		if page, _, err := o.span(ow.off, uint64(len(ow.payload))); err == nil {
			o.commitReady(page)
		}
	}
	o.changed.Broadcast() // writes still waiting, and publishes, go on
	if err != nil {
		return 0, err
	}
	return v, nil
}

// pin adds a pin of the published version by c and returns the version.
// c's other pins stay: each of its mediator's imports holds its own, and
// moves it by pinning anew before unpinning the old one.
func (c *conn) pin(m *api.NodeObject) (uint64, error) {
	o, err := c.object(m.Object, false)
	if err != nil {
		return 0, err
	}
	defer o.mu.Unlock()
	if n := o.home.Pins(cacheID(c)); n >= MaxPins {
		return 0, fmt.Errorf("shared object %d: this connection holds %d pins of it, the limit: %w", o.id, n, api.ErrInvalidArgument)
	}
	v, err := o.home.Pin(cacheID(c))
	if err == nil {
		o.use(c)
	}
	return v, err
}

// unpin undoes one pin of a version by c, and frees the version if
// nobody else needs it. It needs no grant: a revocation dropped the
// revoked importer's pins, so its unpins, which may cross the
// revocation, have nothing left to undo and succeed.
func (c *conn) unpin(m *api.NodeVersion) error {
	o, err := c.node.objects.lookup(m.Object)
	if err != nil {
		return err
	}
	defer o.mu.Unlock()
	if err := o.home.Unpin(cacheID(c), m.Version); err != nil {
		if o.may(c, false) != nil {
			return nil
		}
		return fmt.Errorf("shared object %d: %w", o.id, err)
	}
	o.prune()
	return nil
}

// invalAck takes a reader's acknowledgement. It needs no grant: a reader
// revoked while it held a lease is still invalidated, and a write would
// otherwise wait out the lease; the directory counts only acknowledgements
// from the caches it waits for.
func (c *conn) invalAck(m *api.NodeInval) error {
	o, err := c.node.objects.lookup(m.Object)
	if err != nil {
		return err
	}
	defer o.mu.Unlock()
	if err := o.home.InvalAck(cacheID(c), m.Page, m.Version); err != nil {
		return err
	}
	o.changed.Broadcast()
	return nil
}

// dropObjects ends the objects c exported that are made of frames of d
// about to be freed; with no device and no frames (its connection ended),
// it forgets c as a user of every object instead, and ends the objects it
// restored, which hold no frames (restore.go).
func (n *Node) dropObjects(c *conn, d *device, frames []uint64) {
	if d == nil && frames == nil {
		n.endObjects(c, func(o *object) bool { return o.dev == nil }, true)
		return
	}
	freed := map[uint64]bool{}
	for _, f := range frames {
		freed[f] = true
	}
	n.endObjects(c, func(o *object) bool { return o.dev == d && touches(o.xs, freed) }, frames == nil)
}

// endObjects ends the objects c exported that end says, and if forget,
// forgets c as a reader, importer and pinner of every object. It visits
// only c's objects (connObjects), and takes no object's lock under the
// table's, so its cost and its waits are c's alone.
func (n *Node) endObjects(c *conn, end func(*object) bool, forget bool) {
	t := n.objects
	if forget {
		t.forget(c)
	}
	t.mu.Lock()
	var mine []*object
	if r := t.byConn[c]; r != nil {
		mine = slices.Collect(maps.Values(r.exported))
	}
	t.mu.Unlock()
	// Without the table's lock: only c's requests, which run one at a
	// time, export or end c's objects.
	mine = slices.DeleteFunc(mine, func(o *object) bool { return !end(o) })
	if len(mine) == 0 {
		return
	}
	t.mu.Lock()
	r := t.objectsOf(c)
	for _, o := range mine {
		c.exports--
		c.exportExtents -= len(o.xs)
		if o.dev == nil {
			r.restored -= o.size
		}
		delete(r.exported, o.id)
		delete(t.byID, o.id)
		t.ending[o.id] = o
	}
	t.tidy(c)
	t.mu.Unlock()
	for _, o := range mine {
		o.mu.Lock()
		o.gone = true
		o.changed.Broadcast()
		o.mu.Unlock()
		// A publish's copy reads none of the frames from here on: they
		// may change hands once the object has ended.
		o.copyMu.Lock()
		o.stopCopy = true
		o.copyMu.Unlock()
	}
	// Importers' mediators forget their copies before the frames change
	// hands.
	for _, o := range mine {
		o.mu.Lock()
		o.tell("")
		if o.dev != nil {
			o.dev.frames.unshare(o.xs)
		}
		st := o.home.Stats()
		users := slices.Collect(maps.Keys(o.users))
		clear(o.users)
		o.mu.Unlock()
		t.mu.Lock()
		for _, u := range users {
			if r := t.byConn[u]; r != nil {
				delete(r.used, o)
				t.tidy(u)
			}
		}
		delete(t.ending, o.id)
		add(&t.ended, st)
		t.mu.Unlock()
	}
}

// forget forgets c, whose connection ended, as a reader, importer and
// pinner of the objects it used, and as one that a revocation waits for.
func (t *objectTable) forget(c *conn) {
	t.mu.Lock()
	var used map[*object]bool
	if r := t.byConn[c]; r != nil {
		used, r.used = r.used, map[*object]bool{}
		r.dropPending()
		t.tidy(c)
	}
	t.mu.Unlock()
	for o := range used {
		o.mu.Lock()
		delete(o.users, c)
		delete(o.readers, cacheID(c))
		delete(o.importers, cacheID(c))
		for _, rv := range o.revoking {
			delete(rv.waiting, cacheID(c)) // gone: nothing to wait for
		}
		o.changed.Broadcast()
		o.home.Forget(cacheID(c))
		o.prune()
		o.mu.Unlock()
	}
}

// adopt makes to the exporter of the objects from exported: to reclaimed
// from, a parked connection (reattach.go), and holds its frames now.
// Neither connection runs a request meanwhile (from has ended; to is
// answering its reclaim), so the objects' set cannot change under it. It
// returns how many objects to took.
func (t *objectTable) adopt(from, to *conn) int {
	t.mu.Lock()
	var mine []*object
	if r := t.byConn[from]; r != nil && len(r.exported) > 0 {
		mine = slices.Collect(maps.Values(r.exported))
		into := t.objectsOf(to)
		maps.Copy(into.exported, r.exported)
		into.restored += r.restored
		r.restored = 0
		clear(r.exported)
		t.tidy(from)
	}
	to.exports += from.exports
	to.exportExtents += from.exportExtents
	from.exports, from.exportExtents = 0, 0
	t.mu.Unlock()
	// A write from queued before the drop and not yet applied fails its
	// grant check from here on (may): unacknowledged, either outcome is
	// allowed, and its writer is gone.
	for _, o := range mine {
		o.mu.Lock()
		o.exporter = to
		o.mu.Unlock()
	}
	return len(mine)
}

func touches(xs []api.Extent, frames map[uint64]bool) bool {
	for _, f := range framesOf(xs) {
		if frames[f] {
			return true
		}
	}
	return false
}

// decodeObjAccess reads a NodeObjAccess body.
func decodeObjAccess(body []byte) (*api.NodeObjAccess, error) {
	var m api.NodeObjAccess
	if err := api.Decode(body, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// objectOp executes the shared-object operations; ok is false for others.
func (c *conn) objectOp(r request) (ok bool, err error) {
	switch r.h.Op {
	case api.OpNodeExport:
		var m api.NodeExport
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		id, err := c.export(&m)
		if err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h, api.Encode(&api.NodeObject{Object: id}))
	case api.OpNodeImport:
		var m api.NodeObject
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		reply, err := c.importObject(&m)
		if err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h, api.Encode(reply))
	case api.OpNodeRevoke:
		var m api.NodeRevoke
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		if err := c.revoke(&m); err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h)
	case api.OpNodeObjRead, api.OpNodeObjWrite:
		m, err := decodeObjAccess(r.body)
		if err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		if r.h.Op == api.OpNodeObjRead {
			return true, c.readObject(r.h, m)
		}
		return true, c.writeObject(r.h, m)
	case api.OpNodePublish, api.OpNodePin:
		var m api.NodeObject
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		pub := c.publish
		if r.h.Op == api.OpNodePin {
			pub = c.pin
		}
		v, err := pub(&m)
		if err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h, api.Encode(&api.BufVersion{Version: v}))
	case api.OpNodeUnpin:
		var m api.NodeVersion
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		if err := c.unpin(&m); err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h)
	case api.OpNodeUnexport:
		var m api.NodeObject
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		o, err := c.object(m.Object, false)
		if err != nil {
			return true, err
		}
		mine := o.exporter == c
		o.mu.Unlock()
		if !mine {
			return true, fmt.Errorf("shared object %d: only its exporter may end it: %w", m.Object, api.ErrPermissionDenied)
		}
		c.node.endObjects(c, func(o *object) bool { return o.id == m.Object }, false)
		return true, c.c.Reply(r.h)
	case api.OpNodeRestore:
		var m api.NodeRestore
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		if err := c.restore(&m); err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h)
	case api.OpNodeRevokedAck:
		var m api.NodeRevoke
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		if err := c.revokedAck(&m); err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h)
	case api.OpNodeInvalAck:
		var m api.NodeInval
		if err := api.Decode(r.body, &m); err != nil {
			return true, fmt.Errorf("%v: %w", r.h.Op, err)
		}
		if err := c.invalAck(&m); err != nil {
			return true, err
		}
		return true, c.c.Reply(r.h)
	}
	return false, nil
}
