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
// weights, which many tenants load identical copies of. Hashing a frame,
// copying or aliasing one for a dedup, and copying an aliased frame's bytes
// into memory of its own (own, before a write; forget, when its source is
// freed) are device time of the tenant whose connection's request called
// for them (the sealer, the dedup's asker, the writer, the one freeing):
// measured frame by frame, without any wait for contentIndex.mu, and
// charged once what the tenant owes comes to a step or more (chargeOff,
// memwork.go).
//
// Stored once: where the sealed frame is on the same device and the device
// can alias (aliaser, the sim backend can), a dedup hit does not copy: the
// tenant's frame is made to map the sealed frame's physical memory, its own
// is freed, and the index records the alias. Identical weights of many
// tenants then cost the node's memory once. An aliased frame reads the
// source's bytes; it gets memory of its own again (unalias), under
// contentIndex.mu:
//   - with a copy of the bytes, before anything writes it: every write path
//     (write, fill, copy destination, a launch's buffer its kernel may
//     write, a shared object's frames) calls own after its checks;
//   - with a copy of the bytes, before its source is scrubbed: forget
//     unaliases every alias of a frame it takes out, under the same hold
//     of contentIndex.mu as it takes the frame out of the index;
//   - without one, before it is scrubbed itself (forget), or refilled by
//     another dedup.
//
// An aliased frame that its holder seals stays aliased (nobody writes it
// now) and is indexed as any sealed frame; a dedup that finds it aliases to
// its source, so every alias maps a frame that is not aliased itself.
//
// The seal's reply (api.NodeSealReply) says which of the frames are stored
// once: aliased, at the moment they are sealed, to a frame whose holder's
// tenant is another than the sealer's. Mediators credit their tenants'
// memory budgets for those (dedup_charge in the quota file); a tenant's
// copies of its own content, and frames a dedup copied rather than
// aliased, are never reported, so only content some other tenant sealed
// earns a credit. The answer is final: a frame that stops being an alias
// later (its source freed) is not reported again.
//
// Side channel: a dedup hit tells a connection that some frame of this node,
// perhaps another tenant's, holds exactly the content it named. To name it,
// the asker must know the content's SHA-256, in practice the content itself,
// so it learns only that someone else has sealed the same bytes (say, which
// public model another tenant serves), never bytes it did not have. Only
// sealed frames are indexed, and tenants decide what gets sealed.
//
// Retention: weights outlive the sessions that load them, as an inference
// server that restarts loads the same model again. When its holder frees a
// sealed frame (or its connection ends), the node keeps it, sealed and
// indexed, in place of scrubbing it, if it maps memory of its own and no
// other indexed frame of its device holds the same bytes but its aliases.
// Its aliases keep mapping it: the tenants that loaded the same weights
// still share one copy, where without retention each would get its own.
// Nobody holds a retained frame (retainedOwner) and nobody's quota counts
// it: it is free memory that happens to hold sealed contents, and a dedup
// that names them finds them as it would a held frame's. An allocation that
// finds too few free frames reclaims retained ones, those without aliases
// before those with, and the least recently retained or found by a dedup
// first: each is forgotten as a freed frame is (its aliases given copies),
// scrubbed and released, as device work of the allocating tenant, charged
// once no other allocation of the device waits for it; but for the copies,
// device work of the aliases' holders, whose memory they become, charged at
// once without waiting their turns. A frame retained confers no storedOnce
// credit: it is stored once with nobody. The side channel below then reaches
// back to contents freed earlier, not only those held now; a node started
// with retention off (SetRetention, SimOptions.NoRetention) scrubs every
// frame as it is freed.
//
// Invariants:
//   - A frame is in the index if and only if it is sealed and its hash was
//     computed while it was sealed or while only its owner, busy sealing it,
//     could write it; a sealed frame never changes, so its hash stays true.
//   - Before a sealed frame is scrubbed and released (free, end of its
//     connection), forget takes it out of the index and unseals it under
//     contentIndex.mu, with its aliases unaliased in the same hold. A
//     dedup copies from a source frame only under that lock, so no copy
//     reads a frame that is being scrubbed or has changed hands.
//   - A frame is aliased (aliasOf) only to a sealed, indexed frame of the
//     same device that is not aliased itself, and is never written while
//     aliased; aliased counts the device's aliased frames and changes only
//     under contentIndex.mu, after the device mapping did.
//   - sealer has an entry exactly for the frames in byFrame: the tenant of
//     the connection that holds (and sealed) the frame, or "" for a frame
//     the node retains.
//   - kept has an entry exactly for the frames retainedOwner holds whose
//     reclaim has not begun; each is sealed, indexed and not aliased itself.
//     The others retainedOwner holds are being reclaimed, or are in their
//     device's unscrubbed list, under its allocMu.
//
// Lock order: device.allocMu before contentIndex.mu before any
// frameTable.mu; devices are not locked (see node.go).

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
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
	sealer  map[frameRef]string                   // sealed frame → its holder's tenant
	aliasOf map[frameRef]frameRef                 // aliased frame → the frame whose memory it maps
	aliases map[frameRef]map[frameRef]tenantShare // the other way, with each alias's holder
	kept    map[frameRef]uint64                   // retained frame → keptSeq when retained or last found by a dedup
	keptSeq uint64
	retain  bool // whether freed sealed frames are retained
	// retainMax bounds the frames without aliases retained per device (0:
	// none but free memory).
	retainMax int
	lookups   uint64 // hashes asked for by dedups
	hits      uint64 // of which a sealed frame was copied or aliased
	// hook, set by tests only, is called at each hookPoint.
	hook atomic.Pointer[func(hookPoint, frameRef)]
}

