package mediator

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// frameSource leases frames from the node behind each virtual device, over
// the session's own connection, so the node ties them to this tenant. It
// checks each grant and records the frames the space holds, so that the
// container's count of resident memory holds exactly those whatever a node
// answers.
type frameSource struct {
	s *session
	// replay, while a restart rebuilds the session, grants the frames
	// its journal records and takes frees without telling the nodes
	// (resume.go); nil otherwise. Set and cleared before the session
	// serves anyone.
	replay *replay

	mu   sync.Mutex        // a leaf of the session's lock order
	held map[devFrame]bool // guarded by mu: granted and not returned since
}

type devFrame struct {
	dev   uint32
	frame uint64
}

func newFrameSource(s *session) *frameSource {
	return &frameSource{s: s, held: make(map[devFrame]bool)}
}

func (f *frameSource) Grant(dev uint32, n int) (_ []uint64, err error) {
	// A container's sessions hold its resident memory together: a grant
	// past it takes frames from the others' coldest chunks, or is refused
	// as a full device would refuse it, so the space evicts its own chunks
	// or fails with out-of-memory.
	if q := f.resident(); q != nil {
		if err := f.s.ctr.reserveResident(f.s, n); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				q.release(uint64(n) * memory.FrameSize)
			}
		}()
	}
	if f.replay != nil {
		frames, err := f.replay.grant(dev, n)
		if err == nil {
			_, err = f.hold(dev, frames, n)
		}
		return frames, err
	}
	v := f.s.vdevs[dev]
	addr := f.s.m.node(v.dev.node).addr
	body, err := v.rpc.Call(api.OpNodeAlloc, nil, api.Encode(&api.NodeAlloc{Device: v.dev.info.Index, Count: uint32(n)}))
	if err != nil {
		return nil, err
	}
	var frames api.NodeFrames
	if err := api.Decode(body, &frames); err != nil {
		return nil, fmt.Errorf("node %s: frames reply: %w", addr, err)
	}
	if ours, err := f.hold(dev, frames.Frames, n); err != nil {
		err = fmt.Errorf("node %s: grant of %d frames: %w", addr, n, err)
		if len(ours) > 0 {
			_, rerr := v.rpc.Call(api.OpNodeFree, nil, api.Encode(&api.NodeFrames{Device: v.dev.info.Index, Frames: ours}))
			if rerr != nil {
				err = errors.Join(err, fmt.Errorf("return the %d frames of that grant to node %s: %w", len(ours), addr, rerr))
			}
		}
		return nil, err
	}
	if f.s.jr != nil { // the allocation's journal record names them (resume.go)
		f.s.grants = append(f.s.grants, frames.Frames)
	}
	return frames.Frames, nil
}

// hold records frames, the node's answer to a grant of n frames of dev,
// as held. It refuses an answer with a frame misaligned, repeated or held
// already, which would alias memory, or with other than n frames; it then
// returns the frames certainly granted (aligned, distinct, not held), which
// the caller gives back to the node.
func (f *frameSource) hold(dev uint32, frames []uint64, n int) (ours []uint64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := make(map[uint64]bool, len(frames))
	for _, fr := range frames {
		switch {
		case fr%memory.FrameSize != 0:
			err = fmt.Errorf("frame %#x is not a multiple of %#x: %w", fr, memory.FrameSize, api.ErrProtocol)
		case seen[fr] || f.held[devFrame{dev, fr}]:
			err = fmt.Errorf("frame %#x is granted twice: %w", fr, api.ErrProtocol)
		default:
			seen[fr] = true
			ours = append(ours, fr)
		}
	}
	if err == nil && len(frames) != n {
		err = fmt.Errorf("%d frames granted: %w", len(frames), api.ErrProtocol)
	}
	if err != nil {
		return ours, err
	}
	for _, fr := range frames {
		f.held[devFrame{dev, fr}] = true
	}
	return nil, nil
}

