package api

import (
	"github.com/vgpu/vgpu/api/wire"
)

// The node's wire: a mediator to a node over TCP (TLS optional) —
// frames of device memory, access to them, copies and launches. Addresses
// are physical device addresses, extents of the connection's own frames.
// Its batching and deduplication, shared objects, graphs and status are
// node_datapath.go, node_shared.go, node_graph.go and node_status.go.

func putExtents(e *wire.Encoder, xs []Extent) {
	e.U32(uint32(len(xs)))
	for _, x := range xs {
		e.U64(x.Addr)
		e.U64(x.Len)
	}
}

func getExtents(d *wire.Decoder) []Extent {
	xs := make([]Extent, d.Len(16))
	for i := range xs {
		xs[i] = Extent{Addr: d.U64(), Len: d.U64()}
	}
	return xs
}

// NodeAlloc asks a node for Count frames on Device for the connection's tenant.
//
//vgpu:wire
type NodeAlloc struct {
	Device uint32
	Count  uint32
}

// NodeFrames lists frames by physical address: granted, or to be freed.
//
//vgpu:wire
type NodeFrames struct {
	Device uint32
	Frames []uint64
}

// NodeAttach asks a node to keep a connection's frames through its drop
// (Owner 0), or to hand over those it kept of connection Owner (the
// HelloReply.Session that connection had), whose Token this must be.
//
// GraceMillis, an optional trailing field (HasGrace), asks the node to keep
// the frames at most that many milliseconds after a drop, if that is
// shorter than its own reattach grace: a mediator with no journal, which
// cannot reclaim them after its own restart, asks only for long enough to
// outlast a network blip. A reclaim states it again for the connection
// going on.
//
//vgpu:wire
type NodeAttach struct {
	Owner       uint64
	Token       string `wire:"max=MaxToken"`
	HasGrace    bool   `wire:"-"`
	GraceMillis uint32 `wire:"if=HasGrace"`
}

// NodeAttached answers NodeAttach: the connection's id as the node knows
// it (an Owner to reclaim later), and, for a reclaim, the frames it now
// holds on each device.
//
//vgpu:wire
type NodeAttached struct {
	Owner   uint64
	Devices []NodeFrames
}

// NodeAccess names physical memory to write (payload follows), read or fill.
//
//vgpu:wire
type NodeAccess struct {
	Device  uint32
	Extents []Extent
	Value   uint8  // fill only
	Payload []byte `wire:"rest"` // write only: the rest of the body
}

// NodeCopy copies between physical runs of one device; totals must match.
//
//vgpu:wire
type NodeCopy struct {
	Device   uint32
	Dst, Src []Extent
}

// NodeArg is a kernel argument as a node sees it: a scalar, or a buffer given
// as the physical runs that back it, in order.
//
//vgpu:wire custom min=5
type NodeArg struct {
	Kind    ArgKind
	Bits    uint64
	Extents []Extent
}

// A NodeArg's fields on the wire depend on its kind: a buffer's extents,
// or a scalar's bits.
func (a *NodeArg) marshalWire(e *wire.Encoder) {
	e.U8(uint8(a.Kind))
	if a.Kind == ArgBuffer {
		putExtents(e, a.Extents)
	} else {
		e.U64(a.Bits)
	}
}

func (a *NodeArg) unmarshalWire(d *wire.Decoder) {
	a.Kind = ArgKind(d.U8())
	if a.Kind == ArgBuffer {
		a.Extents = getExtents(d)
	} else {
		a.Bits = d.U64()
	}
}

// NodeLaunch runs a kernel on a device of the node.
//
//vgpu:wire
type NodeLaunch struct {
	Device uint32
	Kernel string
	Args   []NodeArg
}
