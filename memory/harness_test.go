package memory

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/vgpu/vgpu/api/vocab"
	"pgregory.net/rapid"
)

// harness drives several Spaces that share one fakeNode (and, when they
// oversubscribe, one HostStore) and checks them against an independent
// model after every operation. The property test and the fuzz test feed it
// operations; it takes its choices as arguments so both can.
type harness struct {
	t      rapid.TB
	node   *fakeNode
	store  *checkedStore // nil when no space oversubscribes
	spaces []*model
	serial uint64 // tags data stamps
}

// model is what the harness knows about one Space without asking it.
type model struct {
	id       int
	sp       *Space
	limit    uint64
	oversub  bool
	resident int                   // cap on resident chunks; 0 means none
	live     map[uint64]*liveAlloc // by address
	dead     []uint64              // addresses of freed allocations
}

type liveAlloc struct {
	va, size uint64 // size rounded to Page4K
	want     uint64 // size asked for: the addressable bytes
	dev      uint32
	hint     vocab.Hint
	sealed   bool
	// tags[i] names the last write to page i (see stamp); 0 means never
	// written, so its contents are unknown.
	tags []uint64
}

// ukey identifies a 4 KiB physical page.
type ukey struct {
	dev uint32
	pa  uint64
}

// spaceConfig is how the harness makes one space.
type spaceConfig struct {
	limit    uint64
	oversub  bool
	resident int // frames; only with oversub
}

func newHarness(t rapid.TB, node *fakeNode, store *checkedStore, cfgs []spaceConfig) *harness {
	h := &harness{t: t, node: node, store: store}
	for i, cfg := range cfgs {
		var src FrameSource = node.lease(i)
		if cfg.oversub { // a source that refills sealed chunks, shared by all
			src = &refillingLease{lease: node.lease(i)}
		}
		m := &model{id: i, sp: NewSpace(src, cfg.limit), limit: cfg.limit, live: make(map[uint64]*liveAlloc)}
		if cfg.oversub && store != nil {
			m.oversub, m.resident = true, cfg.resident
			m.sp.Oversubscribe(store.store(), uint64(cfg.resident)*FrameSize)
		}
		h.spaces = append(h.spaces, m)
	}
	return h
}

func limitsOnly(limits []uint64) []spaceConfig {
	cfgs := make([]spaceConfig, len(limits))
	for i, l := range limits {
		cfgs[i].limit = l
	}
	return cfgs
}

func (m *model) sorted() []*liveAlloc {
	keys := slices.Sorted(maps.Keys(m.live))
	out := make([]*liveAlloc, len(keys))
	for i, k := range keys {
		out[i] = m.live[k]
	}
	return out
}

func (m *model) allocated() uint64 {
	var n uint64
	for _, a := range m.live {
		n += a.size
	}
	return n
}

func (m *model) pick(pick int) *liveAlloc {
	live := m.sorted()
	if len(live) == 0 {
		return nil
	}
	return live[pick%len(live)]
}

// snapshot is what a failed call must leave as it found it.
type snapshot struct {
	st   Stats
	held map[devFrame]bool
	keys int
}

func (h *harness) snap(m *model) snapshot {
	s := snapshot{st: m.sp.Stats(), held: h.node.held(m.id)}
	s.st.TLBHits, s.st.TLBMisses = 0, 0
	if h.store != nil {
		s.keys = h.store.count()
	}
	return s
}

// checkUnchanged verifies that a failed call left no trace.
func (h *harness) checkUnchanged(what string, m *model, before snapshot) {
	h.t.Helper()
	after := h.snap(m)
	if after.st != before.st {
		h.t.Fatalf("%s changed stats: %+v, was %+v", what, after.st, before.st)
	}
	if !maps.Equal(after.held, before.held) {
		h.t.Fatalf("%s changed the frames held: %d, was %d", what, len(after.held), len(before.held))
	}
	if after.keys != before.keys {
		h.t.Fatalf("%s changed the store: %d entries, was %d", what, after.keys, before.keys)
	}
}

// checkOnlyEvicted verifies that a failed translation left no trace but
// evictions: a fault-in evicts the victims whose frames it gives back
// before it asks for frames, and they stay evicted if it then fails.
func (h *harness) checkOnlyEvicted(what string, m *model, before snapshot) {
	h.t.Helper()
	after := h.snap(m)
	a, b := after.st, before.st
	evicted := int(a.Evictions - b.Evictions)
	switch {
	case a.Allocations != b.Allocations || a.Allocated != b.Allocated || a.Faults != b.Faults:
		h.t.Fatalf("%s changed more than residency: %+v, was %+v", what, a, b)
	case b.Frames-a.Frames != evicted || a.Evicted-b.Evicted != uint64(evicted)*Page2M:
		h.t.Fatalf("%s evicted %d chunks, but holds %d frames, was %d: %+v, was %+v", what, evicted, a.Frames, b.Frames, a, b)
	case after.keys-before.keys != int(a.WriteBacks-b.WriteBacks):
		h.t.Fatalf("%s wrote back %d chunks, but the store has %d entries, had %d", what, a.WriteBacks-b.WriteBacks, after.keys, before.keys)
	}
	for f := range after.held {
		if !before.held[f] {
			h.t.Fatalf("%s left frame %#x of device %d held, which it did not hold before", what, f.frame, f.dev)
		}
	}
}

// alloc allocates size bytes on dev with hint in space si, checks the
// outcome and writes every page of the new allocation, which it returns
// (nil if the allocation failed).
func (h *harness) alloc(si int, dev uint32, size uint64, hint vocab.Hint) *liveAlloc {
	h.t.Helper()
	a := h.allocOnly(si, dev, size, hint)
	if a != nil {
		h.writePages(h.spaces[si], a, 0, a.size, true)
	}
	return a
}