// hookPoint names a point of the index's protocols at which a test may
// watch the node or hold it up (contentIndex.hook): the race tests use
// them to make the interleavings they are about happen, and to count them.
type hookPoint int

const (
	hookCopy         hookPoint = iota // a dedup is about to copy or alias r; x.mu held
	hookFreeBegin                     // a free of r is about to take x.mu
	hookFree                          // a free is about to retain or forget r; x.mu held
	hookReclaimBegin                  // a reclaim of r.dev is about to take x.mu
	hookReclaim                       // a reclaim is about to forget r; x.mu held
	hookReclaimEnd                    // a reclaim of r.dev is done
)

// at calls the test hook, if one is set, at p with r.
func (x *contentIndex) at(p hookPoint, r frameRef) {
	if h := x.hook.Load(); h != nil {
		(*h)(p, r)
	}
}

func newContentIndex() *contentIndex {
	return &contentIndex{byHash: map[[32]byte][]frameRef{}, byFrame: map[frameRef][32]byte{}, sealer: map[frameRef]string{},
		aliasOf: map[frameRef]frameRef{}, aliases: map[frameRef]map[frameRef]tenantShare{}, kept: map[frameRef]uint64{}, retain: true}
}

// SetRetention turns the retention of sealed frames freed from now on on or
// off (content.go); it is on unless turned off. Frames retained already
// stay until an allocation reclaims them.
func (n *Node) SetRetention(on bool) {
	n.content.mu.Lock()
	defer n.content.mu.Unlock()
	n.content.retain = on
}

// LimitRetention bounds the sealed frames without aliases that the node
// retains to maxBytes per device, rounded down to whole frames but at
// least one (0: as many as free memory holds). A free that retains a frame
// past it gives up the least recently used such frames of the device, as
// an allocation reclaims them, at the cost of the tenant freeing. Frames
// with aliases do not count: other tenants' frames map them, so giving
// them up would copy, not free, their memory. On the sim backend retained
// frames hold host RAM. A lower bound takes effect at the next free.
func (n *Node) LimitRetention(maxBytes uint64) {
	n.content.mu.Lock()
	defer n.content.mu.Unlock()
	n.content.retainMax = 0
	if maxBytes > 0 {
		n.content.retainMax = int(max(1, min(maxBytes/FrameSize, math.MaxInt32)))
	}
}

