package mediator

// Compacting a live session's journal (journal.go): the session's reader
// rewrites it as a snapshot of the session once it has grown to twice what
// its last compaction left, and a restore rebuilds the space from the
// snapshot's layout record before it replays the records after it.

import (
	"fmt"
	"maps"
	"slices"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/memory"
)

// compactJournal rewrites the session's journal as a snapshot of the
// session (sessionLog.compact) once it is due. The session's reader calls
// it between requests: it alone creates and ends streams, graphs and
// shared ranges and journals their records, and it holds issueMu, which
// every allocation, free, seal and credit takes, while the space's
// Snapshot holds allocMu, under which every eviction and fault-in is
// journaled: nothing is journaled between the snapshot and the rename.
// The evicted chunks' entries stay where they are in the store file, the
// layout naming each with its CRC-32C. A snapshot that cannot be taken (a
// chunk's device lost its contents: a restore replays the journal as it
// is instead) or written leaves the journal as it was, to grow on.
func (s *session) compactJournal() {
	if !s.jr.due() {
		return
	}
	s.issueMu.Lock()
	defer s.issueMu.Unlock()
	var ops []journalOp
	for _, va := range slices.Sorted(maps.Keys(s.credits)) {
		ops = append(ops, journalOp{Op: opCredit, VA: va, Credit: s.credits[va]})
	}
	with := s.streams.withLists()
	for _, id := range s.streams.ids() {
		ops = append(ops, journalOp{Op: opStream, Stream: id})
		for _, va := range with[id] {
			ops = append(ops, journalOp{Op: opWith, VA: va, Stream: id})
		}
	}
	nextImport := s.shares.next() // not under allocMu, below: shares.mu is no leaf
	for _, r := range s.shares.list() {
		if r.imported {
			ops = append(ops, journalOp{Op: opImport, VA: r.base, Size: r.size, Object: r.object, Node: r.addr})
		} else {
			ops = append(ops, journalOp{Op: opExport, VA: r.base, Object: r.object, Mode: r.mode, Tenants: r.home.grantList()})
		}
	}
	err := s.space.Snapshot(func(l memory.Layout) error {
		for i, c := range l.Chunks {
			if c.Key == 0 {
				continue
			}
			if s.durable == nil { // not journaled so (journalSession)
				return fmt.Errorf("chunk %#x is evicted to a store in this process: %w", c.VA, api.ErrInternal)
			}
			l.Chunks[i].Sum, _ = s.durable.Sum(c.Key)
		}
		return s.jr.compact(append([]journalOp{{Op: opLayout, Layout: &l, VA: nextImport}}, ops...))
	})
	if err != nil {
		s.jr.postpone()
		s.log.WithError(err).Warn("compacting the session's journal failed; it goes on growing")
	}
}

// replayLayout rebuilds the space as a compaction found it (opLayout),
// the first record after the header, and places the next import where
// the compaction found it would go (past imports freed before, which the
// records do not name any more): the budget reserves every
// allocation's footprint, as their own records would have, the store file
// takes back each entry the layout names, with its CRC-32C (Verify checks
// them once the replay is done), and each resident chunk asks r for its
// frame, which reconcile checks the node kept.
func (s *session) replayLayout(op journalOp, r *replay) error {
	l := op.Layout
	if l == nil {
		return fmt.Errorf("a layout record without a layout: %w", api.ErrInternal)
	}
	if op.VA != 0 && op.VA < importBase {
		return fmt.Errorf("a layout record places the next import at %#x, below where imports go (%#x): %w", op.VA, uint64(importBase), api.ErrInternal)
	}
	s.shares.placeRestored(op.VA, 0)
	var foot uint64
	for _, a := range l.Allocs {
		f, err := memory.Footprint(a.Size)
		if err != nil {
			return err
		}
		if int(a.Dev) >= len(s.vdevs) {
			return fmt.Errorf("allocation %#x on device %d: the session has %d: %w", a.VA, a.Dev, len(s.vdevs), api.ErrInvalidArgument)
		}
		foot += f
	}
	r.grants = nil
	for _, c := range l.Chunks {
		if c.Key != 0 {
			if s.durable == nil {
				return fmt.Errorf("chunk %#x is in a store file, but the session has none now: %w", c.VA, api.ErrInternal)
			}
			if err := s.durable.Adopt(c.Key, c.Sum); err != nil {
				return err
			}
		}
		if c.Resident {
			r.grants = append(r.grants, []uint64{c.Frame})
		}
	}
	if err := s.budget.reserve(foot); err != nil {
		return err
	}
	err := s.space.RestoreLayout(*l)
	r.grants = nil
	if err != nil {
		s.budget.release(foot)
	}
	return err
}

// withLists returns a copy of the allocations freed with each stream, by
// stream, for a journal's compaction.
func (ss *streamSet) withLists() map[uint32][]uint64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make(map[uint32][]uint64, len(ss.withStream))
	for id, vas := range ss.withStream {
		out[id] = slices.Clone(vas)
	}
	return out
}

// next is where the next import goes (0: importBase), for a journal's
// compaction.
func (sh *shareSet) next() uint64 {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.nextImport
}

// list returns the exported and imported ranges, in the order they were
// added.
func (sh *shareSet) list() []*sharedRange {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return slices.Clone(sh.ranges)
}