func (h *harness) allocOnly(si int, dev uint32, size uint64, hint vocab.Hint) *liveAlloc {
	h.t.Helper()
	m := h.spaces[si]
	before := h.snap(m)
	va, err := m.sp.AllocHint(dev, size, hint)
	if size == 0 || size > maxAlloc || !hint.Valid() {
		if !errors.Is(err, vocab.ErrInvalidArgument) {
			h.t.Fatalf("alloc %d with hint %v: %v, want ErrInvalidArgument", size, hint, err)
		}
		h.checkUnchanged("bad alloc", m, before)
		return nil
	}
	rounded := (size + Page4K - 1) &^ (Page4K - 1)
	overQuota := m.limit != 0 && m.allocated()+rounded > m.limit
	if err != nil {
		switch {
		case overQuota && !errors.Is(err, vocab.ErrQuotaExceeded):
			h.t.Fatalf("alloc %d over the quota: %v, want ErrQuotaExceeded", size, err)
		case !overQuota && m.oversub && !errors.Is(err, vocab.ErrUnavailable):
			h.t.Fatalf("alloc %d in an oversubscribing space: %v, want success", size, err)
		case !overQuota && !errors.Is(err, vocab.ErrOutOfMemory) && !errors.Is(err, vocab.ErrUnavailable):
			h.t.Fatalf("alloc %d: unexpected error %v", size, err)
		}
		h.checkUnchanged("failed alloc", m, before)
		return nil
	}
	if overQuota {
		h.t.Fatalf("alloc %d succeeded although %d of %d bytes are in use", size, m.allocated(), m.limit)
	}
	align := uint64(Page4K)
	switch {
	case rounded >= Page2M:
		align = Page2M
	case rounded >= Page64K:
		align = Page64K
	}
	if va < vaBase || va%align != 0 {
		h.t.Fatalf("alloc %d: address %#x is not %#x-aligned above %#x", size, va, align, uint64(vaBase))
	}
	for _, o := range m.live {
		if va < o.va+o.size && o.va < va+rounded {
			h.t.Fatalf("alloc %d at %#x overlaps live [%#x, %#x)", size, va, o.va, o.va+o.size)
		}
	}
	if got, sealed, err := m.sp.Hint(va + size - 1); err != nil || got != hint || sealed {
		h.t.Fatalf("alloc %d with hint %v at %#x: Hint says %v, sealed %v, %v", size, hint, va, got, sealed, err)
	}
	a := &liveAlloc{va: va, size: rounded, want: size, dev: dev, hint: hint, tags: make([]uint64, rounded/Page4K)}
	m.live[va] = a
	m.dead = slices.DeleteFunc(m.dead, func(d uint64) bool { return d >= va && d < va+rounded })
	return a
}

// writePages writes pages [off, off+n) of a (offsets multiples of Page4K)
// with a fresh tag: chunk by chunk if piecewise, else in one translation.
// A sealed allocation refuses, and keeps its tags.
func (h *harness) writePages(m *model, a *liveAlloc, off, n uint64, piecewise bool) {
	h.t.Helper()
	for end := off + n; off < end; {
		step := end - off
		if piecewise {
			step = min(step, Page2M-(a.va+off)%Page2M)
		}
		if xs, ok := h.touch(m, a, off, step, true); ok {
			h.serial++
			h.node.stamp(a.dev, xs, h.serial, off/Page4K)
			for p := off / Page4K; p < (off+step)/Page4K; p++ {
				a.tags[p] = h.serial
			}
		}
		off += step
	}
}

// touch translates [off, off+n) of a, whole pages for writing if write,
// else the bytes as asked, and checks the outcome: the runs against the
// page table, the data in them against the model, or, on failure, that it
// was allowed (a write to a sealed allocation, or out of memory where the
// harness cannot rule it out) and left no trace.
func (h *harness) touch(m *model, a *liveAlloc, off, n uint64, write bool) ([]vocab.Extent, bool) {
	h.t.Helper()
	must := h.mustFit(m, a, off, n)
	before := h.snap(m)
	var dev uint32
	var xs []vocab.Extent
	var err error
	if write {
		dev, xs, err = m.sp.translatePages(a.va+off, n, true)
	} else {
		dev, xs, err = m.sp.Translate(a.va+off, n)
	}
	switch {
	case write && a.sealed:
		if !errors.Is(err, vocab.ErrPermissionDenied) {
			h.t.Fatalf("space %d: write translation of %#x+%d in sealed allocation %#x: %v, want ErrPermissionDenied", m.id, a.va+off, n, a.va, err)
		}
		h.checkUnchanged("refused write translation", m, before)
		return nil, false
	case err != nil:
		if must != "" || !errors.Is(err, vocab.ErrOutOfMemory) {
			h.t.Fatalf("space %d: translate %#x+%d: %v (must succeed: %s)", m.id, a.va+off, n, err, must)
		}
		h.checkOnlyEvicted("failed translate", m, before)
		return nil, false
	}
	if dev != a.dev {
		h.t.Fatalf("space %d: translate %#x+%d: device %d, want %d", m.id, a.va+off, n, dev, a.dev)
	}
	if want := h.walkExtents(m, a.va+off, n); !slices.Equal(xs, want) {
		h.t.Fatalf("space %d: translate %#x+%d = %v, the page table says %v", m.id, a.va+off, n, xs, want)
	}
	if st := m.sp.Stats(); st.Resident > uint64(m.resident)*FrameSize && m.resident != 0 {
		h.t.Fatalf("space %d: %d bytes resident over the cap of %d frames", m.id, st.Resident, m.resident)
	}
	first := off &^ (Page4K - 1)
	if err := h.node.checkStamps(a.dev, h.walkExtents(m, a.va+first, (off+n+Page4K-1)&^(Page4K-1)-first), a.tags[first/Page4K:], first/Page4K); err != nil {
		h.t.Fatalf("space %d: allocation %#x lost its data: %v", m.id, a.va, err)
	}
	return xs, true
}

