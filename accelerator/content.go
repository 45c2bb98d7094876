package accelerator

// Sealed frames and deduplication by content.
//
// A connection may seal frames it holds (OpNodeSeal): the node hashes each
// frame's FrameSize bytes with SHA-256 itself, marks the frame read-only in
// its device's frame table, and records it in the node-wide content index.
// Any connection may then ask the node to fill frames of its own with
// contents it names by hash (OpNodeDedup): where a sealed frame of that hash
// exists, on any device, the node copies it, and the mediator need not send
// those bytes. Mediators do this for buffers their tenants marked as
// weights, which many tenants load identical copies of.
//
// Side channel: a dedup hit tells a connection that some frame of this node,
// perhaps another tenant's, holds exactly the content it named. To name it,
// the asker must know the content's SHA-256, in practice the content itself,
// so it learns only that someone else has sealed the same bytes (say, which
// public model another tenant serves), never bytes it did not have. Only
// sealed frames are indexed, and tenants decide what gets sealed.
//
// Invariants:
//   - A frame is in the index if and only if it is sealed and its hash was
//     computed while it was sealed or while only its owner, busy sealing it,
//     could write it; a sealed frame never changes, so its hash stays true.
//   - Before a sealed frame is scrubbed and released (free, end of its
//     connection), forget takes it out of the index and unseals it under
//     contentIndex.mu. A dedup copies from a source frame only under that
//     lock, so no copy reads a frame that is being scrubbed or has changed
//     hands.
//
// Lock order: contentIndex.mu before any frameTable.mu; devices are not
// locked (see node.go).

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"sync"

	"github.com/vgpu/vgpu/api"
)

// frameRef is a frame of one of the node's devices.
type frameRef struct {
	dev  *device
	addr uint64
}

// contentIndex maps contents to the sealed frames that hold them.
type contentIndex struct {
	mu      sync.Mutex
	byHash  map[[32]byte][]frameRef
	byFrame map[frameRef][32]byte
	lookups uint64 // hashes asked for by dedups
	hits    uint64 // of which a sealed frame was copied
}

func newContentIndex() *contentIndex {
	return &contentIndex{byHash: map[[32]byte][]frameRef{}, byFrame: map[frameRef][32]byte{}}
}

// ContentStats is the node's use of sealed frames and deduplication.
// (api.NodeStatus has no fields for it yet.)
type ContentStats struct {
	Sealed  int    // frames sealed and indexed now
	Lookups uint64 // hashes asked for by dedup requests
	Hits    uint64 // of which a sealed frame was copied
}

// ContentStats reports the content index's size and use.
func (n *Node) ContentStats() ContentStats {
	x := n.content
	x.mu.Lock()
	defer x.mu.Unlock()
	return ContentStats{Sealed: len(x.byFrame), Lookups: x.lookups, Hits: x.hits}
}

// hashFrame returns the SHA-256 of the frame at addr of d.
func hashFrame(d *device, addr uint64) ([32]byte, error) {
	var sum [32]byte
	err := d.Read([]api.Extent{{Addr: addr, Len: FrameSize}}, func(parts ...[]byte) error {
		h := sha256.New()
		for _, p := range parts {
			h.Write(p)
		}
		h.Sum(sum[:0])
		return nil
	})
	if err != nil {
		return sum, fmt.Errorf("%s: hash frame %#x: %w", d.Info().Name, addr, err)
	}
	return sum, nil
}

// seal makes frames of d, which c holds, read-only and indexes their
// contents. Frames already sealed are left as they are.
func (c *conn) seal(d *device, frames []uint64) error {
	if err := d.frames.checkOwned(c.owner, frames); err != nil {
		return fmt.Errorf("%s: seal: %w", d.Info().Name, err)
	}
	x := c.node.content
	for _, f := range frames {
		if d.frames.isSealed(f) {
			continue
		}
		// Only c could write f, and c is busy here: the hash holds once
		// the frame is sealed.
		sum, err := hashFrame(d, f)
		if err != nil {
			return err
		}
		x.mu.Lock()
		d.frames.seal(f)
		ref := frameRef{d, f}
		x.byFrame[ref] = sum
		x.byHash[sum] = append(x.byHash[sum], ref)
		x.mu.Unlock()
	}
	return nil
}

// forget unseals those of frames of d that are sealed and takes them out of
// the index, before they are scrubbed and released.
func (x *contentIndex) forget(d *device, frames []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, f := range d.frames.unseal(frames) {
		ref := frameRef{d, f}
		sum := x.byFrame[ref]
		delete(x.byFrame, ref)
		refs := slices.DeleteFunc(x.byHash[sum], func(r frameRef) bool { return r == ref })
		if len(refs) == 0 {
			delete(x.byHash, sum)
		} else {
			x.byHash[sum] = refs
		}
	}
}

// dedup fills each whole frame m.Dst[i] of the device d, which c holds and
// has not sealed, with the contents of a sealed frame whose hash is
// m.Hashes[i], where the node has one.
func (c *conn) dedup(d *device, m *api.NodeDedup) (*api.NodeDedupReply, error) {
	name := d.Info().Name
	if len(m.Dst) != len(m.Hashes) {
		return nil, fmt.Errorf("%s: dedup of %d extents with %d hashes: %w", name, len(m.Dst), len(m.Hashes), api.ErrInvalidArgument)
	}
	for i, x := range m.Dst {
		if x.Len != FrameSize || x.Addr%FrameSize != 0 {
			return nil, fmt.Errorf("%s: dedup extent %d [%#x, +%d) is not one whole frame: %w", name, i, x.Addr, x.Len, api.ErrInvalidArgument)
		}
	}
	if err := d.frames.checkWrite(c.owner, m.Dst); err != nil {
		return nil, fmt.Errorf("%s: dedup destination: %w", name, err)
	}
	reply := &api.NodeDedupReply{Hit: make([]bool, len(m.Dst))}
	for i, dst := range m.Dst {
		hit, err := c.node.content.copyTo(d, dst.Addr, m.Hashes[i])
		if err != nil {
			return nil, err
		}
		reply.Hit[i] = hit
	}
	return reply, nil
}

// copyTo copies a sealed frame whose hash is sum, if the index holds one,
// to the frame at dst of d, holding x.mu throughout so the source cannot be
// scrubbed meanwhile.
func (x *contentIndex) copyTo(d *device, dst uint64, sum [32]byte) (bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.lookups++
	refs := x.byHash[sum]
	if len(refs) == 0 {
		return false, nil
	}
	src := refs[0]
	err := src.dev.Read([]api.Extent{{Addr: src.addr, Len: FrameSize}}, func(parts ...[]byte) error {
		at := dst
		for _, p := range parts {
			if err := d.Write([]api.Extent{{Addr: at, Len: uint64(len(p))}}, p); err != nil {
				return err
			}
			at += uint64(len(p))
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("dedup from frame %#x of %s into %#x of %s: %w", src.addr, src.dev.Info().Name, dst, d.Info().Name, err)
	}
	x.hits++
	return true, nil
}
