package mediator

import (
	"encoding/binary"
	"slices"

	"github.com/vgpu/vgpu/api"
)

// Node batches: the node calls of a tenant's batch that carry small bodies
// and expect empty replies (launches, fills, device copies, small writes)
// go to the node as one api.OpNodeBatch per run of calls to the same
// connection, which the node executes in order and answers once. A tenant
// batch of a thousand launches so costs the network one frame each way, not
// a thousand. The node names its first failing command; the failure is
// charged to the tenant command that issued it.
//
// Larger writes are merged instead: a run of them to one device becomes
// one api.OpNodeWrite of all their extents, up to api.MaxChunk of payload,
// whose payloads are not copied but written with the request in one
// vectored write (wire.Conn). A tenant batch of 64 KiB copies so costs the
// node one request per MiB, as a copy of 1 MiB does, not one per copy. The
// node checks every extent of a write before it writes any; a merged write
// it refuses is charged to the first command of the run.

// Limits of gathering: bodies larger than gatherItem go alone, and a node
// batch is sent once it holds gatherBytes.
const (
	gatherItem  = 8 << 10
	gatherBytes = 256 << 10
)

// mergeExtents bounds the extents of a merged write, so that its fields
// stay small beside the payload.
const mergeExtents = 256

func gatherable(op api.Op, parts [][]byte) bool {
	switch op {
	case api.OpNodeWrite:
		return true // merged if large (writeRun)
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
	body []byte   // commands, each as api.Batch encodes them
	idx  []int    // the tenant command of each
	ops  []api.Op // and its node operation
	w    writeRun // large writes being merged; empty while body holds commands
}

// writeRun is large writes of one completion to one device, to be sent as
// one: their fields (api.NodeAccess without payload) and payloads, not
// copied.
type writeRun struct {
	c      *completion
	v      vdev
	idx    int // the tenant command of the first
	access api.NodeAccess
	first  []byte   // the first write's fields as its caller encoded them
	parts  [][]byte // the payloads in order, after a slot for the fields
	n      int      // payload bytes
}

// cmdHeader is the op and length before each command in body.
const cmdHeader = 6

// add gathers a call. Its parts are copied, except a large write's
// payload, which must stay unchanged until the stream flushes (a host
// region's mapping, or the tenant request's body, which the stream keeps
// until the command is issued); the caller may reuse the rest once add
// returns.
func (b *nodeBatch) add(c *completion, v vdev, idx int, op api.Op, parts [][]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if op == api.OpNodeWrite && n > gatherItem {
		b.merge(c, v, idx, parts)
		return
	}
	b.flushWrites() // sent first: it came first
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

// merge adds a large write to the run, sending the run first when the
// write cannot join it: another completion, connection or device, or past
// api.MaxChunk of payload or mergeExtents extents. parts are the write's
// fields and its payload, as writeChunk and issueLocked make them.
func (b *nodeBatch) merge(c *completion, v vdev, idx int, parts [][]byte) {
	b.flushCommands() // sent first: they came first
	var at api.NodeAccess
	if len(parts) != 2 || api.Decode(parts[0], &at) != nil || len(at.Payload) != 0 || len(parts[1]) > api.MaxChunk {
		// Not a write this file knows how to merge: alone, as it came.
		b.flushWrites()
		c.send(v.rpc, api.OpNodeWrite, nil, c.failsAs(idx, api.OpNodeWrite), parts...)
		return
	}
	w := &b.w
	if len(w.parts) > 0 && (w.c != c || w.v.rpc != v.rpc || w.access.Device != at.Device ||
		w.n+len(parts[1]) > api.MaxChunk || len(w.access.Extents)+len(at.Extents) > mergeExtents) {
		b.flushWrites()
	}
	if len(w.parts) == 0 {
		w.c, w.v, w.idx, w.first = c, v, idx, parts[0]
		w.access = api.NodeAccess{Device: at.Device, Extents: w.access.Extents[:0]}
		w.parts = append(w.parts[:0], nil) // the fields' slot
	}
	w.access.Extents = append(w.access.Extents, at.Extents...)
	w.parts = append(w.parts, parts[1])
	w.n += len(parts[1])
}

// flush sends what is gathered or merged.
func (b *nodeBatch) flush() {
	b.flushWrites()
	b.flushCommands()
}

// flushWrites sends the run of large writes as one write.
func (b *nodeBatch) flushWrites() {
	w := &b.w
	if len(w.parts) == 0 {
		return
	}
	if len(w.parts) == 2 {
		w.parts[0] = w.first // alone: its fields as they came
	} else {
		w.parts[0] = api.Encode(&w.access)
	}
	w.c.send(w.v.rpc, api.OpNodeWrite, nil, w.c.failsAs(w.idx, api.OpNodeWrite), w.parts...)
	// send has written the parts out (wire.Conn writes a frame before it
	// returns); drop them, keep the slices' room.
	clear(w.parts)
	*w = writeRun{access: api.NodeAccess{Extents: w.access.Extents[:0]}, parts: w.parts[:0]}
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
		var hdr api.Encoder
		hdr.U32(0)
		hdr.U32(uint32(len(idx)))
		c.send(v.rpc, api.OpNodeBatch, nil, func(call *api.Call) {
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
func (c *completion) failsAs(idx int, op api.Op) func(*api.Call) {
	return func(call *api.Call) {
		if call.Err != nil {
			c.fail(idx, op, call.Err)
		}
	}
}