// mustFit says why translating [off, off+n) of a must succeed, or "" if
// it may fail with out-of-memory: the range spans more chunks than the cap,
// or the device and the store lack room for what must be faulted in and
// evicted.
func (h *harness) mustFit(m *model, a *liveAlloc, off, n uint64) string {
	if !m.oversub {
		return "no oversubscription"
	}
	chunks, evicted := 0, 0
	for cva := (a.va + off) &^ (Page2M - 1); cva < a.va+off+n; cva += Page2M {
		chunks++
		if !m.sp.chunkState(cva).resident {
			evicted++
		}
	}
	switch {
	case evicted == 0:
		return "every chunk is resident"
	case m.resident != 0 && chunks > m.resident:
		return ""
	case h.node.free(a.dev) >= evicted && h.store.room() >= evicted:
		return fmt.Sprintf("%d chunks to fault in, %d free frames, room for %d entries", evicted, h.node.free(a.dev), h.store.room())
	}
	return ""
}

// walkExtents translates [va, va+n) through the page table alone.
func (h *harness) walkExtents(m *model, va, n uint64) []vocab.Extent {
	h.t.Helper()
	m.sp.mu.Lock()
	defer m.sp.mu.Unlock()
	var xs []vocab.Extent
	for cur, stop := va, va+n; cur < stop; {
		l, ok := m.sp.pt.walk(cur)
		if !ok {
			h.t.Fatalf("space %d: %#x is not mapped after a translation", m.id, cur)
		}
		next := min(stop, (cur|(Page4K-1))+1)
		pa := l.pa + (cur - l.base)
		if k := len(xs) - 1; k >= 0 && xs[k].Addr+xs[k].Len == pa {
			xs[k].Len += next - cur
		} else {
			xs = append(xs, vocab.Extent{Addr: pa, Len: next - cur})
		}
		cur = next
	}
	return xs
}

// translateAll translates, in one call, up to three ranges of live
// allocations of space si (the same one possibly more than once), chosen
// from picks and offs, for writing where writes says so (it may be short),
// and checks each as touch does.
func (h *harness) translateAll(si int, picks []int, offs []uint64, writes []bool) {
	h.t.Helper()
	m := h.spaces[si]
	if len(m.live) == 0 {
		return
	}
	var rs []Range
	var as []*liveAlloc
	refused := false // a range writes a sealed allocation
	for i, p := range picks {
		a := m.pick(p)
		off := offs[2*i] % a.want
		n := 1 + offs[2*i+1]%(a.want-off)
		write := i < len(writes) && writes[i]
		rs = append(rs, Range{VA: a.va + off, Len: n, Write: write})
		as = append(as, a)
		refused = refused || write && a.sealed
	}
	// Whether it must fit: as in mustFit, over the chunks of all ranges.
	must := !m.oversub
	if m.oversub {
		chunks := make(map[uint64]bool)
		need := make(map[uint32]int)
		total := 0
		for i, r := range rs {
			for cva := r.VA &^ (Page2M - 1); cva < r.VA+r.Len; cva += Page2M {
				if chunks[cva] {
					continue
				}
				chunks[cva] = true
				if !m.sp.chunkState(cva).resident {
					need[as[i].dev]++
					total++
				}
			}
		}
		must = total == 0 || (m.resident == 0 || len(chunks) <= m.resident) && h.store.room() >= total
		for dev, n := range need {
			must = must && (total == 0 || h.node.free(dev) >= n)
		}
	}
	before := h.snap(m)
	ts, err := m.sp.TranslateAll(rs)
	if refused {
		if !errors.Is(err, vocab.ErrPermissionDenied) {
			h.t.Fatalf("space %d: translate %v, writing a sealed allocation: %v, want ErrPermissionDenied", m.id, rs, err)
		}
		h.checkUnchanged("refused translate of several ranges", m, before)
		return
	}
	if err != nil {
		if must || !errors.Is(err, vocab.ErrOutOfMemory) {
			h.t.Fatalf("space %d: translate %v: %v (must succeed: %v)", m.id, rs, err, must)
		}
		h.checkOnlyEvicted("failed translate of several ranges", m, before)
		return
	}
	for i, r := range rs {
		a := as[i]
		if ts[i].Dev != a.dev {
			h.t.Fatalf("space %d: translate %v: range %d on device %d, want %d", m.id, rs, i, ts[i].Dev, a.dev)
		}
		if want := h.walkExtents(m, r.VA, r.Len); !slices.Equal(ts[i].Extents, want) {
			h.t.Fatalf("space %d: translate %v: range %d = %v, the page table says %v", m.id, rs, i, ts[i].Extents, want)
		}
		first := (r.VA - a.va) &^ (Page4K - 1)
		end := (r.VA - a.va + r.Len + Page4K - 1) &^ (Page4K - 1)
		if err := h.node.checkStamps(a.dev, h.walkExtents(m, a.va+first, end-first), a.tags[first/Page4K:], first/Page4K); err != nil {
			h.t.Fatalf("space %d: allocation %#x lost its data: %v", m.id, a.va, err)
		}
	}
	if !m.sp.Resident(rs...) {
		h.t.Fatalf("space %d: ranges %v not resident right after their translation", m.id, rs)
	}
}

