package api

// The tenant's side of shared buffers: a tenant exports a buffer with
// grants to named tenants, others import it, possibly through other
// mediators, and every mediator keeps host-side copies of its pages, kept
// coherent by the buffer's home node according to the buffer's mode
// (coherence/; the node's side is node_shared.go).

// Export shares the allocation at Addr (OpExport → Shared).
//
//vgpu:wire
type Export struct {
	Addr   uint64
	Mode   Mode
	Grants []Grant
}

// Shared names a shared buffer: its home node and its id there. An
// exporter gets one and hands it to importers by any means; it grants
// nothing by itself.
//
//vgpu:wire
type Shared struct {
	Node   string
	Object uint64
}

// ImportReply is an imported buffer: its address in the importer's space,
// its size, its mode and whether the importer may write it.
//
//vgpu:wire
type ImportReply struct {
	Addr  uint64
	Size  uint64
	Mode  Mode
	Write bool
}

// Revoke withdraws Tenant's grant to the buffer exported from Addr; its
// next access is refused with ErrPermissionDenied.
//
//vgpu:wire
type Revoke struct {
	Addr   uint64
	Tenant string
}

// At names a shared buffer by an address of the session's (publish, pin).
//
//vgpu:wire
type At struct{ Addr uint64 }
