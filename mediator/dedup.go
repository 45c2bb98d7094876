package mediator

import (
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// Sealing and deduplication of weights.
//
// A sealed allocation is immutable: the space refuses writes to it
// (memory.Space.TranslateWrite). A sealed weight is also sealed on its node,
// frame by frame for the 2 MiB pieces it fills alone: the node hashes them
// (SHA-256, computed there, so no tenant can plant a false hash), makes
// them read-only and indexes them by content. When a tenant then copies
// model weights into an unsealed weight buffer, each whole 2 MiB piece of
// the copy is hashed here first and offered to the node, which fills the
// pieces it already holds from its own memory; only the others cross the
// network. A tenant learns only that contents it already has exist on the
// node.
//
// Charging for weights stored once. Where the node aliases such a piece to
// a sealed frame on the same device, it stores the contents once; the
// node's reply to the seal says which of the sealed frames are so stored
// with a frame another tenant holds (accelerator/content.go). A container's
// budget is then credited (1 − dedup_charge) of a frame, rounded down to
// whole bytes, for each of them (frameCredit), and the session records the
// credit on the allocation: freeing it, or the session's end, releases its
// footprint less the credit, so the budget never drifts (budget.go). Malloc
// charges the footprint in full; credit comes only with the seal, decided
// once, as sealed frames never change. A frame that stops being an alias
// later (its source is freed, and the node copies the bytes into it) keeps
// its credit: that is the trade-off the operator chooses with
// dedup_charge < 1. Host-socket sessions are always charged in full.

// seal seals an allocation once the work queued before is done.
func (s *session) seal(body []byte) error {
	var m api.Seal
	if err := api.Decode(body, &m); err != nil {
		return err
	}
	if err := s.checkUnheld("seal", m.Addr, false); err != nil {
		return err // a tensor graph's launches write it
	}
	s.drainAll()
	s.issueMu.Lock()
	defer s.issueMu.Unlock()
	_, sealed, _ := s.space.Hint(m.Addr)
	if err := s.space.Seal(m.Addr); err != nil {
		return fmt.Errorf("seal %#x: %w", m.Addr, err)
	}
	if !sealed {
		s.jr.add(journalOp{Op: opSeal, VA: m.Addr})
	}
	hint, _, err := s.space.Hint(m.Addr)
	if err != nil || hint != api.HintWeight || s.m.cfg.NoDedup {
		return err
	}
	dev, end, err := s.space.Span(m.Addr)
	if err != nil {
		return err
	}
	first, last := alignUp(m.Addr), end&^(memory.FrameSize-1)
	if last <= first {
		return nil // no whole frame to seal
	}
	// In one translation, so that the frames are resident together: one at
	// a time, a later one could evict an earlier chunk, and the list would
	// name a frame returned or reused since. The space keeps the sealed
	// frames from being reused: the node refuses to write them.
	ts, err := s.translateSealed(first, last-first)
	if errors.Is(err, api.ErrOutOfMemory) {
		// A weight larger than the session may keep resident (or than its
		// device holds now): sealed in the space, as asked, but not on the
		// node, so its frames are neither shared nor credited.
		s.log.WithError(err).Debug("weight sealed in the session only")
		return nil
	}
	if err != nil {
		return fmt.Errorf("seal %#x: %w", m.Addr, err)
	}
	var frames []uint64
	for _, x := range ts[0].Extents {
		for a := x.Addr; a < x.Addr+x.Len; a += memory.FrameSize {
			frames = append(frames, a)
		}
	}
	v := s.vdevs[dev]
	answer, err := v.rpc.Call(api.OpNodeSeal, nil, api.Encode(&api.NodeFrames{Device: v.dev.info.Index, Frames: frames}))
	if err != nil {
		return fmt.Errorf("seal %#x on node %s: %w", m.Addr, s.m.node(v.dev.node).addr, err)
	}
	var reply api.NodeSealReply
	if err := api.Decode(answer, &reply); err != nil {
		return fmt.Errorf("seal %#x: node %s's answer: %w", m.Addr, s.m.node(v.dev.node).addr, err)
	}
	if len(reply.StoredOnce) != len(frames) {
		return fmt.Errorf("seal %#x: node %s answered for %d frames, not %d: %w",
			m.Addr, s.m.node(v.dev.node).addr, len(reply.StoredOnce), len(frames), api.ErrProtocol)
	}
	if !sealed {
		s.recordSums(m.Addr, dev, frames) // for a restart of its node (noderestart.go)
	}
	if sealed || s.frameCredit == 0 {
		return nil // credited at its first seal, or never
	}
	var credit uint64
	for _, once := range reply.StoredOnce {
		if once {
			credit += s.frameCredit
		}
	}
	if credit > 0 {
		s.jr.add(journalOp{Op: opCredit, VA: m.Addr, Credit: credit})
		s.credit(m.Addr, credit)
	}
	return nil
}

// translateSealed translates [va, va+n) with its frames resident together
// and marked sealed in the space (memory.Range.SealFrames), and journals
// that they are, before the caller has the node seal them: a restore that
// did not know would reuse them for other chunks, which the node refuses
// to write. A mediator that dies before the node is told leaves frames
// marked sealed that are not, which costs a restored session only a
// frame returned and asked for again where one could have been reused.
// The caller holds issueMu, which orders the record with the residency
// records of the translation's fault-ins and of later evictions.
func (s *session) translateSealed(va, n uint64) ([]memory.Translation, error) {
	ts, err := s.space.TranslateAll([]memory.Range{{VA: va, Len: n, SealFrames: true}})
	if err == nil {
		s.jr.add(journalOp{Op: opFrames, VA: va, Size: n})
	}
	return ts, err
}

// frameCredit is what a budget is credited for one frame stored once when
// its tenant is charged charge (dedup_charge, in [0, 1]) of it: the rest of
// the frame, rounded down to whole bytes.
func frameCredit(charge float64) uint64 {
	if !(charge >= 0 && charge < 1) {
		return 0
	}
	return uint64((1 - charge) * memory.FrameSize)
}

func alignUp(va uint64) uint64 { return (va + memory.FrameSize - 1) &^ (memory.FrameSize - 1) }

// dedupSet is which whole 2 MiB pieces of a copy the node filled itself:
// hit[i] covers copy offsets [first+i·FrameSize, first+(i+1)·FrameSize).
type dedupSet struct {
	first uint64
	hit   []bool
}

// covers says whether copy offsets [off, off+n) lie in filled pieces.
func (d dedupSet) covers(off, n uint64) bool {
	if len(d.hit) == 0 || off < d.first {
		return false
	}
	for p := (off - d.first) / memory.FrameSize; p*memory.FrameSize+d.first < off+n; p++ {
		if p >= uint64(len(d.hit)) || !d.hit[p] {
			return false
		}
	}
	return true
}

// dedup offers the whole 2 MiB pieces of a copy into an unsealed weight to
// the node, and returns which it filled. It waits for the node's answer;
// the pieces it reports are counted as copied.
func (st *stream) dedup(m *api.CopyHost, src []byte, c *completion, idx int) (dedupSet, error) {
	s := st.s
	first := alignUp(m.Addr) - m.Addr
	if s.m.cfg.NoDedup || first+memory.FrameSize > m.Len {
		return dedupSet{}, nil
	}
	if hint, sealed, err := s.space.Hint(m.Addr); err != nil || hint != api.HintWeight || sealed {
		return dedupSet{}, nil // a bad or sealed destination fails when written
	}
	if _, end, err := s.space.Span(m.Addr); err != nil || m.Len > end-m.Addr {
		// Hash nothing the copy cannot write: a copy past its allocation
		// fails when written, and must not first cost a hash of up to a
		// region's bytes.
		return dedupSet{}, nil
	}
	req := api.NodeDedup{}
	for off := first; off+memory.FrameSize <= m.Len; off += memory.FrameSize {
		req.Hashes = append(req.Hashes, sha256.Sum256(src[off:off+memory.FrameSize]))
	}
	// Translated and sent under issueMu, like every node call, so the
	// frames are still this chunk's when the node fills them.
	s.issueMu.Lock()
	dev, xs, err := s.space.TranslateWrite(m.Addr+first, uint64(len(req.Hashes))*memory.FrameSize)
	var call *wire.Call
	if err == nil {
		v := st.on(dev)
		req.Device = v.dev.info.Index
		for _, x := range xs {
			for a := x.Addr; a < x.Addr+x.Len; a += memory.FrameSize {
				req.Dst = append(req.Dst, api.Extent{Addr: a, Len: memory.FrameSize})
			}
		}
		st.unblock() // what the stream gathered goes first
		call = v.rpc.Go(api.OpNodeDedup, nil, api.Encode(&req))
	}
	s.issueMu.Unlock()
	if err != nil {
		return dedupSet{}, fmt.Errorf("copy %d bytes to %#x: %w", m.Len, m.Addr, err)
	}
	if err := call.Wait(); err != nil {
		return dedupSet{}, fmt.Errorf("offer %d pieces of %#x to the node: %w", len(req.Hashes), m.Addr, err)
	}
	hit, err := s.dedupReply(call.Body, len(req.Hashes))
	if err != nil {
		return dedupSet{}, err
	}
	return dedupSet{first: first, hit: hit}, nil
}

// dedupReply decodes a node's answer to a dedup of n frames, and counts its
// hits as frames the session did not send.
func (s *session) dedupReply(body []byte, n int) ([]bool, error) {
	var reply api.NodeDedupReply
	if err := api.Decode(body, &reply); err != nil {
		return nil, fmt.Errorf("node's answer to a dedup of %d frames: %w", n, err)
	}
	if len(reply.Hit) != n {
		return nil, fmt.Errorf("node's answer to a dedup of %d frames has %d answers: %w", n, len(reply.Hit), api.ErrProtocol)
	}
	for _, h := range reply.Hit {
		if h {
			s.dedupHits.Add(1)
			s.dedupBytes.Add(memory.FrameSize)
		}
	}
	return reply.Hit, nil
}