// free frees the pick-th live allocation of space si.
func (h *harness) free(si, pick int) {
	h.t.Helper()
	m := h.spaces[si]
	a := m.pick(pick)
	if a == nil {
		return
	}
	if err := m.sp.Free(a.va); err != nil {
		h.t.Fatalf("free %#x: %v", a.va, err)
	}
	delete(m.live, a.va)
	m.dead = append(m.dead, a.va)
}

// translate translates n bytes at offset off of the pick-th live allocation
// (clamped to fit), checking the runs and the data in them.
func (h *harness) translate(si, pick int, off, n uint64) {
	h.t.Helper()
	m := h.spaces[si]
	a := m.pick(pick)
	if a == nil {
		return
	}
	off %= a.want
	n = 1 + n%(a.want-off)
	h.touch(m, a, off, n, false)
}

// write writes whole pages from offset off of the pick-th live allocation.
func (h *harness) write(si, pick int, off, n uint64) {
	h.t.Helper()
	m := h.spaces[si]
	a := m.pick(pick)
	if a == nil {
		return
	}
	off = off % a.size &^ (Page4K - 1)
	n = Page4K * (1 + n%((a.size-off)/Page4K))
	h.writePages(m, a, off, n, false)
}

// evict evicts the chunk at offset off of the pick-th live allocation or,
// if coldest, the least recently used chunk of space si.
func (h *harness) evict(si, pick int, off uint64, coldest bool) {
	h.t.Helper()
	m := h.spaces[si]
	var va uint64
	if !coldest {
		a := m.pick(pick)
		if a == nil {
			return
		}
		va = a.va + off%a.size
	}
	before := h.snap(m)
	cs := m.sp.chunkState(va)
	wasResident := h.residentChunks(m)
	reads := h.node.readCount()
	ok, err := m.sp.evict(va)
	switch {
	case !m.oversub:
		if !errors.Is(err, vocab.ErrInvalidArgument) || ok {
			h.t.Fatalf("space %d: evict without oversubscription: %v, want ErrInvalidArgument", m.id, err)
		}
		h.checkUnchanged("evict without oversubscription", m, before)
	case err != nil:
		if !errors.Is(err, vocab.ErrOutOfMemory) || h.store.room() != 0 {
			h.t.Fatalf("space %d: evict %#x: %v, with room for %d entries", m.id, va, err, h.store.room())
		}
		h.checkUnchanged("failed evict", m, before)
	case !ok:
		if before.st.Frames != 0 && (coldest || cs.resident) {
			h.t.Fatalf("space %d: evict %#x (resident %v) evicted nothing of %d frames", m.id, va, cs.resident, before.st.Frames)
		}
		h.checkUnchanged("evict of nothing", m, before)
	default:
		st := m.sp.Stats()
		// A clean chunk keeps its entry and is not read; any other gets
		// a new entry, read from the device.
		wb := st.WriteBacks - before.st.WriteBacks
		if st.Evictions != before.st.Evictions+1 || st.Frames != before.st.Frames-1 || st.Evicted != before.st.Evicted+Page2M ||
			wb+st.CleanEvictions-before.st.CleanEvictions != 1 || h.store.count() != before.keys+int(wb) || h.node.readCount() != reads+int(wb) {
			h.t.Fatalf("space %d: evict %#x: stats %+v, were %+v; %d entries, were %d", m.id, va, st, before.st, h.store.count(), before.keys)
		}
		if !coldest {
			if m.sp.chunkState(va).resident {
				h.t.Fatalf("space %d: evicted chunk %#x is still resident", m.id, va)
			}
			if clean := cs.stored; clean != (wb == 0) {
				h.t.Fatalf("space %d: evict %#x, which kept entry %v: %d write-backs", m.id, va, clean, wb)
			}
			return
		}
		// The victim is of the lowest class resident.
		var victim chunkState
		lowest := lastRank
		for cva, was := range wasResident {
			if !m.sp.chunkState(cva).resident {
				victim = was
			}
			lowest = min(lowest, evictRank[was.hint])
		}
		if evictRank[victim.hint] != lowest {
			h.t.Fatalf("space %d: evicted a chunk of hint %v while one of class %d was resident", m.id, victim.hint, lowest)
		}
	}
}

// residentChunks returns the state of each resident chunk of space m, by
// address.
func (h *harness) residentChunks(m *model) map[uint64]chunkState {
	out := make(map[uint64]chunkState)
	for _, a := range m.live {
		for cva := a.va &^ (Page2M - 1); cva < a.va+a.size; cva += Page2M {
			if cs := m.sp.chunkState(cva); cs.resident {
				out[cva] = cs
			}
		}
	}
	return out
}

// seal seals the pick-th live allocation of space si, perhaps again, as
// sealAlloc does.
func (h *harness) seal(si, pick int, off uint64) {
	h.t.Helper()
	if a := h.spaces[si].pick(pick); a != nil {
		h.sealAlloc(si, a, off)
	}
}

// sealAlloc seals a, a live allocation of space si, and checks that it
// changed nothing else and that Hint, asked at offset off, reports it.
func (h *harness) sealAlloc(si int, a *liveAlloc, off uint64) {
	h.t.Helper()
	m := h.spaces[si]
	before := h.snap(m)
	if err := m.sp.Seal(a.va); err != nil {
		h.t.Fatalf("space %d: seal %#x: %v", m.id, a.va, err)
	}
	a.sealed = true
	h.checkUnchanged("seal", m, before)
	va := a.va + off%a.want
	if hint, sealed, err := m.sp.Hint(va); err != nil || hint != a.hint || !sealed {
		h.t.Fatalf("space %d: hint of %#x in sealed allocation %#x of hint %v: %v, sealed %v, %v", m.id, va, a.va, a.hint, hint, sealed, err)
	}
}

