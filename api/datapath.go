package api

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/vgpu/vgpu/api/wire"
)

// Messages of the data path: host memory shared with the mediator, batches
// of stream commands, sealing, captured command sequences (graphs), and the
// node side of batching and deduplication.

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

// Cmd is one command of a Batch: an operation and its body, encoded as the
// operation's own request would be.
type Cmd struct {
	Op   wire.Op
	Body []byte
}

// Batch carries commands of one stream (or of a node connection) to be
// executed in order; it is answered once, when all of them have completed,
// with the first error any of them met (BatchError says which).
//
//vgpu:wire
type Batch struct {
	Stream uint32
	Cmds   []Cmd
}

// AppendCmd appends one command, encoded, to a batch body being built:
// Batch.Marshal's element format, without copying m through a Cmd.
func AppendCmd(b []byte, op wire.Op, m Message) []byte {
	e, at := BeginCmd(b, op)
	m.Marshal(&e)
	return EndCmd(e.B, at)
}

// BeginCmd and EndCmd are AppendCmd in two halves, for a caller that
// marshals a message of a type it knows between them: the call is direct
// then, and neither the message nor the encoder escapes to the heap (a
// tiny launch is queued without allocating). BeginCmd appends op and room
// for the length, which EndCmd fills in, given at.
func BeginCmd(b []byte, op wire.Op) (e wire.Encoder, at int) {
	e.B = b
	e.U16(uint16(op))
	at = len(e.B)
	e.U32(0)
	return e, at
}

// EndCmd: see BeginCmd.
func EndCmd(b []byte, at int) []byte {
	n := len(b) - at - 4
	b[at], b[at+1], b[at+2], b[at+3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
	return b
}

// BatchError is the failure of command Index of a batch.
type BatchError struct {
	Index int
	Op    wire.Op
	Err   error
}

func (e *BatchError) Error() string { return fmt.Sprintf("command %d (%v): %v", e.Index, e.Op, e.Err) }
func (e *BatchError) Unwrap() error { return e.Err }

// SplitBatchError takes apart the error reply to a batch, which crossed the
// wire as a RemoteError whose message BatchError.Error wrote: it returns the
// index of the failed command and its own error, with the same code.
func SplitBatchError(err error) (int, error, bool) {
	var re *RemoteError
	if !errors.As(err, &re) {
		return 0, nil, false
	}
	rest, ok := strings.CutPrefix(re.Msg, "command ")
	if !ok {
		return 0, nil, false
	}
	num, rest, ok := strings.Cut(rest, " (")
	if !ok {
		return 0, nil, false
	}
	i, perr := strconv.Atoi(num)
	_, msg, ok := strings.Cut(rest, "): ")
	if perr != nil || !ok || i < 0 {
		return 0, nil, false
	}
	return i, &RemoteError{Code: re.Code, Msg: msg}, true
}

// Seal makes the allocation at Addr immutable: later writes to it are
// refused, and its contents may be cached and deduplicated anywhere.
//
//vgpu:wire
type Seal struct{ Addr uint64 }

// Graph names a captured command sequence.
//
//vgpu:wire
type Graph struct{ Graph uint32 }

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