// overRetained is how many frames without aliases d retains past
// retainMax.
func (x *contentIndex) overRetained(d *device) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.retainMax == 0 {
		return 0
	}
	n := 0
	for r := range x.kept {
		if r.dev == d && len(x.aliases[r]) == 0 {
			n++
		}
	}
	return max(0, n-x.retainMax)
}

// ContentStats is the node's use of sealed frames and deduplication.
// (api.NodeStatus has no fields for it yet.)
type ContentStats struct {
	Sealed  int    // frames sealed and indexed now, Retained among them
	Lookups uint64 // hashes asked for by dedup requests
	Hits    uint64 // of which a sealed frame was copied or aliased
	Aliased int    // frames that map another frame's memory now
	// Saved is the device memory aliasing saves now: Aliased frames' worth,
	// whose bytes are stored once rather than in each frame.
	Saved    uint64
	Retained int // sealed frames kept after their holders freed them
}

// ContentStats reports the content index's size and use.
func (n *Node) ContentStats() ContentStats {
	x := n.content
	x.mu.Lock()
	defer x.mu.Unlock()
	return ContentStats{Sealed: len(x.byFrame), Lookups: x.lookups, Hits: x.hits,
		Aliased: len(x.aliasOf), Saved: uint64(len(x.aliasOf)) * FrameSize, Retained: len(x.kept)}
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

// replySeal makes frames of d, which c holds, read-only, indexes their
// contents, and answers request h with which of them are stored once
// (api.NodeSealReply). Frames already sealed are left as they are.
func (c *conn) replySeal(h wire.Header, d *device, frames []uint64) error {
	reply, err := c.sealFrames(d, frames)
	if err != nil {
		return err
	}
	return c.c.Reply(h, api.Encode(reply))
}

// sealFrames seals frames as replySeal does and reports for each whether it is
// stored once: aliased, now that it is sealed, to a frame that a
// connection of another tenant holds. Frames sealed before are reported as
// they are stored now.
func (c *conn) sealFrames(d *device, frames []uint64) (*api.NodeSealReply, error) {
	if err := d.frames.checkOwned(c.owner, frames); err != nil {
		return nil, fmt.Errorf("%s: seal: %w", d.Info().Name, err)
	}
	for _, f := range frames {
		if !d.frames.isSealed(f) && d.frames.isShared([]api.Extent{{Addr: f, Len: FrameSize}}) {
			// An object's writes would change it behind the seal.
			return nil, fmt.Errorf("%s: seal: frame %#x is part of a shared object: %w", d.Info().Name, f, api.ErrPermissionDenied)
		}
	}
	x := c.node.content
	reply := &api.NodeSealReply{StoredOnce: make([]bool, len(frames))}
	for i, f := range frames {
		ref := frameRef{d, f}
		if d.frames.isSealed(f) {
			x.mu.Lock()
			reply.StoredOnce[i] = x.storedOnce(ref, c.tenant)
			x.mu.Unlock()
			continue
		}
		// Only c could write f, and c is busy here: the hash holds once
		// the frame is sealed. Hashing is device work of c's tenant.
		var sum [32]byte
		err := d.offRunner(c.share, func() (err error) {
			sum, err = hashFrame(d, f)
			return err
		})
		if err != nil {
			return nil, err
		}
		x.mu.Lock()
		d.frames.seal(f)
		x.byFrame[ref] = sum
		x.sealer[ref] = c.tenant
		x.byHash[sum] = append(x.byHash[sum], ref)
		reply.StoredOnce[i] = x.storedOnce(ref, c.tenant)
		x.mu.Unlock()
	}
	return reply, nil
}

// storedOnce says whether the sealed frame ref, held by a connection of
// tenant, maps the memory of a frame another tenant holds. The caller holds
// x.mu. A frame is aliased only to a sealed frame (see the invariants), so
// its source has a sealer, "" if the node retains it.
func (x *contentIndex) storedOnce(ref frameRef, tenant string) bool {
	src, ok := x.aliasOf[ref]
	return ok && x.sealer[src] != "" && x.sealer[src] != tenant
}

// forget readies frames of d, which o holds for t, to be freed, as device
// work of t: those it may, it retains; the others it readies to be scrubbed
// and released, and returns: their aliases get copies of their bytes, those
// of them that are aliased are unaliased, and those that are sealed are
// unsealed and taken out of the index. It takes x.mu for one frame at a
// time, and charges the time each took under it to t (chargeOff) once it is
// released; it returns those it retained too. On an error the frames
// before the one that failed may have been taken out of the index already,
// and all stay held: those it retained go back to o (unkeep), unless an
// allocation reclaimed one meanwhile.
func (x *contentIndex) forget(t tenantShare, o owner, d *device, frames []uint64) (scrub []uint64, kept []frameRef, err error) {
	for _, f := range frames {
		x.at(hookFreeBegin, frameRef{d, f})
	}
	for _, f := range x.latestSealedFirst(d, frames) {
		ref := frameRef{d, f}
		x.mu.Lock()
		took, err := d.timed(func() error {
			x.at(hookFree, ref)
			if x.keep(o, ref) {
				kept = append(kept, ref)
				return nil
			}
			scrub = append(scrub, f)
			return x.forgetFrame(ref)
		})
		x.mu.Unlock()
		d.chargeOff(t, took)
		if err != nil {
			x.unkeep(o, t.name, kept)
			return nil, nil, err
		}
	}
	slices.Sort(scrub) // in runs, for the scrub
	return scrub, kept, nil
}

// latestSealedFirst orders frames of d, freed together, so that of those
// holding the same bytes the one sealed first comes last: it is the one
// retained (keep declines a frame while another holds its bytes), however
// the request ordered them. Frames not indexed come last.
func (x *contentIndex) latestSealedFirst(d *device, frames []uint64) []uint64 {
	x.mu.Lock()
	pos := make(map[uint64]int, len(frames))
	for _, f := range frames {
		ref := frameRef{d, f}
		pos[f] = -1
		if sum, ok := x.byFrame[ref]; ok {
			pos[f] = slices.Index(x.byHash[sum], ref)
		}
	}
	x.mu.Unlock()
	order := slices.Clone(frames)
	slices.SortStableFunc(order, func(a, b uint64) int { return cmp.Compare(pos[b], pos[a]) })
	return order
}

// unkeep gives the frames of refs that the node still retains back to o,
// a connection of tenant, undoing keep for a free that failed.
func (x *contentIndex) unkeep(o owner, tenant string, refs []frameRef) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range refs {
		if _, ok := x.kept[r]; ok {
			delete(x.kept, r)
			x.sealer[r] = tenant
			r.dev.frames.move(retainedOwner, o, []uint64{r.addr})
		}
	}
}

