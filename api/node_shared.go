package api

// The node's side of shared buffers: the home of a shared object keeps its
// directory and serialises its writers (coherence/); mediators read and
// write it, hold leases, and are told of invalidations (FlagPush).

// NodeExport makes the memory at Extents of Device (the exporter's frames)
// a shared object (OpNodeExport → NodeObject).
//
//vgpu:wire
type NodeExport struct {
	Device  uint32
	Extents []Extent
	Mode    Mode
	Grants  []Grant
}

// NodeObject names a shared object of a node (export reply, import
// request, unexport).
//
//vgpu:wire
type NodeObject struct{ Object uint64 }

// NodeImportReply describes an object to an importer: what it may do, the
// coherence page size and the read lease the node grants. Exporter, an
// optional trailing field (HasExporter), is the tenant that exported it,
// which an importer checks again when it imports an object restored after
// the node restarted (NodeRestore), so that no other tenant can pass its
// own bytes off under the object's id.
//
//vgpu:wire
type NodeImportReply struct {
	Size        uint64
	Mode        Mode
	Write       bool
	PageSize    uint32
	LeaseNs     int64
	HasExporter bool   `wire:"-"`
	Exporter    string `wire:"if=HasExporter"`
}

// NodeRestore makes a versioned object again, on a node that restarted and
// forgot it, from a copy of one of its published versions that its
// exporter's mediator held: the same Object id, published at Version, of
// Size bytes, with Grants (OpNodeRestore). The bytes come in pieces,
// Payload at Off, in order from 0; the object exists once the last piece
// (ending at Size) has arrived. The restoring connection is its exporter.
// It holds that version only: it has no draft, so it takes no writes and
// no publish.
//
//vgpu:wire
type NodeRestore struct {
	Object  uint64
	Version uint64
	Size    uint64
	Grants  []Grant
	Off     uint64
	Payload []byte `wire:"rest"`
}

// NodeRevoke withdraws a tenant's grant to an object (its exporter only).
// In a push (OpNodeRevoked) Seq names the revocation, and the
// acknowledgement echoes the push, so a late one ends no other revocation's
// wait; requests leave it 0.
//
//vgpu:wire
type NodeRevoke struct {
	Object uint64
	Tenant string
	Seq    uint64
}

// NodeObjAccess reads Len bytes of an object at Off, within one coherence
// page (the reply is a NodeGrant and the bytes), or writes Payload there
// (Len unused; the reply is a NodeGrant). A read of a versioned object
// names the pinned Version it reads.
//
//vgpu:wire
type NodeObjAccess struct {
	Object  uint64
	Version uint64
	Off     uint64
	Len     uint64
	Payload []byte `wire:"rest"`
}

// NodeVersion names a version of a versioned object: what OpNodeUnpin
// releases.
//
//vgpu:wire
type NodeVersion struct {
	Object  uint64
	Version uint64
}

// NodeGrant heads the reply to a read of a page (the page's bytes follow)
// and is the whole reply to a write of one: the page's version, and for a
// read how long the reader may keep a copy, counted from when it sent the
// read (coherence.ReadGrant), and whether the object is sealed.
//
//vgpu:wire
type NodeGrant struct {
	Version uint64
	LeaseNs int64
	Sealed  bool
}

// NodeGrantSize is the length of a NodeGrant on the wire.
const NodeGrantSize = 17

// NodeInval invalidates a reader's copy of a page older than Version
// (pushed by the node, FlagPush) and acknowledges that (sent back by the
// mediator, OpNodeInvalAck).
//
//vgpu:wire
type NodeInval struct {
	Object  uint64
	Page    uint32
	Version uint64
}
