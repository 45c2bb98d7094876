package mediator

// The evicted memory of an oversubscribing session that survives a
// restart. Where the mediator keeps a journal (journal.go), the space of
// an oversubscribing session keeps its evicted chunks in a file of its
// own beside its journal, <id>.store (memory.FileStore), not in the
// mediator's host store, whose memory dies with the process; and the
// journal records each change of a chunk's residency (memory.Residency):
// an eviction with the store key and the entry's CRC-32C, a fault-in with
// the frame the chunk went to.
//
// Invariants:
//   - An eviction's record is written after its contents are in the file
//     and before its frame is unmapped, returned to the node or reused; a
//     fault-in's after its frame is filled and before its store entry is
//     dropped (and its slot reused). A mediator that dies in between
//     leaves a journal that still holds true: the chunk is where the last
//     record says, and what it was put in since is unmapped frames, which
//     the restore's reconcile frees, or a slot no record names.
//   - Records of residency are written under the space's allocMu, which
//     orders them with every allocation, free and seal (all under the
//     session's issueMu), so replaying the journal in order — allocations
//     through the same placement, then each eviction and fault-in
//     (memory.Space.RestoreEvicted, RestoreResident) — rebuilds the same
//     chunks in the same frames and slots.
//   - A restore adopts each entry the records name and checks every one
//     still held at the end against its CRC-32C (memory.FileStore.Verify)
//     before the session is served: a damaged or cut store file drops
//     the session whole, as a damaged record does.
//   - The store file lives as long as the journal: deleted with it
//     (journal.drop), kept with it on a handover or a crash.

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/memory"
)

const storeSuffix = ".store"

// storePath is the file of session id's evicted chunks.
func (j *journal) storePath(id uint64) string {
	return filepath.Join(j.dir, strconv.FormatUint(id, 10)+storeSuffix)
}

// evictionStore returns the store for the evicted chunks of s, an
// oversubscribing session of container ctr (nil: the host socket's): a
// file beside its journal where the mediator journals — opened again for
// a session a restart rebuilds (restoring), created otherwise —
// else the container's view of the host store, or the host store. A
// store file that cannot be made leaves the session's evicted memory in
// this process: it will not be journaled (journalSession).
func (m *Mediator) evictionStore(s *session, ctr *container, restoring bool) memory.Store {
	var store memory.Store = m.store // the host's own programs borrow from it
	var bound *memory.BoundedStore
	if ctr != nil {
		store, bound = ctr.store, ctr.store // set when its tenant oversubscribes
	}
	if m.jr == nil {
		return store
	}
	open := memory.CreateFileStore
	if restoring {
		open = memory.OpenFileStore
	}
	fs, err := open(m.jr.storePath(s.id), bound)
	if err != nil {
		if !restoring { // a restore without its file is dropped, saying so (rebuild)
			s.log.WithError(err).Warn("evicted memory kept in this process: the session will not survive a mediator restart")
		}
		return store
	}
	s.durable = fs
	s.space.SetResidency(residencyJournal{s})
	return fs
}

// residencyJournal journals the residency changes of a session's space.
type residencyJournal struct{ s *session }

func (r residencyJournal) Evicted(dev uint32, va, key uint64) {
	sum, _ := r.s.durable.Sum(key)
	r.s.jr.add(journalOp{Op: opEvict, Dev: dev, VA: va, Key: key, Sum: sum})
}

func (r residencyJournal) Resident(dev uint32, va, frame uint64, keep bool) {
	r.s.jr.add(journalOp{Op: opResident, Dev: dev, VA: va, Frame: frame, Keep: keep})
}

// replayResidency replays an eviction or a fault-in record of s, a
// session being rebuilt, whose frame source is r.
func (s *session) replayResidency(op journalOp, r *replay) error {
	if s.durable == nil {
		return fmt.Errorf("a chunk's residency is journaled, but the session has no store file now (it does not oversubscribe, or the file is gone): %w", api.ErrInternal)
	}
	if op.Op == opEvict {
		if err := s.durable.Adopt(op.Key, op.Sum); err != nil {
			return err
		}
		return s.space.RestoreEvicted(op.VA, op.Key)
	}
	r.grants = [][]uint64{{op.Frame}}
	err := s.space.RestoreResident(op.VA, op.Frame, op.Keep)
	r.grants = nil
	return err
}

// storedBytes is the bytes of evicted chunks in the session's store file.
func (s *session) storedBytes() uint64 {
	if s.durable == nil {
		return 0
	}
	return s.durable.Bytes()
}

// closeStore closes the session's store file, as its space is closed; the
// journal's end deletes it (journal.drop).
func (s *session) closeStore() {
	if s.durable == nil {
		return
	}
	if err := s.durable.Close(); err != nil {
		s.log.WithError(err).Warn("closing the store file of the session's evicted memory")
	}
	if s.jr == nil { // not journaled: nothing restores it
		if err := s.durable.Remove(); err != nil {
			s.log.WithError(err).Warn("deleting the store file of the session's evicted memory")
		}
	}
}