// keep retains ref, which o holds and frees, if the node retains frames
// and ref may be retained (see Retention), and says whether it did. The
// caller holds x.mu.
func (x *contentIndex) keep(o owner, ref frameRef) bool {
	sum, sealed := x.byFrame[ref]
	if !x.retain || !sealed {
		return false
	}
	if _, aliased := x.aliasOf[ref]; aliased {
		return false
	}
	for _, r := range x.byHash[sum] {
		if r != ref && r.dev == ref.dev && x.aliasOf[r] != ref {
			return false
		}
	}
	ref.dev.frames.move(o, retainedOwner, []uint64{ref.addr})
	x.sealer[ref] = ""
	x.keptSeq++
	x.kept[ref] = x.keptSeq
	return true
}

// reclaim takes up to n of the frames of d the node retains out of the
// index, those without aliases before those with, the least recently
// retained or found by a dedup first; scrubs
// them, with any a failed reclaim left unscrubbed (device.unscrubbed), and
// releases them. It returns how many it released, and how long its work
// took, which the caller charges to the allocating tenant once it no
// longer holds d.allocMu; but for the copies it gives aliases of the
// frames, each charged at once to the alias's holder, whose memory it
// becomes. It holds x.mu for one frame at a time, as forget does. The
// caller holds d.allocMu, so that two allocations do not reclaim the same
// frames.
func (x *contentIndex) reclaim(d *device, n int, withAliases bool) (int, time.Duration, error) {
	x.at(hookReclaimBegin, frameRef{dev: d})
	defer x.at(hookReclaimEnd, frameRef{dev: d})
	x.mu.Lock()
	var refs []frameRef
	for r := range x.kept {
		if r.dev == d && (withAliases || len(x.aliases[r]) == 0) {
			refs = append(refs, r)
		}
	}
	slices.SortFunc(refs, func(a, b frameRef) int {
		return cmp.Or(cmp.Compare(len(x.aliases[a]), len(x.aliases[b])), cmp.Compare(x.kept[a], x.kept[b]))
	})
	x.mu.Unlock()
	refs = refs[:min(n, len(refs))]
	frames := d.unscrubbed
	d.unscrubbed = nil
	var work time.Duration
	var err error
	for _, r := range refs {
		var holders []tenantShare // with the copy each was given
		x.mu.Lock()
		took, ferr := d.timed(func() error {
			if _, ok := x.kept[r]; !ok {
				return nil // a failed free took it back
			}
			x.at(hookReclaim, r)
			for a, t := range x.aliases[r] {
				copied, err := d.timed(func() error { return x.unalias(a, true) })
				if err != nil {
					return err
				}
				t.aside = copied
				holders = append(holders, t)
			}
			if err := x.forgetFrame(r); err != nil {
				return err
			}
			delete(x.kept, r)
			frames = append(frames, r.addr)
			return nil
		})
		x.mu.Unlock()
		for _, t := range holders {
			d.sched.chargeNow(t)
			took -= t.aside
		}
		if work += took; ferr != nil {
			err = ferr
			break
		}
	}
	slices.Sort(frames)
	scrubbed, serr := d.timed(func() error { return d.scrubRelease(frames) })
	if serr != nil {
		// Out of the index, held by nobody: scrubbed by the next reclaim.
		d.unscrubbed, frames = frames, nil
	}
	return len(frames), work + scrubbed, errors.Join(err, serr)
}

