package mediator

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/memory"
)

// sessionMemory is a session's device memory: its address space, the
// frame source behind it, the budget its allocations are charged to, and
// the credits their seals earned (dedup.go).
//
// Invariant: what the session holds reserved in budget is, over its live
// allocations, footprint less credit (budget.go). An allocation reserves
// its footprint before the space places it (alloc); a seal's credit is
// released as it is recorded (credit); a free releases the footprint less
// the credit, which it forgets (free); the session's end releases what is
// left (releaseAll).
type sessionMemory struct {
	// Fixed by openSession. The space and its source are safe for
	// concurrent use; their locks are taken within their calls, below
	// issueMu.
	space  *memory.Space
	frames *frameSource // the space's source: frames held, by device (self.go)
	budget *budget      // the container's, shared by its sessions, or the session's own
	evicts bool         // the space oversubscribes and may evict
	// durable is the space's store where its evicted chunks outlive the
	// process (residency.go); nil where they are in the host store.
	durable *memory.FileStore
	// frameCredit is what the budget credits for each frame of a sealed
	// weight that its node stores once (dedup.go): (1 − dedup_charge) of a
	// frame for a container's session, 0 on the host socket.
	frameCredit uint64

	// issueMu serialises what changes where the session's memory lives —
	// translation (which may fault in and evict), allocation and free —
	// with issuing the node calls that use the translation. It is first in
	// the session's lock order (the session type).
	issueMu sync.Mutex
	// credits are the budget credits of sealed weights, by allocation
	// address; guarded by issueMu.
	credits map[uint64]uint64
	// grants are the node's grants of frames during the allocation in
	// progress, for its journal record; guarded by issueMu.
	grants [][]uint64
}

// credit records c as the credit of the seal of the allocation at va and
// releases it from the budget. The caller holds issueMu, or the session
// serves no one yet (a replay, resume.go).
func (sm *sessionMemory) credit(va, c uint64) {
	sm.credits[va] = c
	sm.budget.release(c)
}

// releaseAll releases from the budget what the live allocations hold, less
// their credits, as the session ends.
func (sm *sessionMemory) releaseAll() {
	sm.issueMu.Lock()
	var credited uint64
	for _, c := range sm.credits {
		credited += c
	}
	clear(sm.credits)
	sm.issueMu.Unlock()
	sm.budget.release(sm.space.Stats().Allocated - credited)
}

// alloc reserves the allocation's footprint in the session's budget first,
// so a tenant over its limit never holds device memory, even briefly.
func (s *session) alloc(dev uint32, size uint64, hint api.Hint) (uint64, error) {
	foot, err := memory.Footprint(size)
	if err != nil {
		return 0, err
	}
	if err := s.budget.reserve(foot); err != nil {
		return 0, err
	}
	s.issueMu.Lock()
	defer s.issueMu.Unlock()
	s.grants = nil
	va, err := s.space.AllocHint(dev, size, hint)
	if err != nil {
		s.budget.release(foot)
		return 0, err
	}
	s.jr.add(journalOp{Op: opAlloc, Dev: dev, Size: size, Hint: uint8(hint), VA: va, Grants: s.grants})
	// A small allocation may be packed into pages a freed buffer of this
	// session used; only a chunk's last free returns (and scrubs) its frame.
	// Clear them, so new memory reads as zeros.
	if foot < memory.Page2M {
		if err := s.zero(va, size); err != nil {
			s.jr.add(journalOp{Op: opFree, VA: va})
			before := s.space.Stats().Allocated
			ferr := s.space.Free(va)
			s.budget.release(before - s.space.Stats().Allocated)
			return 0, errors.Join(fmt.Errorf("clear new allocation %#x: %w", va, err), ferr)
		}
	}
	return va, nil
}

// zero fills [va, va+n) with zeros and waits. The caller holds issueMu.
func (s *session) zero(va, n uint64) error {
	dev, xs, err := s.space.Translate(va, n)
	if err != nil {
		return err
	}
	v := s.vdevs[dev]
	_, err = v.rpc.Call(api.OpNodeFill, nil, api.Encode(&api.NodeAccess{Device: v.dev.info.Index, Extents: xs}))
	return err
}

// free releases what the space stops accounting for, less the credit its
// seal earned. Only this session's reader allocates and frees in its
// space, so the difference is exact: the allocation's footprint, or 0 where
// nothing was freed.
func (s *session) free(va uint64) error {
	s.issueMu.Lock()
	defer s.issueMu.Unlock()
	if s.jr != nil && s.space.CheckStart("free", va) == nil {
		s.jr.add(journalOp{Op: opFree, VA: va}) // before the node frees its frames
	}
	before := s.space.Stats().Allocated
	err := s.space.Free(va)
	freed := before - s.space.Stats().Allocated
	if freed > 0 {
		freed -= s.credits[va]
		delete(s.credits, va)
	}
	s.budget.release(freed)
	return err
}

// malloc allocates as a Malloc request asks.
func (s *session) malloc(body []byte) (uint64, error) {
	var m api.Malloc
	if err := api.Decode(body, &m); err != nil {
		return 0, err
	}
	if err := m.Check(); err != nil {
		return 0, err
	}
	dev := m.Device
	if m.Flags&api.MallocNear != 0 {
		d, _, err := s.space.Span(m.Near)
		if err != nil {
			return 0, fmt.Errorf("malloc %d bytes near %#x: %w", m.Size, m.Near, err)
		}
		dev = d
	}
	if int(dev) >= len(s.vdevs) {
		return 0, fmt.Errorf("malloc on device %d: session has %d: %w", dev, len(s.vdevs), api.ErrInvalidArgument)
	}
	withStream := m.Flags&api.MallocFreeWithStream != 0
	if withStream {
		if _, err := s.streams.get(m.Stream); err != nil {
			return 0, fmt.Errorf("malloc %d bytes freed with its stream: %w", m.Size, err)
		}
		if m.Stream == api.DefaultStream {
			return 0, fmt.Errorf("malloc %d bytes freed with the default stream, which is never destroyed: %w", m.Size, api.ErrInvalidArgument)
		}
	}
	va, err := s.alloc(dev, m.Size, m.Hint)
	if err != nil {
		return 0, fmt.Errorf("malloc %d bytes (%v) on device %d: %w", m.Size, m.Hint, dev, err)
	}
	if withStream {
		s.jr.add(journalOp{Op: opWith, VA: va, Stream: m.Stream})
		s.streams.freeWith(m.Stream, va)
	}
	return va, nil
}