// sealFrames seals the pick-th live allocation of space si, then its whole
// chunks at the source, as the mediator seals a weight on its node. The
// node then refuses to refill those frames, and check reports any fault-in
// that tries.
func (h *harness) sealFrames(si, pick int) {
	h.t.Helper()
	m := h.spaces[si]
	a := m.pick(pick)
	if a == nil {
		return
	}
	h.sealAlloc(si, a, 0)
	first, last := (a.va+Page2M-1)&^(Page2M-1), (a.va+a.want)&^(Page2M-1)
	if last <= first {
		return
	}
	must := h.mustFit(m, a, first-a.va, last-first)
	before := h.snap(m)
	ts, err := m.sp.TranslateAll([]Range{{VA: first, Len: last - first, SealFrames: true}})
	if err != nil {
		if must != "" || !errors.Is(err, vocab.ErrOutOfMemory) {
			h.t.Fatalf("space %d: translate %#x+%d to seal its frames: %v (must succeed: %s)", m.id, first, last-first, err, must)
		}
		h.checkOnlyEvicted("failed translate to seal frames", m, before)
		return
	}
	if want := h.walkExtents(m, first, last-first); !slices.Equal(ts[0].Extents, want) {
		h.t.Fatalf("space %d: translate %#x+%d to seal its frames = %v, the page table says %v", m.id, first, last-first, ts[0].Extents, want)
	}
	h.node.lease(m.id).seal(a.dev, ts[0].Extents)
}

// failingIO translates (whole pages of) part of an allocation while the
// node fails its next Read, Write or Zero, or, with grant, its next Grant.
// The translation may fail with that error or out of memory; either way
// check must then find every byte where it was.
func (h *harness) failingIO(si, pick int, off, n uint64, grant bool) {
	h.t.Helper()
	m := h.spaces[si]
	a := m.pick(pick)
	if a == nil {
		return
	}
	off = off % a.size &^ (Page4K - 1)
	n = Page4K * (1 + n%((a.size-off)/Page4K))
	h.node.mu.Lock()
	if grant {
		h.node.failGrant = fmt.Errorf("node lost: %w", vocab.ErrUnavailable)
	} else {
		h.node.failIO = fmt.Errorf("node lost: %w", vocab.ErrUnavailable)
	}
	h.node.mu.Unlock()
	_, _, err := m.sp.translatePages(a.va+off, n, false)
	h.node.mu.Lock()
	h.node.failIO, h.node.failGrant = nil, nil
	h.node.mu.Unlock()
	if err != nil && !errors.Is(err, vocab.ErrUnavailable) && !errors.Is(err, vocab.ErrOutOfMemory) {
		h.t.Fatalf("space %d: translate %#x+%d with failing I/O: %v", m.id, a.va+off, n, err)
	}
}

// misuse makes a call that must fail with ErrInvalidAddress.
func (h *harness) misuse(si, kind, pick int, x uint64) {
	h.t.Helper()
	m := h.spaces[si]
	live := m.sorted()
	var err error
	var what string
	switch {
	case kind%5 == 0 && len(m.dead) > 0:
		va := m.dead[pick%len(m.dead)]
		what = "free of a freed allocation"
		if err = m.sp.Free(va); errors.Is(err, vocab.ErrInvalidAddress) {
			_, _, err = m.sp.Translate(va, 1)
			what = "translate of a freed allocation"
		}
	case kind%5 == 1 && len(live) > 0:
		a := live[pick%len(live)]
		what = "free inside an allocation"
		err = m.sp.Free(a.va + 1 + x%(a.size-1))
	case kind%5 == 2 && len(live) > 0:
		a := live[pick%len(live)]
		off := x % a.want
		what = "translate past the end"
		_, _, err = m.sp.Translate(a.va+off, a.want-off+1+x%Page2M)
	case kind%5 == 3 && len(live) > 0:
		a := live[pick%len(live)]
		what = "seal inside an allocation"
		before := h.snap(m)
		err = m.sp.Seal(a.va + 1 + x%(a.size-1))
		h.checkUnchanged(what, m, before)
	default:
		what = "free below the address space"
		err = m.sp.Free(x % vaBase)
	}
	if !errors.Is(err, vocab.ErrInvalidAddress) {
		h.t.Fatalf("%s: %v, want ErrInvalidAddress", what, err)
	}
}

// failingGrant allocates while the node fails the next Grant; the
// allocation may still succeed if it needs no frame, otherwise it must fail
// without a trace.
func (h *harness) failingGrant(si int, dev uint32, size uint64, hint vocab.Hint) {
	h.t.Helper()
	h.node.mu.Lock()
	h.node.failGrant = vocab.ErrUnavailable
	h.node.mu.Unlock()
	a := h.allocOnly(si, dev, size, hint)
	h.node.mu.Lock()
	h.node.failGrant = nil
	h.node.mu.Unlock()
	if a != nil {
		h.writePages(h.spaces[si], a, 0, a.size, true)
	}
}

// check verifies every invariant of every open space against the model.
func (h *harness) check() {
	h.t.Helper()
	used := make(map[ukey]uint64) // physical page -> virtual page, across spaces
	keys := make(map[uint64]int)  // store key -> space
	for _, m := range h.spaces {
		if m.sp == nil {
			continue
		}
		h.checkSpace(m, used, keys)
	}
	h.node.mu.Lock()
	defer h.node.mu.Unlock()
	if len(h.node.violations) > 0 {
		h.t.Fatalf("node saw bad calls: %v", h.node.violations)
	}
	if h.store != nil {
		if live := h.store.keys(); !maps.Equal(live, mapKeys(keys)) {
			h.t.Fatalf("the store holds %d entries, the spaces' evicted chunks %d", len(live), len(keys))
		}
		if v := h.store.problems(); len(v) > 0 {
			h.t.Fatalf("store misuse: %v", v)
		}
	}
}

