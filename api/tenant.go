package api

import (
	"fmt"
)

// The tenant's wire: what a tenant program (client/, python/) asks its
// mediator over the Unix socket — device memory, streams, copies and
// launches. Addresses are tenant virtual addresses. Its data path, shared
// buffers and tensor graphs are in tenant_datapath.go, tenant_shared.go
// and tenant_graph.go; what the roles share, in messages.go.

// Malloc allocates Size bytes on virtual device Device, or, with
// MallocNear, on the device of the allocation that holds Near. Hint says
// what the buffer is for; with MallocFreeWithStream it is freed when Stream
// is destroyed.
//
//vgpu:wire
type Malloc struct {
	Device uint32
	Size   uint64
	Hint   Hint
	Flags  uint8
	Stream uint32
	Near   uint64
}

// Malloc flags.
const (
	MallocFreeWithStream uint8 = 1 << iota // freed when Stream is destroyed
	MallocNear                             // placed on Near's device, not Device
	mallocFlags          = MallocFreeWithStream | MallocNear
)

// Check refuses unknown hints and flags.
func (m *Malloc) Check() error {
	if !m.Hint.Valid() {
		return fmt.Errorf("malloc: %v is not a residency hint: %w", m.Hint, ErrInvalidArgument)
	}
	if m.Flags&^mallocFlags != 0 {
		return fmt.Errorf("malloc: unknown flags %#x: %w", m.Flags&^mallocFlags, ErrInvalidArgument)
	}
	return nil
}

// MallocReply returns the device virtual address of a new allocation.
//
//vgpu:wire
type MallocReply struct{ Addr uint64 }

// Free releases the allocation that starts at Addr.
//
//vgpu:wire
type Free struct{ Addr uint64 }

// DefaultStream exists in every session and cannot be destroyed.
const DefaultStream = 0

// StreamReq names a stream (destroy, synchronize); StreamReply returns one.
//
//vgpu:wire
type StreamReq struct{ Stream uint32 }

// CopyToDevice writes its payload at Dst. The payload is the rest of the body.
//
//vgpu:wire
type CopyToDevice struct {
	Stream  uint32
	Dst     uint64
	Payload []byte `wire:"rest"`
}

// CopyToDeviceHeader is the length of the fields in front of the payload.
const CopyToDeviceHeader = 12

// CopyFromDevice reads Len bytes at Src; the reply body is the bytes.
//
//vgpu:wire
type CopyFromDevice struct {
	Stream uint32
	Src    uint64
	Len    uint64
}

// CopyDevice copies Len bytes from Src to Dst, both device addresses.
//
//vgpu:wire
type CopyDevice struct {
	Stream   uint32
	Dst, Src uint64
	Len      uint64
}

// Memset sets Len bytes at Dst to Value.
//
//vgpu:wire
type Memset struct {
	Stream uint32
	Dst    uint64
	Value  uint8
	Len    uint64
}

// Launch runs Kernel with Args on the device that holds its buffers.
//
//vgpu:wire
type Launch struct {
	Stream uint32
	Kernel string
	Args   []Arg
}
