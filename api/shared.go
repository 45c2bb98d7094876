package api

import "fmt"

// Messages of shared buffers: a tenant exports a buffer with grants to
// named tenants, others import it, possibly through other mediators, and
// every mediator keeps host-side copies of its pages, kept coherent by the
// buffer's home node according to the buffer's mode (coherence/).

// Mode is what a shared buffer promises its readers, chosen at export.
type Mode uint8

// Modes.
const (
	// ModePrivate: one mediator only, never shared: no protocol traffic.
	ModePrivate Mode = iota
	// ModeImmutable: sealed; cached anywhere forever, no coherence messages,
	// writes refused.
	ModeImmutable
	// ModeVersioned: writers publish versions, readers pin one and see it
	// unchanged; no invalidations.
	ModeVersioned
	// ModeCoherent: linearizable reads and writes at page granularity
	// across all mediators.
	ModeCoherent
	modeEnd
)

var modeNames = [...]string{"private", "immutable", "versioned", "coherent"}

func (m Mode) String() string {
	if m < modeEnd {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// Valid says whether m is a known mode.
func (m Mode) Valid() bool { return m < modeEnd }

// MaxGrants bounds the grants of one export. A node keeps them for the
// object's life, and a list as long as the wire allows (MaxList) would
// cost it some 3.5 MiB an object: mediators and nodes both refuse more.
const MaxGrants = 64

// Grant lets Tenant import a shared buffer, to read it, and to write it if
// Write.
type Grant struct {
	Tenant string
	Write  bool
}

func putGrants(e *Encoder, gs []Grant) {
	e.U32(uint32(len(gs)))
	for _, g := range gs {
		e.String(g.Tenant)
		e.Bool(g.Write)
	}
}

func getGrants(d *Decoder) []Grant {
	gs := make([]Grant, d.Len(5))
	for i := range gs {
		gs[i] = Grant{Tenant: d.Str(), Write: d.Bool()}
	}
	return gs
}

// Export shares the allocation at Addr (OpExport → Shared).
type Export struct {
	Addr   uint64
	Mode   Mode
	Grants []Grant
}

func (m *Export) Marshal(e *Encoder) { e.U64(m.Addr); e.U8(uint8(m.Mode)); putGrants(e, m.Grants) }
func (m *Export) Unmarshal(d *Decoder) {
	m.Addr = d.U64()
	m.Mode = Mode(d.U8())
	m.Grants = getGrants(d)
}

// Shared names a shared buffer: its home node and its id there. An
// exporter gets one and hands it to importers by any means; it grants
// nothing by itself.
type Shared struct {
	Node   string
	Object uint64
}

func (m *Shared) Marshal(e *Encoder)   { e.String(m.Node); e.U64(m.Object) }
func (m *Shared) Unmarshal(d *Decoder) { m.Node = d.Str(); m.Object = d.U64() }

// ImportReply is an imported buffer: its address in the importer's space,
// its size, its mode and whether the importer may write it.
type ImportReply struct {
	Addr  uint64
	Size  uint64
	Mode  Mode
	Write bool
}

func (m *ImportReply) Marshal(e *Encoder) {
	e.U64(m.Addr)
	e.U64(m.Size)
	e.U8(uint8(m.Mode))
	e.Bool(m.Write)
}
func (m *ImportReply) Unmarshal(d *Decoder) {
	m.Addr = d.U64()
	m.Size = d.U64()
	m.Mode = Mode(d.U8())
	m.Write = d.Bool()
}

// Revoke withdraws Tenant's grant to the buffer exported from Addr; its
// next access is refused with ErrPermissionDenied.
type Revoke struct {
	Addr   uint64
	Tenant string
}

func (m *Revoke) Marshal(e *Encoder)   { e.U64(m.Addr); e.String(m.Tenant) }
func (m *Revoke) Unmarshal(d *Decoder) { m.Addr = d.U64(); m.Tenant = d.Str() }

// NodeExport makes the memory at Extents of Device (the exporter's frames)
// a shared object (OpNodeExport → NodeObject).
type NodeExport struct {
	Device  uint32
	Extents []Extent
	Mode    Mode
	Grants  []Grant
}

func (m *NodeExport) Marshal(e *Encoder) {
	e.U32(m.Device)
	putExtents(e, m.Extents)
	e.U8(uint8(m.Mode))
	putGrants(e, m.Grants)
}

func (m *NodeExport) Unmarshal(d *Decoder) {
	m.Device = d.U32()
	m.Extents = getExtents(d)
	m.Mode = Mode(d.U8())
	m.Grants = getGrants(d)
}

// NodeObject names a shared object of a node (export reply, import
// request, unexport).
type NodeObject struct{ Object uint64 }

func (m *NodeObject) Marshal(e *Encoder)   { e.U64(m.Object) }
func (m *NodeObject) Unmarshal(d *Decoder) { m.Object = d.U64() }

// NodeImportReply describes an object to an importer: what it may do, the
// coherence page size and the read lease the node grants.
type NodeImportReply struct {
	Size     uint64
	Mode     Mode
	Write    bool
	PageSize uint32
	LeaseNs  int64
}

func (m *NodeImportReply) Marshal(e *Encoder) {
	e.U64(m.Size)
	e.U8(uint8(m.Mode))
	e.Bool(m.Write)
	e.U32(m.PageSize)
	e.I64(m.LeaseNs)
}

func (m *NodeImportReply) Unmarshal(d *Decoder) {
	m.Size = d.U64()
	m.Mode = Mode(d.U8())
	m.Write = d.Bool()
	m.PageSize = d.U32()
	m.LeaseNs = d.I64()
}

// NodeRevoke withdraws a tenant's grant to an object (its exporter only).
// In a push (OpNodeRevoked) Seq names the revocation, and the
// acknowledgement echoes the push, so a late one ends no other revocation's
// wait; requests leave it 0.
type NodeRevoke struct {
	Object uint64
	Tenant string
	Seq    uint64
}

func (m *NodeRevoke) Marshal(e *Encoder) { e.U64(m.Object); e.String(m.Tenant); e.U64(m.Seq) }
func (m *NodeRevoke) Unmarshal(d *Decoder) {
	m.Object = d.U64()
	m.Tenant = d.Str()
	m.Seq = d.U64()
}

// NodeObjAccess reads Len bytes of an object at Off, within one coherence
// page (the reply is a NodeGrant and the bytes), or writes Payload there
// (Len unused; the reply is a NodeGrant). A read of a versioned object
// names the pinned Version it reads.
type NodeObjAccess struct {
	Object  uint64
	Version uint64
	Off     uint64
	Len     uint64
	Payload []byte
}

func (m *NodeObjAccess) Marshal(e *Encoder) {
	e.U64(m.Object)
	e.U64(m.Version)
	e.U64(m.Off)
	e.U64(m.Len)
	e.B = append(e.B, m.Payload...)
}

func (m *NodeObjAccess) Unmarshal(d *Decoder) {
	m.Object = d.U64()
	m.Version = d.U64()
	m.Off = d.U64()
	m.Len = d.U64()
	m.Payload = d.Rest()
}

// BufVersion is a version of a versioned shared buffer: the reply to a
// publish or a pin.
type BufVersion struct{ Version uint64 }

func (m *BufVersion) Marshal(e *Encoder)   { e.U64(m.Version) }
func (m *BufVersion) Unmarshal(d *Decoder) { m.Version = d.U64() }

// NodeVersion names a version of a versioned object: what OpNodeUnpin
// releases.
type NodeVersion struct {
	Object  uint64
	Version uint64
}

func (m *NodeVersion) Marshal(e *Encoder)   { e.U64(m.Object); e.U64(m.Version) }
func (m *NodeVersion) Unmarshal(d *Decoder) { m.Object = d.U64(); m.Version = d.U64() }

// At names a shared buffer by an address of the session's (publish, pin).
type At struct{ Addr uint64 }

func (m *At) Marshal(e *Encoder)   { e.U64(m.Addr) }
func (m *At) Unmarshal(d *Decoder) { m.Addr = d.U64() }

// NodeGrant heads the reply to a read of a page (the page's bytes follow)
// and is the whole reply to a write of one: the page's version, and for a
// read how long the reader may keep a copy, counted from when it sent the
// read (coherence.ReadGrant), and whether the object is sealed.
type NodeGrant struct {
	Version uint64
	LeaseNs int64
	Sealed  bool
}

// NodeGrantSize is the length of a NodeGrant on the wire.
const NodeGrantSize = 17

func (m *NodeGrant) Marshal(e *Encoder) { e.U64(m.Version); e.I64(m.LeaseNs); e.Bool(m.Sealed) }
func (m *NodeGrant) Unmarshal(d *Decoder) {
	m.Version = d.U64()
	m.LeaseNs = d.I64()
	m.Sealed = d.Bool()
}

// NodeInval invalidates a reader's copy of a page older than Version
// (pushed by the node, FlagPush) and acknowledges that (sent back by the
// mediator, OpNodeInvalAck).
type NodeInval struct {
	Object  uint64
	Page    uint32
	Version uint64
}

func (m *NodeInval) Marshal(e *Encoder)   { e.U64(m.Object); e.U32(m.Page); e.U64(m.Version) }
func (m *NodeInval) Unmarshal(d *Decoder) { m.Object = d.U64(); m.Page = d.U32(); m.Version = d.U64() }