// forgetFrame is forget of one frame. The caller holds x.mu. On an error
// the frame stays sealed.
func (x *contentIndex) forgetFrame(ref frameRef) error {
	for a := range x.aliases[ref] {
		if err := x.unalias(a, true); err != nil {
			return err
		}
	}
	if err := x.unalias(ref, false); err != nil {
		return err
	}
	if len(ref.dev.frames.unseal([]uint64{ref.addr})) == 0 {
		return nil
	}
	sum := x.byFrame[ref]
	delete(x.byFrame, ref)
	delete(x.sealer, ref)
	refs := slices.DeleteFunc(x.byHash[sum], func(r frameRef) bool { return r == ref })
	if len(refs) == 0 {
		delete(x.byHash, sum)
	} else {
		x.byHash[sum] = refs
	}
	return nil
}

// unalias gives the frame a, if it is aliased, memory of its own: with a
// copy of the bytes it maps if keep, else zeros. The caller holds x.mu. On
// an error a stays aliased.
func (x *contentIndex) unalias(a frameRef, keep bool) error {
	src, ok := x.aliasOf[a]
	if !ok {
		return nil
	}
	if err := a.dev.Device.(aliaser).Unalias(a.addr, FrameSize, keep); err != nil {
		return fmt.Errorf("unalias frame %#x of %s from %#x: %w", a.addr, a.dev.Info().Name, src.addr, err)
	}
	delete(x.aliasOf, a)
	if delete(x.aliases[src], a); len(x.aliases[src]) == 0 {
		delete(x.aliases, src)
	}
	a.dev.aliased.Add(-1)
	return nil
}

// own gives every aliased frame that xs of d touch memory of its own, with
// a copy of its bytes, before they are written, as device work of t: each
// copy's time under x.mu is charged to t (chargeOff) once x.mu is released,
// frame by frame. The caller has checked that it holds those frames and may
// write them, so none is sealed.
func (x *contentIndex) own(t tenantShare, d *device, xs []api.Extent) error {
	// A frame of the caller's is aliased only by a dedup of the caller's
	// own, earlier, and stays counted until it is unaliased: a count of
	// zero means none is. Between frames, x.mu is released: nothing but
	// the caller aliases its frames, and it is busy here.
	if d.aliased.Load() == 0 {
		return nil
	}
	for _, e := range xs {
		if e.Len == 0 {
			continue
		}
		for f := e.Addr / FrameSize * FrameSize; f < e.Addr+e.Len; f += FrameSize {
			if err := x.ownFrame(t, frameRef{d, f}); err != nil {
				return fmt.Errorf("%s: give frame %#x its own memory before a write: %w", d.Info().Name, f, err)
			}
		}
	}
	return nil
}

