package api

// The tenant's data path: host memory shared with the mediator, sealing,
// captured command sequences (graphs) and the session's counters. Batches
// (Batch), which the node's wire uses too, are in messages.go.

// HostRegister shares Size bytes of host memory with the mediator: the
// request is sent with a memfd (SCM_RIGHTS) that is at least Size long and
// sealed against shrinking. Copies then name the region and an offset, and
// their bytes never pass through the socket.
//
//vgpu:wire
type HostRegister struct{ Size uint64 }

// HostRegion names a registered host region.
//
//vgpu:wire
type HostRegion struct{ Region uint32 }

// CopyHost copies Len bytes between device address Addr and offset Off of
// host region Region; the op says which way.
//
//vgpu:wire
type CopyHost struct {
	Stream uint32
	Addr   uint64
	Region uint32
	Off    uint64
	Len    uint64
}

// Seal makes the allocation at Addr immutable: later writes to it are
// refused, and its contents may be cached and deduplicated anywhere.
//
//vgpu:wire
type Seal struct{ Addr uint64 }

// GraphLaunch replays a graph on a stream.
//
//vgpu:wire
type GraphLaunch struct {
	Stream uint32
	Graph  uint32
}

// SessionStats is what a session's work has cost so far, as its mediator
// counted it.
//
//vgpu:wire
type SessionStats struct {
	CopiedIn, CopiedOut uint64 // bytes copied to and from the device
	Launches            uint64
	NetOut, NetIn       uint64 // bytes of frames sent to and received from nodes
	// 2 MiB pieces of copies, and of weights faulted back in, that the
	// node filled from sealed frames it held, and the bytes they did not
	// send.
	DedupHits, DedupBytes uint64
	// Bytes of frames read from and written to the tenant's own socket:
	// bulk data through shared memory does not count here.
	SocketIn, SocketOut uint64
	// Pages of shared buffers read from the mediator's cache and from
	// their node.
	SharedHits, SharedMisses uint64
}
