package mediator

import (
	"encoding/binary"
	"slices"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Node batches: the node calls of a tenant's batch that carry small bodies
// and expect empty replies (launches, fills, device copies, small writes)
// go to the node as one api.OpNodeBatch per run of calls to the same
// connection, which the node executes in order and answers once. A tenant
// batch of a thousand launches so costs the network one frame each way, not
// a thousand. The node names its first failing command; the failure is
// charged to the tenant command that issued it.
//
// Larger writes, and reads into host memory, are merged instead: a run of
// them to one device becomes one api.OpNodeWrite (api.OpNodeRead) of all
// their extents, up to wire.MaxChunk of payload. A merged write's payloads
// are not copied but written with the request in one vectored write
// (wire.Conn); a merged read's reply is read straight into each read's
// destination in turn (wire.RPC.GoThenScatter). A tenant batch of 64 KiB
// copies so costs the node one request per MiB, as a copy of 1 MiB does,
// not one per copy. The node checks every extent of a request before it
// touches any; a merged request it refuses is charged to the first command
// of the run.

// Limits of gathering: bodies larger than gatherItem go alone, and a node
// batch is sent once it holds gatherBytes.
const (
	gatherItem  = 8 << 10
	gatherBytes = 256 << 10
)

// mergeExtents bounds the extents of a merged write, so that its fields
// stay small beside the payload.
const mergeExtents = 256

func gatherable(op wire.Op, parts [][]byte) bool {
	switch op {
	case api.OpNodeWrite:
		return true // merged if large (run)
	case api.OpNodeLaunch, api.OpNodeFill, api.OpNodeCopy:
	default:
		return false
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	return n <= gatherItem
}

// nodeBatch is what a stream has gathered and not sent: calls of one
// completion to one node connection. Only the stream's issuer touches it.
type nodeBatch struct {
	c    *completion
	v    vdev
	body []byte    // commands, each as api.Batch encodes them
	idx  []int     // the tenant command of each
	ops  []wire.Op // and its node operation
	w    run       // large writes or reads being merged; empty while body holds commands
}

// run is large writes, or reads, of one completion to one device, to be
// sent as one: their fields (api.NodeAccess without payload) merged, and
// their payloads or destinations, not copied.
type run struct {
	c      *completion
	v      vdev
	op     wire.Op // api.OpNodeWrite or api.OpNodeRead
	idx    int     // the tenant command of the first
	calls  int
	access api.NodeAccess
	first  []byte   // the first call's fields as its caller encoded them
	parts  [][]byte // writes: the payloads in order, after a slot for the fields
	into   [][]byte // reads: the destinations in order
	n      int      // payload bytes
}

// cmdHeader is the op and length before each command in body.
const cmdHeader = 6

// add gathers a call. Its parts are copied, except a large write's
// payload, which must stay unchanged until the stream flushes (a host
// region's mapping, or the tenant request's body, which the stream keeps
// until the command is issued); the caller may reuse the rest once add
// returns.
func (b *nodeBatch) add(c *completion, v vdev, idx int, op wire.Op, parts [][]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if op == api.OpNodeWrite && n > gatherItem {
		b.merge(c, v, idx, op, nil, parts)
		return
	}
	b.flushRun() // sent first: it came first
	if len(b.idx) > 0 && (b.c != c || b.v.rpc != v.rpc) {
		b.flush()
	}
	if len(b.idx) == 0 {
		b.c, b.v = c, v
		if b.body == nil {
			b.body = make([]byte, 0, gatherBytes+gatherItem+64)
		}
	}
	b.body = binary.LittleEndian.AppendUint16(b.body, uint16(op))
	b.body = binary.LittleEndian.AppendUint32(b.body, uint32(n))
	for _, p := range parts {
		b.body = append(b.body, p...)
	}
	b.idx = append(b.idx, idx)
	b.ops = append(b.ops, op)
	if len(b.body) >= gatherBytes {
		b.flush()
	}
}

// addRead merges a read into host memory at into (which must stay
// untouched until the read completes, as the tenant's shared memory does)
// into the run of reads.
func (b *nodeBatch) addRead(c *completion, v vdev, idx int, into []byte, parts [][]byte) {
	b.merge(c, v, idx, api.OpNodeRead, into, parts)
}

// merge adds a large write (parts: its fields and payload) or a read
// (into, and parts: its fields) to the run, sending the run first when
// the call cannot join it: another completion, connection, device or
// operation, or past wire.MaxChunk of payload or mergeExtents extents.
func (b *nodeBatch) merge(c *completion, v vdev, idx int, op wire.Op, into []byte, parts [][]byte) {
	b.flushCommands() // sent first: they came first
	var at api.NodeAccess
	n, fields := len(into), 1
	if op == api.OpNodeWrite {
		n, fields = len(parts[len(parts)-1]), 2
	}
	if len(parts) != fields || api.Decode(parts[0], &at) != nil || len(at.Payload) != 0 || n > wire.MaxChunk {
		// Not a call this file knows how to merge: alone, as it came.
		b.flushRun()
		c.send(v.rpc, op, into, c.failsAs(idx, op), parts...)
		return
	}
	w := &b.w
	if w.calls > 0 && (w.c != c || w.v.rpc != v.rpc || w.op != op || w.access.Device != at.Device ||
		w.n+n > wire.MaxChunk || len(w.access.Extents)+len(at.Extents) > mergeExtents) {
		b.flushRun()
	}
	if w.calls == 0 {
		w.c, w.v, w.op, w.idx, w.first = c, v, op, idx, parts[0]
		w.access = api.NodeAccess{Device: at.Device, Extents: w.access.Extents[:0]}
		w.parts = append(w.parts[:0], nil) // the fields' slot
		w.into = nil                       // the last run's belong to its call
	}
	w.calls++
	w.access.Extents = append(w.access.Extents, at.Extents...)
	if op == api.OpNodeWrite {
		w.parts = append(w.parts, parts[1])
	} else {
		w.into = append(w.into, into)
	}
	w.n += n
}

// flush sends what is gathered or merged.
func (b *nodeBatch) flush() {
	b.flushRun()
	b.flushCommands()
}

// flushRun sends the run of large writes or reads as one call.
func (b *nodeBatch) flushRun() {
	w := &b.w
	if w.calls == 0 {
		return
	}
	w.parts[0] = w.first // alone: its fields as they came
	if w.calls > 1 {
		w.parts[0] = api.Encode(&w.access)
	}
	check := w.c.failsAs(w.idx, w.op)
	switch {
	case w.op == api.OpNodeWrite:
		w.c.send(w.v.rpc, w.op, nil, check, w.parts...)
	case w.calls == 1:
		w.c.send(w.v.rpc, w.op, w.into[0], check, w.parts[0])
	default:
		w.c.sendScatter(w.v.rpc, w.op, w.into, check, w.parts[0])
	}
	// send has written the parts out (wire.Conn writes a frame before it
	// returns); drop them, keep the slices' room. The call keeps into.
	clear(w.parts)
	*w = run{access: api.NodeAccess{Extents: w.access.Extents[:0]}, parts: w.parts[:0]}
}

// sendScatter is send for a read whose reply is read into the pieces of
// into in turn.
func (c *completion) sendScatter(rpc *wire.RPC, op wire.Op, into [][]byte, check func(*wire.Call), parts ...[]byte) {
	rpc.GoThenScatter(op, into, c.track(check), parts...)
}

// flushCommands sends the gathered commands: one alone, several as a node
// batch.
func (b *nodeBatch) flushCommands() {
	if len(b.idx) == 0 {
		return
	}
	c, v, ops := b.c, b.v, b.ops
	idx := slices.Clone(b.idx) // the continuation keeps it; b's is reused
	ops = slices.Clone(ops)
	if len(idx) == 1 {
		c.send(v.rpc, ops[0], nil, c.failsAs(idx[0], ops[0]), b.body[cmdHeader:]) // the one command's body, after its header
	} else {
		var hdr wire.Encoder
		hdr.U32(0)
		hdr.U32(uint32(len(idx)))
		c.send(v.rpc, api.OpNodeBatch, nil, func(call *wire.Call) {
			if call.Err == nil {
				return
			}
			if i, err, ok := api.SplitBatchError(call.Err); ok && i < len(idx) {
				c.fail(idx[i], ops[i], err)
			} else {
				c.fail(idx[0], api.OpNodeBatch, call.Err)
			}
		}, hdr.B, b.body)
	}
	// The body's bytes were written out by send; its buffer is reused.
	*b = nodeBatch{body: b.body[:0], idx: b.idx[:0], ops: b.ops[:0], w: b.w}
}

// failsAs is a node call's check that charges its failure to command idx
// of c, as op.
func (c *completion) failsAs(idx int, op wire.Op) func(*wire.Call) {
	return func(call *wire.Call) {
		if call.Err != nil {
			c.fail(idx, op, call.Err)
		}
	}
}