func mapKeys(m map[uint64]int) map[uint64]bool {
	out := make(map[uint64]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func (h *harness) checkSpace(m *model, used map[ukey]uint64, keys map[uint64]int) {
	h.t.Helper()
	st := m.sp.Stats()
	held := h.node.held(m.id)
	if st.Allocations != len(m.live) || st.Allocated != m.allocated() {
		h.t.Fatalf("space %d: stats %+v, model has %d allocations of %d bytes", m.id, st, len(m.live), m.allocated())
	}
	if m.limit != 0 && st.Allocated > m.limit {
		h.t.Fatalf("space %d: %d bytes allocated over the limit %d", m.id, st.Allocated, m.limit)
	}
	if st.Frames != len(held) || st.Mapped != uint64(len(held))*FrameSize || st.Resident != st.Mapped {
		h.t.Fatalf("space %d: stats say %d frames (%d bytes, %d resident), node says %d", m.id, st.Frames, st.Mapped, st.Resident, len(held))
	}
	if m.resident != 0 && st.Frames > m.resident {
		h.t.Fatalf("space %d: %d frames over the cap of %d", m.id, st.Frames, m.resident)
	}
	if st.WriteBacks+st.CleanEvictions != st.Evictions {
		h.t.Fatalf("space %d: %d write-backs and %d clean evictions of %d", m.id, st.WriteBacks, st.CleanEvictions, st.Evictions)
	}

	// Look at every page of every allocation: where it is, and what it holds.
	pages := make(map[uint64]uint64, st.Allocated/Page4K) // virtual page -> physical page, resident ones
	var order []uint64                                    // the keys of pages, ascending
	framesUsed := make(map[devFrame]bool)
	chunks := make(map[uint64]chunkState)
	stored := make(map[uint64][]byte) // contents by key
	for _, a := range m.sorted() {
		if d, e, err := m.sp.Span(a.va + a.want - 1); err != nil || d != a.dev || e != a.va+a.want {
			h.t.Fatalf("space %d: span of %#x: end %#x, %v; want %#x", m.id, a.va, e, err, a.va+a.want)
		}
		if _, _, err := m.sp.Translate(a.va, a.want+1); !errors.Is(err, vocab.ErrInvalidAddress) {
			h.t.Fatalf("space %d: translate one byte past the %d bytes asked at %#x: %v, want ErrInvalidAddress", m.id, a.want, a.va, err)
		}
		for off := uint64(0); off < a.size; off += Page4K {
			va := a.va + off
			cva := va &^ (Page2M - 1)
			cs, seen := chunks[cva]
			if !seen {
				cs = m.sp.chunkState(va)
				chunks[cva] = cs
				if !cs.ok || cs.dev != a.dev || cs.hint != a.hint {
					h.t.Fatalf("space %d: page %#x of allocation %#x on device %d with hint %v lies in chunk %+v", m.id, va, a.va, a.dev, a.hint, cs)
				}
				if !m.oversub && !cs.resident {
					h.t.Fatalf("space %d does not oversubscribe, but chunk %#x is evicted", m.id, cva)
				}
				if cs.stored {
					if other, dup := keys[cs.key]; dup {
						h.t.Fatalf("space %d: chunk %#x has store key %d, which space %d also holds", m.id, cva, cs.key, other)
					}
					keys[cs.key] = m.id
				}
			}
			tag := a.tags[off/Page4K]
			switch {
			case cs.resident:
				m.sp.mu.Lock()
				l, ok := m.sp.pt.walk(va)
				m.sp.mu.Unlock()
				p := l.pa + (va - l.base)
				if !ok || p != cs.frame+va-cva {
					h.t.Fatalf("space %d: page %#x maps to %#x (%v), not to its offset in frame %#x", m.id, va, p, ok, cs.frame)
				}
				f := devFrame{a.dev, cs.frame}
				if !held[f] {
					h.t.Fatalf("space %d: %#x maps to %#x on device %d, a frame it does not hold", m.id, va, p, a.dev)
				}
				framesUsed[f] = true
				k := ukey{a.dev, p}
				if other, dup := used[k]; dup {
					h.t.Fatalf("space %d: %#x and %#x both map to %#x on device %d", m.id, other, va, p, a.dev)
				}
				used[k] = va
				pages[va] = p
				order = append(order, va)
				if tag != 0 {
					if err := checkStamp(h.node.bytes(a.dev, p)[p%FrameSize:], tag, off/Page4K); err != nil {
						h.t.Fatalf("space %d: page %#x of allocation %#x, at %#x: %v", m.id, va, a.va, p, err)
					}
				}
				if cs.stored && !a.sealed {
					h.t.Fatalf("space %d: resident chunk %#x keeps entry %d, but allocation %#x in it is not sealed", m.id, cva, cs.key, a.va)
				}
			case !cs.stored && tag != 0:
				h.t.Fatalf("space %d: page %#x was written, but its chunk is evicted with no contents", m.id, va)
			}
			// An entry, also one a resident chunk keeps, has the contents.
			if cs.stored && tag != 0 {
				b := stored[cs.key]
				if b == nil {
					b = make([]byte, FrameSize)
					if err := h.store.inner.Get(cs.key, b); err != nil {
						h.t.Fatalf("space %d: store entry %d of chunk %#x: %v", m.id, cs.key, cva, err)
					}
					stored[cs.key] = b
				}
				if err := checkStamp(b[va-cva:], tag, off/Page4K); err != nil {
					h.t.Fatalf("space %d: page %#x of allocation %#x, in entry %d (chunk resident: %v): %v", m.id, va, a.va, cs.key, cs.resident, err)
				}
			}
		}
		if m.oversub {
			continue
		}
		// Without oversubscription every allocation is resident, and
		// Translate of the whole must agree with the page table.
		dev, xs, err := m.sp.translatePages(a.va, a.size, false)
		if err != nil || dev != a.dev || !slices.Equal(xs, h.walkExtents(m, a.va, a.size)) {
			h.t.Fatalf("space %d: translate %#x+%d: device %d, %v, %v", m.id, a.va, a.size, dev, xs, err)
		}
		for i, x := range xs {
			if i > 0 && xs[i-1].Addr+xs[i-1].Len == x.Addr {
				h.t.Fatalf("space %d: translate %#x: adjacent runs %v not merged", m.id, a.va, xs)
			}
		}
	}
	var resident, evicted uint64
	for _, cs := range chunks {
		if cs.resident {
			resident += Page2M
		} else {
			evicted += Page2M
		}
	}
	if st.Resident != resident || st.Evicted != evicted {
		h.t.Fatalf("space %d: stats say %d bytes resident and %d evicted, the chunks %d and %d", m.id, st.Resident, st.Evicted, resident, evicted)
	}
	if len(framesUsed) != len(held) {
		h.t.Fatalf("space %d holds %d frames but uses %d: unused frames are not returned", m.id, len(held), len(framesUsed))
	}
	h.checkLeaves(m, pages, order, st)
}

// checkLeaves compares the page table's leaf of every mapped page with the
// leaf an independent model expects: the largest region around the page
// that is fully mapped, physically contiguous and aligned.
func (h *harness) checkLeaves(m *model, pages map[uint64]uint64, order []uint64, st Stats) {
	h.t.Helper()
	qualifies := func(va, size uint64) bool {
		base := va &^ (size - 1)
		pa0, ok := pages[base]
		if !ok || pa0%size != 0 {
			return false
		}
		for off := uint64(Page4K); off < size; off += Page4K {
			if pa, ok := pages[base+off]; !ok || pa != pa0+off {
				return false
			}
		}
		return true
	}
	var bytes [numClasses]uint64
	memo := make(map[[2]uint64]bool)
	cached := func(va, size uint64) bool {
		k := [2]uint64{va &^ (size - 1), size}
		v, ok := memo[k]
		if !ok {
			v = qualifies(va, size)
			memo[k] = v
		}
		return v
	}
	for _, va := range order {
		want := class4K
		switch {
		case cached(va, Page2M):
			want = class2M
		case cached(va, Page64K):
			want = class64K
		}
		m.sp.mu.Lock()
		l, ok := m.sp.pt.walk(va)
		m.sp.mu.Unlock()
		if !ok || l.class != want || l.pa+(va-l.base) != pages[va] {
			h.t.Fatalf("space %d: page %#x: leaf %+v (mapped %v), want class %d at %#x", m.id, va, l, ok, want, pages[va])
		}
		bytes[want] += Page4K
	}
	if st.Mapped4K != bytes[class4K] || st.Mapped64K != bytes[class64K] || st.Mapped2M != bytes[class2M] {
		h.t.Fatalf("space %d: leaf bytes 4K/64K/2M %d/%d/%d, model %v", m.id, st.Mapped4K, st.Mapped64K, st.Mapped2M, bytes)
	}
}

// closeSpace closes space si and checks that exactly its frames came back,
// each once, that its store entries were dropped, and that it refuses
// further use.
func (h *harness) closeSpace(si int) {
	h.t.Helper()
	m := h.spaces[si]
	if m.sp == nil {
		return
	}
	held := h.node.held(m.id)
	h.node.mu.Lock()
	already := len(h.node.returns[m.id])
	h.node.mu.Unlock()
	var mine []uint64
	for _, a := range m.live {
		for cva := a.va &^ (Page2M - 1); cva < a.va+a.size; cva += Page2M {
			if cs := m.sp.chunkState(cva); cs.stored {
				mine = append(mine, cs.key)
			}
		}
	}
	if err := m.sp.Close(); err != nil {
		h.t.Fatalf("close space %d: %v", m.id, err)
	}
	h.node.mu.Lock()
	returned := slices.Clone(h.node.returns[m.id][already:])
	h.node.mu.Unlock()
	got := make(map[devFrame]bool)
	for _, f := range returned {
		if got[f] {
			h.t.Fatalf("close space %d returned frame %#x of device %d twice", m.id, f.frame, f.dev)
		}
		got[f] = true
	}
	if !maps.Equal(got, held) {
		h.t.Fatalf("close space %d returned %d frames, held %d", m.id, len(got), len(held))
	}
	if h.store != nil {
		live := h.store.keys()
		for _, k := range mine {
			if live[k] {
				h.t.Fatalf("close space %d kept store entry %d", m.id, k)
			}
		}
	}
	if st := m.sp.Stats(); st.Allocations != 0 || st.Allocated != 0 || st.Frames != 0 || st.Mapped4K+st.Mapped64K+st.Mapped2M != 0 ||
		st.Resident != 0 || st.Evicted != 0 {
		h.t.Fatalf("close space %d: stats after %+v", m.id, st)
	}
	if _, err := m.sp.Alloc(0, Page4K); !errors.Is(err, vocab.ErrInvalidArgument) {
		h.t.Fatalf("alloc after close: %v, want ErrInvalidArgument", err)
	}
	for _, a := range m.live {
		if _, _, err := m.sp.Translate(a.va, 1); !errors.Is(err, vocab.ErrInvalidArgument) {
			h.t.Fatalf("translate after close: %v, want ErrInvalidArgument", err)
		}
	}
	m.sp = nil
}

// closeAll closes every space in order, then checks that the node has
// every frame back and the store is empty, and closes the store.
func (h *harness) closeAll(order []int) {
	h.t.Helper()
	for _, i := range order {
		h.closeSpace(i)
	}
	if n := len(h.node.owner); n != 0 {
		h.t.Fatalf("%d frames still leased after every space closed", n)
	}
	if h.store == nil {
		return
	}
	if v := h.store.problems(); len(v) > 0 {
		h.t.Fatalf("store misuse: %v", v)
	}
	if st := h.store.inner.Stats(); len(h.store.keys()) != 0 || st.RAM != 0 || st.Spilled != 0 {
		h.t.Fatalf("store keeps %d entries (%+v) after every space closed", len(h.store.keys()), st)
	}
	if err := h.store.inner.Close(); err != nil {
		h.t.Fatalf("close store: %v", err)
	}
}

// checkedStore wraps a HostStore and checks how spaces use it: every key
// they Get or Drop is one they Put and did not Drop yet.
type checkedStore struct {
	inner *HostStore
	lend  bool // whether spaces see the lending interface

	mu     sync.Mutex
	live   map[uint64]bool
	misuse []string
}

func newCheckedStore(inner *HostStore, lend bool) *checkedStore {
	return &checkedStore{inner: inner, lend: lend, live: make(map[uint64]bool)}
}

// store returns the Store spaces use: with or without lending.
func (c *checkedStore) store() Store {
	if c.lend {
		return lendingStore{c}
	}
	return c
}

func (c *checkedStore) added(key uint64, err error) (uint64, error) {
	if err == nil {
		c.mu.Lock()
		if c.live[key] {
			c.misuse = append(c.misuse, fmt.Sprintf("key %d handed out twice", key))
		}
		c.live[key] = true
		c.mu.Unlock()
	}
	return key, err
}

func (c *checkedStore) using(op string, key uint64, drop bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live[key] {
		c.misuse = append(c.misuse, fmt.Sprintf("%s of key %d, which is not stored", op, key))
	}
	if drop {
		delete(c.live, key)
	}
}

func (c *checkedStore) Put(p []byte) (uint64, error) { return c.added(c.inner.Put(p)) }

func (c *checkedStore) Get(key uint64, p []byte) error {
	c.using("get", key, false)
	return c.inner.Get(key, p)
}

func (c *checkedStore) Drop(key uint64) {
	c.using("drop", key, true)
	c.inner.Drop(key)
}

func (c *checkedStore) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live)
}

