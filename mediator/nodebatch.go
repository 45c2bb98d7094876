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

// Limits of gathering: bodies larger than gatherItem go alone, and a node
// batch is sent once it holds gatherBytes.
const (
	gatherItem  = 8 << 10
	gatherBytes = 256 << 10
)

func gatherable(op api.Op, parts [][]byte) bool {
	switch op {
	case api.OpNodeLaunch, api.OpNodeFill, api.OpNodeCopy, api.OpNodeWrite:
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
}

// cmdHeader is the op and length before each command in body.
const cmdHeader = 6

// add gathers a call. Its parts are copied: the caller may reuse them once
// add returns.
func (b *nodeBatch) add(c *completion, v vdev, idx int, op api.Op, parts [][]byte) {
	if len(b.idx) > 0 && (b.c != c || b.v.rpc != v.rpc) {
		b.flush()
	}
	if len(b.idx) == 0 {
		b.c, b.v = c, v
		if b.body == nil {
			b.body = make([]byte, 0, gatherBytes+gatherItem+64)
		}
	}
	n := 0
	for _, p := range parts {
		n += len(p)
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

// flush sends what is gathered: one call alone, several as a node batch.
func (b *nodeBatch) flush() {
	if len(b.idx) == 0 {
		return
	}
	c, v, ops := b.c, b.v, b.ops
	idx := slices.Clone(b.idx) // the continuation keeps it; b's is reused
	ops = slices.Clone(ops)
	if len(idx) == 1 {
		c.send(v.rpc, ops[0], nil, func(call *api.Call) {
			if call.Err != nil {
				c.fail(idx[0], ops[0], call.Err)
			}
		}, b.body[cmdHeader:]) // the one command's body, after its header
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
	*b = nodeBatch{body: b.body[:0], idx: b.idx[:0], ops: b.ops[:0]}
}
