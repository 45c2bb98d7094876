package api

// The node's data path: sealing frames of weights and deduplicating their
// contents.

// NodeDedup asks a node to fill each frame-sized run in Dst (one run per
// hash) with the contents of a sealed frame of that SHA-256 hash, if it
// holds one. The reply says which it filled; the mediator sends the others.
//
//vgpu:wire
type NodeDedup struct {
	Device uint32
	Dst    []Extent
	Hashes [][32]byte
}

// NodeDedupReply says, for each run of a NodeDedup, whether it was filled.
//
//vgpu:wire
type NodeDedupReply struct{ Hit []bool }

// NodeSealReply answers an OpNodeSeal: for each frame of the request,
// whether the node stores it once, that is, whether it maps the memory of
// an identical sealed frame that a connection of another tenant holds
// (an alias made by a NodeDedup). Decided when the frame is sealed; sealed
// frames never change.
//
//vgpu:wire
type NodeSealReply struct{ StoredOnce []bool }