func (c *checkedStore) keys() map[uint64]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.live)
}

func (c *checkedStore) problems() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.misuse)
}

// room returns how many more entries the store takes.
func (c *checkedStore) room() int {
	st := c.inner.Stats()
	n := int((st.Budget - st.RAM) / FrameSize)
	switch {
	case !st.SpillFile:
	case st.SpillLimit == 0:
		n += 1 << 20
	default:
		n += int((st.SpillLimit - st.Spilled) / FrameSize)
	}
	return n
}

// lendingStore is a checkedStore that offers the lending interface.
type lendingStore struct{ *checkedStore }

func (l lendingStore) putFrom(fill func(b []byte) error) (uint64, error) {
	return l.added(l.inner.putFrom(fill))
}

func (l lendingStore) view(key uint64, f func(b []byte) error) error {
	l.using("view", key, false)
	return l.inner.view(key, f)
}

// stamp writes, at the start and end of every 4 KiB physical page of xs, a
// word naming the write (tag) and the page's index in its allocation,
// counting from first. Placement works in whole pages, so this catches any
// misplacement, overlap or loss.
func (n *fakeNode) stamp(dev uint32, xs []vocab.Extent, tag, first uint64) {
	i := first
	for _, x := range xs {
		for p := x.Addr; p < x.Addr+x.Len; p += Page4K {
			b := n.bytes(dev, p)[p%FrameSize:]
			binary.LittleEndian.PutUint64(b, tag<<32|i)
			binary.LittleEndian.PutUint64(b[Page4K-8:], ^(tag<<32 | i))
			i++
		}
	}
}

