package accelerator

// Versioned objects restored after this node restarted (api.OpNodeRestore).
// A node that restarts forgets its objects, but the mediator of a
// versioned object's exporter may hold a copy of a published version: it
// sends it back, in pieces, under the object's old id and version number,
// so that importers, who know the object by (node, id), import it again
// and find the version they pinned under the same key.
//
// Such an object has no frames: its draft was the exporter's device
// memory, which went with the restart. It serves imports, pins and reads
// of its one version, and refuses writes and publishes (ErrUnavailable,
// saying why); it ends when its exporter (the restoring connection, or
// one that reclaims it) unexports it or ends, and then its importers are
// told, as for any object.
//
// Invariants:
//   - A restore gives no tenant more than the restorer could give: the
//     restorer becomes the exporter, with the grants it sends, and an
//     importer checks the exporting tenant the node names
//     (api.NodeImportReply.Exporter) against the one it imported from, so
//     another tenant cannot pass its bytes off under a known id. An id
//     that is live (or still ending) is refused.
//   - A restored version's bytes are host memory that no tenant's quota
//     counts, as the versions kept for readers are: a connection begins
//     no restore that would take what it has restored, or is restoring,
//     past MaxRestoreBytes (one that reclaimed others' restored objects
//     may hold more, and then restores nothing more), and its
//     restored objects count towards MaxObjects.
//
// connObjects.pending and .restored are guarded by objectTable.mu, as the
// rest of connObjects.

import (
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/coherence"
)

// MaxRestoreBytes bounds the bytes of the objects one connection has
// restored, live or arriving. A variable only so tests can lower it.
var MaxRestoreBytes uint64 = 1 << 30

// restoring is an object whose pieces are arriving.
type restoring struct {
	api.NodeRestore // without its payload
	buf             []byte
}

// restore takes one piece of a restored object (api.NodeRestore), and
// makes the object once the last piece is in.
func (c *conn) restore(m *api.NodeRestore) error {
	t := c.node.objects
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.objectsOf(c)
	defer t.tidy(c)
	p := r.pending
	if m.Off == 0 {
		r.dropPending()
		if err := c.checkRestore(m, r); err != nil {
			return err
		}
		p = &restoring{NodeRestore: *m, buf: make([]byte, 0, m.Size)}
		p.Payload = nil
		r.pending, r.restored = p, r.restored+m.Size
	} else if p == nil || p.Object != m.Object || m.Off != uint64(len(p.buf)) {
		r.dropPending()
		return fmt.Errorf("restore of shared object %d: a piece at offset %d, not the next one of an object being restored: %w", m.Object, m.Off, api.ErrInvalidArgument)
	}
	if uint64(len(m.Payload)) > p.Size-uint64(len(p.buf)) {
		r.dropPending()
		return fmt.Errorf("restore of shared object %d: %d bytes at offset %d run past its %d: %w", m.Object, len(m.Payload), m.Off, p.Size, api.ErrInvalidArgument)
	}
	p.buf = append(p.buf, m.Payload...)
	if uint64(len(p.buf)) < p.Size {
		return nil
	}
	r.pending = nil
	if t.byID[p.Object] != nil || t.ending[p.Object] != nil {
		r.restored -= p.Size
		return fmt.Errorf("restore of shared object %d: an object of that id is live on this node: %w", p.Object, api.ErrInvalidArgument)
	}
	pages := (p.Size + PageSize - 1) / PageSize
	home, err := coherence.NewHome(coherence.HomeConfig{Mode: api.ModeVersioned, Pages: uint32(pages), Lease: ReadLease, Published: p.Version})
	if err != nil {
		r.restored -= p.Size
		return err
	}
	o := &object{id: p.Object, exporter: c, size: p.Size, grants: map[string]bool{}, home: home,
		readers: map[coherence.CacheID]*conn{}, importers: map[coherence.CacheID]*conn{}, data: map[coherence.WriteID]*objWrite{},
		users: map[*conn]bool{}, versions: map[uint64][]byte{p.Version: p.buf}}
	o.changed = sync.NewCond(&o.mu)
	for _, g := range p.Grants {
		o.grants[g.Tenant] = g.Write
	}
	t.byID[o.id] = o
	r.exported[o.id] = o
	c.exports++
	return nil
}

// checkRestore says why the restore m begins may not, or nil. The caller
// holds objectTable.mu.
func (c *conn) checkRestore(m *api.NodeRestore, r *connObjects) error {
	switch {
	case m.Object == 0 || m.Version == 0 || m.Size == 0:
		return fmt.Errorf("restore of shared object %d, version %d, of %d bytes: want all three > 0: %w", m.Object, m.Version, m.Size, api.ErrInvalidArgument)
	case m.Size/PageSize >= 1<<32:
		return fmt.Errorf("restore of shared object %d of %d bytes: too many pages: %w", m.Object, m.Size, api.ErrInvalidArgument)
	case len(m.Grants) > api.MaxGrants:
		return fmt.Errorf("restore of shared object %d with %d grants: at most %d: %w", m.Object, len(m.Grants), api.MaxGrants, api.ErrInvalidArgument)
	case c.exports >= MaxObjects:
		return fmt.Errorf("restore of shared object %d: this connection has %d shared objects, the limit: %w", m.Object, MaxObjects, api.ErrQuotaExceeded)
	case m.Size > MaxRestoreBytes || r.restored > MaxRestoreBytes-m.Size: // restored may pass the bound (adopt)
		return fmt.Errorf("restore of shared object %d of %d bytes: this connection's restored objects have %d, and at most %d: %w",
			m.Object, m.Size, r.restored, MaxRestoreBytes, api.ErrQuotaExceeded)
	}
	return nil
}

// dropPending forgets the object being restored, if any. The caller holds
// objectTable.mu.
func (r *connObjects) dropPending() {
	if r.pending != nil {
		r.restored -= r.pending.Size
		r.pending = nil
	}
}

// noDraft says why o takes no writes nor publishes, if it is a restored
// object, or nil. The caller holds o.mu.
func (o *object) noDraft() error {
	if o.dev != nil {
		return nil
	}
	return fmt.Errorf("shared object %d was restored after its node restarted, as its published version only: its draft was its exporter's device memory, lost with the restart, so it takes no writes and no publish (export the buffer anew): %w",
		o.id, api.ErrUnavailable)
}