// Read copies a frame's contents out, for eviction to host memory.
func (f *frameSource) Read(dev uint32, frame uint64, p []byte) error {
	v := f.s.vdevs[dev]
	calls := make([]*wire.Call, 0, memory.FrameSize/wire.MaxChunk)
	for off := 0; off < len(p); off += wire.MaxChunk {
		n := min(wire.MaxChunk, len(p)-off)
		req := api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: []api.Extent{{Addr: frame + uint64(off), Len: uint64(n)}}})
		calls = append(calls, v.rpc.Go(api.OpNodeRead, p[off:off+n], req))
	}
	return waitAll(calls)
}

// Write fills a frame with p, for fault-in from host memory.
func (f *frameSource) Write(dev uint32, frame uint64, p []byte) error {
	v := f.s.vdevs[dev]
	calls := make([]*wire.Call, 0, memory.FrameSize/wire.MaxChunk)
	for off := 0; off < len(p); off += wire.MaxChunk {
		n := min(wire.MaxChunk, len(p)-off)
		hdr := api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: []api.Extent{{Addr: frame + uint64(off), Len: uint64(n)}}})
		calls = append(calls, v.rpc.Go(api.OpNodeWrite, nil, hdr, p[off:off+n]))
	}
	return waitAll(calls)
}

// Refill asks the node to fill frames, for a fault-in, with the bytes
// whose SHA-256 are sums, from sealed frames it holds or retains
// (accelerator/content.go), in dedups of up to refillBatch frames: evicted
// weights come back without crossing the network. Off with deduplication
// (Config.NoDedup).
func (f *frameSource) Refill(dev uint32, frames []uint64, sums [][32]byte) ([]bool, error) {
	if f.s.m.cfg.NoDedup {
		return make([]bool, len(frames)), nil
	}
	v := f.s.vdevs[dev]
	var hits []bool
	for len(frames) > 0 {
		n := min(len(frames), refillBatch)
		req := api.NodeDedup{Device: v.dev.info.Index, Hashes: sums[:n]}
		for _, fr := range frames[:n] {
			req.Dst = append(req.Dst, api.Extent{Addr: fr, Len: memory.FrameSize})
		}
		body, err := v.rpc.Call(api.OpNodeDedup, nil, api.Encode(&req))
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", f.s.m.node(v.dev.node).addr, err)
		}
		hit, err := f.s.dedupReply(body, n)
		if err != nil {
			return nil, err
		}
		hits, frames, sums = append(hits, hit...), frames[n:], sums[n:]
	}
	return hits, nil
}

// refillBatch bounds the frames of one refill request, whose body (48
// bytes a frame, after a few bytes of lengths) must stay within
// wire.MaxBody; the constant below fails to compile if it does not.
const refillBatch = 4096

const _ uint = wire.MaxBody - 64 - 48*refillBatch

// Zero clears a frame that is reused for a chunk never written.
func (f *frameSource) Zero(dev uint32, frame uint64) error {
	v := f.s.vdevs[dev]
	_, err := v.rpc.Call(api.OpNodeFill, nil, api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: []api.Extent{{Addr: frame, Len: memory.FrameSize}}}))
	return err
}

// waitAll waits for every call and returns the first error.
func waitAll(calls []*wire.Call) error {
	var first error
	for _, c := range calls {
		if err := c.Wait(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Return gives frames back to the node. They count no longer against the
// container's resident memory even if the node does not answer: the space
// forgets them, and the node frees them when the connection ends.
func (f *frameSource) Return(dev uint32, frames []uint64) error {
	f.mu.Lock()
	var released uint64
	for _, fr := range frames {
		if f.held[devFrame{dev, fr}] {
			delete(f.held, devFrame{dev, fr})
			released += memory.FrameSize
		}
	}
	f.mu.Unlock()
	if q := f.resident(); q != nil {
		defer q.release(released)
	}
	if f.replay != nil {
		return nil // what the nodes kept beyond the replayed space is freed after it
	}
	v := f.s.vdevs[dev]
	_, err := v.rpc.Call(api.OpNodeFree, nil, api.Encode(&api.NodeFrames{Device: v.dev.info.Index, Frames: frames}))
	return err
}

// resident is the container's count of resident memory, if it has one.
func (f *frameSource) resident() *budget {
	if f.s.ctr == nil {
		return nil
	}
	return f.s.ctr.resident
}