// ownFrame gives a, if it is aliased, memory of its own with a copy of its
// bytes, and charges the copy to t.
func (x *contentIndex) ownFrame(t tenantShare, a frameRef) error {
	x.mu.Lock()
	if _, ok := x.aliasOf[a]; !ok {
		x.mu.Unlock()
		return nil
	}
	took, err := a.dev.timed(func() error { return x.unalias(a, true) })
	x.mu.Unlock()
	a.dev.chargeOff(t, took)
	return err
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
		// Copying a frame (or a lookup, or aliasing) is device work of
		// c's tenant; waiting for the index's lock, behind others' work,
		// is not.
		hit, took, err := c.node.content.copyTo(c.share, d, dst.Addr, m.Hashes[i])
		d.chargeOff(c.share, took)
		reply.Hit[i] = hit
		if err != nil {
			return nil, err
		}
	}
	return reply, nil
}

// copyTo fills the frame at dst of d with a sealed frame whose hash is sum,
// if the index holds one: it aliases dst to the sealed frame's memory where
// it can, else copies it. It holds x.mu throughout so the source cannot be
// scrubbed meanwhile, and reports how long it held it, on d's scheduler's
// clock: the work to charge, without the wait for the lock. dst is held by
// the caller and not sealed.
func (x *contentIndex) copyTo(t tenantShare, d *device, dst uint64, sum [32]byte) (bool, time.Duration, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	hit := false
	took, err := d.timed(func() (err error) {
		hit, err = x.copyToLocked(t, d, dst, sum)
		return err
	})
	return hit, took, err
}

// copyToLocked is copyTo with x.mu held. t is the share of dst's holder.
func (x *contentIndex) copyToLocked(t tenantShare, d *device, dst uint64, sum [32]byte) (bool, error) {
	x.lookups++
	refs := x.byHash[sum]
	if len(refs) == 0 {
		return false, nil
	}
	// A frame of d's, which it may alias rather than copy; of those, one
	// whose memory some tenant holds, whose alias earns that credit and is
	// not one a reclaim would have to copy.
	rank := func(r frameRef) (k int) {
		if r.dev != d {
			k += 2
		}
		if root, ok := x.aliasOf[r]; ok {
			r = root
		}
		if x.sealer[r] == "" {
			k++
		}
		return k
	}
	src := slices.MinFunc(refs, func(a, b frameRef) int { return cmp.Compare(rank(a), rank(b)) })
	if root, ok := x.aliasOf[src]; ok {
		src = root // alias to the memory itself
	}
	x.at(hookCopy, src)
	if _, ok := x.kept[src]; ok { // used: reclaimed after colder ones
		x.keptSeq++
		x.kept[src] = x.keptSeq
	}
	me := frameRef{d, dst}
	if cur, ok := x.aliasOf[me]; ok && cur == src {
		x.hits++
		return true, nil // already is
	}
	// Whatever dst maps now is overwritten whole.
	if err := x.unalias(me, false); err != nil {
		return false, err
	}
	if al, ok := d.Device.(aliaser); ok && src.dev == d && src != me {
		if err := al.Alias(dst, src.addr, FrameSize); err != nil {
			return false, fmt.Errorf("dedup: alias frame %#x of %s to %#x: %w", dst, d.Info().Name, src.addr, err)
		}
		x.aliasOf[me] = src
		if x.aliases[src] == nil {
			x.aliases[src] = map[frameRef]tenantShare{}
		}
		x.aliases[src][me] = t
		d.aliased.Add(1)
		x.hits++
		return true, nil
	}
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
