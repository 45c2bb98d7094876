package mediator

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Shared buffers across a restart. The journal records each export (the
// allocation, the object id its node gave, the mode) and import (the
// node, the object, the address and size), and their ends, the end before
// the node is told. A restore replays them with the rest, then:
//
//   - An export goes on as the same object. Its node kept the object
//     with the parked frames, grants and all, and importers, here or in
//     other mediators, went on using it meanwhile; the reclaim made the
//     session's new connection its exporter (accelerator/reattach.go). A
//     versioned one is pinned again. An immutable one's allocation is
//     sealed again, as the export sealed it.
//   - An import is made again from scratch, at the same address, over a
//     connection dialled anew: an import holds no frames, so nothing of it
//     is parked, and the node forgot the dropped connection's import and
//     pins. The node checks the tenant's grant again, so a grant revoked,
//     or an object ended, while this mediator was down ends the range with
//     the node's error, as a revocation pushed to a live session would;
//     the rest of the session is restored. A versioned import reads the
//     latest published version, as after a Pin. A revocation the node
//     pushes before the tenant resumes finds the session not yet served
//     (Mediator.revoked looks at served sessions): its range is not ended
//     at once, but the cache drops the object's copies, and the node
//     refuses the next access, typed.
//   - An end journaled is sent to the node again (an unexport the node may
//     not have heard before the death); an object already gone is fine.
//     So is each revocation journaled of a live export, which is also
//     written before the node is told: a tenant that has no grant any
//     more is fine.
//
// The cache of the node's pages starts empty: every read goes to the node
// first, under a new lease. Leases the dead process held stay in the
// node's directory until they run out, and a write waits each one out,
// since the node cannot tell a dead mediator from a cut-off one: so no
// copy read before the death is served after a write is acknowledged.
// Interrupted export and import calls fail in the SDK (client.ErrInterrupted):
// an export the node made but the journal missed leaves its object to
// end with the allocation's frames, and the allocation written only
// through the object; an import the journal missed was forgotten by the
// node with its connection.

// replayedShares is what a replay found of a session's shared buffers.
type replayedShares struct {
	exports map[uint64]journalOp // live, by allocation
	imports map[uint64]journalOp // live, by address
	// ended are the objects whose end was journaled, with the node of
	// each, to tell the node again.
	ended []endedObject
	// revoked are the tenants whose grant a live export's journal revokes,
	// by allocation, to tell the node again.
	revoked map[uint64][]string
}

type endedObject struct {
	node   int
	object uint64
}

// replayShared replays an export, import or end of either.
func (s *session) replayShared(op journalOp, r *replay) error {
	sh := &r.shares
	if sh.exports == nil {
		sh.exports, sh.imports = map[uint64]journalOp{}, map[uint64]journalOp{}
	}
	switch op.Op {
	case opExport:
		if err := s.space.CheckStart("export", op.VA); err != nil {
			return err
		}
		if _, ok := sh.exports[op.VA]; ok || !op.Mode.Valid() || op.Mode == api.ModePrivate {
			return fmt.Errorf("export in mode %v of an allocation exported already, or in no shared mode: %w", op.Mode, api.ErrInternal)
		}
		if op.Mode == api.ModeImmutable {
			if err := s.space.Seal(op.VA); err != nil {
				return err
			}
		}
		sh.exports[op.VA] = op
	case opUnexport:
		x, ok := sh.exports[op.VA]
		if !ok {
			return fmt.Errorf("an export ends that is not live: %w", api.ErrInternal)
		}
		dev, _, err := s.space.Span(op.VA)
		if err != nil {
			return err
		}
		delete(sh.exports, op.VA)
		delete(sh.revoked, op.VA)
		sh.ended = append(sh.ended, endedObject{node: s.vdevs[dev].dev.node, object: x.Object})
	case opRevoke:
		x, ok := sh.exports[op.VA]
		if !ok {
			return fmt.Errorf("a grant of an export that is not live is revoked: %w", api.ErrInternal)
		}
		if sh.revoked == nil {
			sh.revoked = map[uint64][]string{}
		}
		sh.revoked[op.VA] = append(sh.revoked[op.VA], op.Tenant)
		if x.Tenants != nil {
			left := slices.DeleteFunc(slices.Clone(*x.Tenants), func(g api.Grant) bool { return g.Tenant == op.Tenant })
			x.Tenants = &left
			sh.exports[op.VA] = x
		}
	case opImport:
		if op.VA < importBase || op.Size == 0 || op.VA+op.Size < op.VA {
			return fmt.Errorf("import of %d bytes at %#x: not where imports go: %w", op.Size, op.VA, api.ErrInternal)
		}
		for _, x := range sh.imports {
			if op.VA < x.VA+x.Size && x.VA < op.VA+op.Size {
				return fmt.Errorf("import overlaps the one at %#x: %w", x.VA, api.ErrInternal)
			}
		}
		sh.imports[op.VA] = op
		s.shares.placeRestored(op.VA, op.Size)
	case opUnimport:
		if _, ok := sh.imports[op.VA]; !ok {
			return fmt.Errorf("an import ends that is not live: %w", api.ErrInternal)
		}
		delete(sh.imports, op.VA)
	}
	return nil
}

// restoreShares makes the replayed exports and imports live again, once
// the space is reconciled; an export that cannot be drops the session.
func (s *session) restoreShares(sh *replayedShares) error {
	for _, e := range sh.ended {
		rpc := s.vdevRPC(e.node)
		if rpc == nil {
			continue // no device there now: the object ended with the frames
		}
		if _, err := rpc.Call(api.OpNodeUnexport, nil, api.Encode(&api.NodeObject{Object: e.object})); err != nil && !errors.Is(err, api.ErrInvalidArgument) {
			return fmt.Errorf("ending shared object %d again: %w", e.object, err)
		}
	}
	for _, va := range slices.Sorted(maps.Keys(sh.exports)) {
		op := sh.exports[va]
		dev, end, err := s.space.Span(va)
		if err != nil {
			return err
		}
		v := s.vdevs[dev]
		r := &sharedRange{base: va, size: end - va, node: v.dev.node,
			object: op.Object, mode: op.Mode, write: op.Mode != api.ModeImmutable, pageSize: pageSizeOf(0)}
		r.home.restored(s.m.node(v.dev.node).bootIfUp(), op.Tenants)
		if err := s.readopt(r, v.rpc); err != nil {
			return fmt.Errorf("export at %#x: %w", va, err)
		}
		for _, tenant := range sh.revoked[va] {
			_, err := v.rpc.Call(api.OpNodeRevoke, nil, api.Encode(&api.NodeRevoke{Object: op.Object, Tenant: tenant}))
			if err != nil && !errors.Is(err, api.ErrInvalidArgument) { // no grant: the node heard it before the death
				return fmt.Errorf("export at %#x: revoking tenant %q's grant again: %w", va, tenant, err)
			}
		}
		s.shares.add(r)
		s.holdVersion(r) // the copy died with the process
	}
	imports := slices.SortedFunc(maps.Values(sh.imports), func(a, b journalOp) int { return cmp.Compare(a.VA, b.VA) })
	for _, op := range imports {
		r := &sharedRange{base: op.VA, size: op.Size, node: s.m.nodeAt(op.Node), addr: op.Node, object: op.Object, imported: true, pageSize: pageSizeOf(0)}
		s.remakeImport(r, op.Node, "restored", true)
		s.shares.add(r)
	}
	return nil
}

// readopt makes rpc, a new connection to the node of r, an export whose
// object the node kept with the parked frames and gave that connection
// (objectTable.adopt), the one r is reached through, and pins its latest
// version again: the node forgot the old connection's pins.
func (s *session) readopt(r *sharedRange, rpc *wire.RPC) error {
	r.version.Store(0)
	r.via.Store(rpc)
	return r.pin(s.log)
}

// remakeImport imports r's object again at r's address (reimport), from
// node (its address); one the node refuses — a grant revoked or an object
// ended since — ends r with why, typed, as a revocation pushed to a live
// session would, and is logged: the rest of the session goes on. what
// says why the import is made again; fresh says r is not yet in the
// session's shares (a restore), so no other goroutine reads it.
func (s *session) remakeImport(r *sharedRange, node, what string, fresh bool) {
	r.version.Store(0) // the node forgot the old connection's pins
	if err := s.reimport(r, fresh); err != nil {
		err = fmt.Errorf("%s import of object %d of node %s: %w", what, r.object, node, err)
		r.ended.Store(&err)
		s.log.WithError(err).Info("a shared buffer the session imported is not made again; its range fails with why")
	}
}

// reimport imports r's object again over the session's connection to its
// node, checking that it is the size the journal says, and pins it. A
// fresh range takes the object's mode, write access and page size from
// the node's answer. A live one's streams read those fields with no lock
// (they are immutable once the range is published: the Go memory model
// orders no later write with those reads), so the node must answer what
// they hold already; an object that changed them is not the one the
// range imported, and fails it.
func (s *session) reimport(r *sharedRange, fresh bool) error {
	if r.node < 0 {
		return fmt.Errorf("not a node of this mediator now: %w", api.ErrUnavailable)
	}
	rpc, err := s.nodeRPC(r.node)
	if err != nil {
		return err
	}
	reply, err := rpc.Call(api.OpNodeImport, nil, api.Encode(&api.NodeObject{Object: r.object}))
	var ir api.NodeImportReply
	if err == nil {
		err = api.Decode(reply, &ir)
	}
	switch {
	case err != nil:
		return err
	case ir.Size != r.size:
		return fmt.Errorf("the node says %d bytes, the journal %d: %w", ir.Size, r.size, api.ErrProtocol)
	}
	mode, write, pageSize := ir.Mode, ir.Write, pageSizeOf(ir.PageSize)
	switch {
	case fresh:
		r.mode, r.write, r.pageSize = mode, write, pageSize
	case mode != r.mode || write != r.write || pageSize != r.pageSize:
		return fmt.Errorf("the node says mode %v, write %v, pages of %d bytes; the range was imported with mode %v, write %v, pages of %d bytes: %w",
			mode, write, pageSize, r.mode, r.write, r.pageSize, api.ErrProtocol)
	}
	r.via.Store(rpc)
	r.home.imported(s.m.node(r.node).bootIfUp(), &ir)
	return r.pin(s.log)
}

// vdevRPC is the session's connection to node idx through one of its
// devices, or nil.
func (s *session) vdevRPC(idx int) *wire.RPC {
	for _, v := range s.vdevs {
		if v.dev.node == idx {
			return v.rpc
		}
	}
	return nil
}