// checkStamps verifies the stamps of the pages of xs, which are pages
// first, first+1, ... of an allocation, against tags, their tags in order
// (0: not written, not checked). It describes the first mismatch.
func (n *fakeNode) checkStamps(dev uint32, xs []vocab.Extent, tags []uint64, first uint64) error {
	i := uint64(0)
	for _, x := range xs {
		for p := x.Addr; p < x.Addr+x.Len; p += Page4K {
			if tag := tags[i]; tag != 0 {
				if err := checkStamp(n.bytes(dev, p)[p%FrameSize:], tag, first+i); err != nil {
					return fmt.Errorf("page %d at physical %#x: %v", first+i, p, err)
				}
			}
			i++
		}
	}
	return nil
}

// checkStamp checks the stamp at the start of b (a page) for the write tag
// of page index i.
func checkStamp(b []byte, tag, i uint64) error {
	want := tag<<32 | i
	got := binary.LittleEndian.Uint64(b)
	got2 := ^binary.LittleEndian.Uint64(b[Page4K-8:])
	if got != want || got2 != want {
		return fmt.Errorf("stamps %#x/%#x, want %#x", got, got2, want)
	}
	return nil
}

// sliceExtents cuts [off, off+n) out of the runs xs.
func sliceExtents(xs []vocab.Extent, off, n uint64) []vocab.Extent {
	var out []vocab.Extent
	for _, x := range xs {
		if off >= x.Len {
			off -= x.Len
			continue
		}
		take := min(x.Len-off, n)
		out = append(out, vocab.Extent{Addr: x.Addr + off, Len: take})
		off, n = 0, n-take
		if n == 0 {
			break
		}
	}
	return out
}
