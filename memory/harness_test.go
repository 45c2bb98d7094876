package memory

import (
	"errors"
	"maps"
	"slices"

	"github.com/vgpu/vgpu/api"
	"pgregory.net/rapid"
)

// harness drives several Spaces that share one fakeNode and checks them
// against an independent model after every operation. The property test
// and the fuzz test feed it operations; it takes its choices as arguments
// so both can.
type harness struct {
	t      rapid.TB
	node   *fakeNode
	spaces []*model
	serial uint64 // tags allocations for the data stamps
}

// model is what the harness knows about one Space without asking it.
type model struct {
	id    int
	sp    *Space
	limit uint64
	live  map[uint64]*liveAlloc // by address
	dead  []uint64              // addresses of freed allocations
}

type liveAlloc struct {
	va, size uint64 // size rounded to Page4K
	want     uint64 // size asked for: the addressable bytes
	dev      uint32
	tag      uint64
}

// ukey identifies a 4 KiB physical page.
type ukey struct {
	dev uint32
	pa  uint64
}

func newHarness(t rapid.TB, node *fakeNode, limits []uint64) *harness {
	h := &harness{t: t, node: node}
	for i, limit := range limits {
		h.spaces = append(h.spaces, &model{id: i, sp: NewSpace(node.lease(i), limit), limit: limit, live: make(map[uint64]*liveAlloc)})
	}
	return h
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

// alloc allocates size bytes on dev in space si and checks the outcome.
func (h *harness) alloc(si int, dev uint32, size uint64) {
	h.t.Helper()
	m := h.spaces[si]
	before := m.sp.Stats()
	held := h.node.held(m.id)
	va, err := m.sp.Alloc(dev, size)
	if size == 0 || size > maxAlloc {
		if !errors.Is(err, api.ErrInvalidArgument) {
			h.t.Fatalf("alloc %d: %v, want ErrInvalidArgument", size, err)
		}
		h.checkUnchanged("bad alloc", m, before, held)
		return
	}
	rounded := (size + Page4K - 1) &^ (Page4K - 1)
	overQuota := m.limit != 0 && m.allocated()+rounded > m.limit
	if err != nil {
		switch {
		case overQuota && !errors.Is(err, api.ErrQuotaExceeded):
			h.t.Fatalf("alloc %d over the quota: %v, want ErrQuotaExceeded", size, err)
		case !overQuota && !errors.Is(err, api.ErrOutOfMemory) && !errors.Is(err, api.ErrUnavailable):
			h.t.Fatalf("alloc %d: unexpected error %v", size, err)
		}
		h.checkUnchanged("failed alloc", m, before, held)
		return
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
	h.serial++
	a := &liveAlloc{va: va, size: rounded, want: size, dev: dev, tag: h.serial}
	m.live[va] = a
	m.dead = slices.DeleteFunc(m.dead, func(d uint64) bool { return d >= va && d < va+rounded })
	_, xs, err := m.sp.translatePages(va, rounded)
	if err != nil {
		h.t.Fatalf("translate new allocation %#x+%d: %v", va, rounded, err)
	}
	h.node.stampPages(dev, xs, a.tag)
}

// checkUnchanged verifies that a failed call left no trace.
func (h *harness) checkUnchanged(what string, m *model, before Stats, held map[devFrame]bool) {
	h.t.Helper()
	after := m.sp.Stats()
	before.TLBHits, before.TLBMisses, after.TLBHits, after.TLBMisses = 0, 0, 0, 0
	if after != before {
		h.t.Fatalf("%s changed stats: %+v, was %+v", what, after, before)
	}
	if now := h.node.held(m.id); !maps.Equal(now, held) {
		h.t.Fatalf("%s changed the frames held: %d, was %d", what, len(now), len(held))
	}
}

// free frees the pick-th live allocation of space si.
func (h *harness) free(si, pick int) {
	h.t.Helper()
	m := h.spaces[si]
	live := m.sorted()
	if len(live) == 0 {
		return
	}
	a := live[pick%len(live)]
	if err := m.sp.Free(a.va); err != nil {
		h.t.Fatalf("free %#x: %v", a.va, err)
	}
	delete(m.live, a.va)
	m.dead = append(m.dead, a.va)
}

// translate translates n bytes at offset off of the pick-th live allocation
// (clamped to fit) and checks it against a translation of the whole.
func (h *harness) translate(si, pick int, off, n uint64) {
	h.t.Helper()
	m := h.spaces[si]
	live := m.sorted()
	if len(live) == 0 {
		return
	}
	a := live[pick%len(live)]
	off %= a.want
	n = 1 + n%(a.want-off)
	dev, xs, err := m.sp.Translate(a.va+off, n)
	if err != nil || dev != a.dev {
		h.t.Fatalf("translate %#x+%d: device %d, %v; want device %d", a.va+off, n, dev, err, a.dev)
	}
	_, whole, err := m.sp.Translate(a.va, a.want)
	if err != nil {
		h.t.Fatalf("translate %#x+%d: %v", a.va, a.want, err)
	}
	if want := sliceExtents(whole, off, n); !slices.Equal(xs, want) {
		h.t.Fatalf("translate %#x+%d = %v, want %v (cut from %v)", a.va+off, n, xs, want, whole)
	}
}

// sliceExtents cuts [off, off+n) out of the runs xs.
func sliceExtents(xs []api.Extent, off, n uint64) []api.Extent {
	var out []api.Extent
	for _, x := range xs {
		if off >= x.Len {
			off -= x.Len
			continue
		}
		take := min(x.Len-off, n)
		out = append(out, api.Extent{Addr: x.Addr + off, Len: take})
		off, n = 0, n-take
		if n == 0 {
			break
		}
	}
	return out
}

// misuse makes a call that must fail with ErrInvalidAddress.
func (h *harness) misuse(si, kind, pick int, x uint64) {
	h.t.Helper()
	m := h.spaces[si]
	live := m.sorted()
	var err error
	var what string
	switch {
	case kind%4 == 0 && len(m.dead) > 0:
		va := m.dead[pick%len(m.dead)]
		what = "free of a freed allocation"
		if err = m.sp.Free(va); errors.Is(err, api.ErrInvalidAddress) {
			_, _, err = m.sp.Translate(va, 1)
			what = "translate of a freed allocation"
		}
	case kind%4 == 1 && len(live) > 0:
		a := live[pick%len(live)]
		what = "free inside an allocation"
		err = m.sp.Free(a.va + 1 + x%(a.size-1))
	case kind%4 == 2 && len(live) > 0:
		a := live[pick%len(live)]
		off := x % a.want
		what = "translate past the end"
		_, _, err = m.sp.Translate(a.va+off, a.want-off+1+x%Page2M)
	default:
		what = "free below the address space"
		err = m.sp.Free(x % vaBase)
	}
	if !errors.Is(err, api.ErrInvalidAddress) {
		h.t.Fatalf("%s: %v, want ErrInvalidAddress", what, err)
	}
}

// failingGrant allocates while the node fails the next Grant; the
// allocation may still succeed if it needs no frame, otherwise it must fail
// without a trace.
func (h *harness) failingGrant(si int, dev uint32, size uint64) {
	h.t.Helper()
	h.node.mu.Lock()
	h.node.failGrant = api.ErrUnavailable
	h.node.mu.Unlock()
	h.alloc(si, dev, size)
	h.node.mu.Lock()
	h.node.failGrant = nil
	h.node.mu.Unlock()
}

// check verifies every invariant of every open space against the model.
func (h *harness) check() {
	h.t.Helper()
	used := make(map[ukey]uint64) // physical page -> virtual page, across spaces
	for _, m := range h.spaces {
		if m.sp == nil {
			continue
		}
		h.checkSpace(m, used)
	}
	h.node.mu.Lock()
	defer h.node.mu.Unlock()
	if len(h.node.violations) > 0 {
		h.t.Fatalf("node saw bad returns: %v", h.node.violations)
	}
}

func (h *harness) checkSpace(m *model, used map[ukey]uint64) {
	h.t.Helper()
	st := m.sp.Stats()
	held := h.node.held(m.id)
	if st.Allocations != len(m.live) || st.Allocated != m.allocated() {
		h.t.Fatalf("space %d: stats %+v, model has %d allocations of %d bytes", m.id, st, len(m.live), m.allocated())
	}
	if m.limit != 0 && st.Allocated > m.limit {
		h.t.Fatalf("space %d: %d bytes allocated over the limit %d", m.id, st.Allocated, m.limit)
	}
	if st.Frames != len(held) || st.Mapped != uint64(len(held))*FrameSize {
		h.t.Fatalf("space %d: stats say %d frames (%d bytes), node says %d", m.id, st.Frames, st.Mapped, len(held))
	}
	if sum := st.Mapped4K + st.Mapped64K + st.Mapped2M; sum != st.Allocated {
		h.t.Fatalf("space %d: leaves map %d bytes, %d allocated", m.id, sum, st.Allocated)
	}

	// Translate every allocation; collect each page's physical address.
	pages := make(map[uint64]uint64, st.Allocated/Page4K) // virtual page -> physical page
	var order []uint64                                    // the keys of pages, ascending
	framesUsed := make(map[devFrame]bool)
	for _, a := range m.sorted() {
		dev, xs, err := m.sp.translatePages(a.va, a.size)
		if err != nil || dev != a.dev || api.ExtentsLen(xs) != a.size {
			h.t.Fatalf("space %d: translate %#x+%d: device %d, %d bytes, %v", m.id, a.va, a.size, dev, api.ExtentsLen(xs), err)
		}
		if d, e, err := m.sp.Span(a.va + a.want - 1); err != nil || d != a.dev || e != a.va+a.want {
			h.t.Fatalf("space %d: span of %#x: end %#x, %v; want %#x", m.id, a.va, e, err, a.va+a.want)
		}
		if _, _, err := m.sp.Translate(a.va, a.want+1); !errors.Is(err, api.ErrInvalidAddress) {
			h.t.Fatalf("space %d: translate one byte past the %d bytes asked at %#x: %v, want ErrInvalidAddress", m.id, a.want, a.va, err)
		}
		va := a.va
		for i, x := range xs {
			if i > 0 && xs[i-1].Addr+xs[i-1].Len == x.Addr {
				h.t.Fatalf("space %d: translate %#x: adjacent runs %v not merged", m.id, a.va, xs)
			}
			for p := x.Addr; p < x.Addr+x.Len; p += Page4K {
				f := devFrame{a.dev, p &^ (FrameSize - 1)}
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
				va += Page4K
			}
		}
		if err := h.node.checkStamps(a.dev, xs, a.tag); err != nil {
			h.t.Fatalf("space %d: allocation %#x lost its data: %v", m.id, a.va, err)
		}
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
// each once, and that it refuses further use.
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
	if st := m.sp.Stats(); st.Allocations != 0 || st.Allocated != 0 || st.Frames != 0 || st.Mapped4K+st.Mapped64K+st.Mapped2M != 0 {
		h.t.Fatalf("close space %d: stats after %+v", m.id, st)
	}
	if _, err := m.sp.Alloc(0, Page4K); !errors.Is(err, api.ErrInvalidArgument) {
		h.t.Fatalf("alloc after close: %v, want ErrInvalidArgument", err)
	}
	for _, a := range m.live {
		if _, _, err := m.sp.Translate(a.va, 1); !errors.Is(err, api.ErrInvalidArgument) {
			h.t.Fatalf("translate after close: %v, want ErrInvalidArgument", err)
		}
	}
	m.sp = nil
}
