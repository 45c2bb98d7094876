package coherence

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

// HomeConfig describes a shared object to its home.
type HomeConfig struct {
	Mode  vocab.Mode
	Pages uint32 // coherence pages in the object, at least 1
	// Lease is how long a coherent read's copy stays valid (coherent mode
	// only, > 0). A write waits at most this long for a reader that does
	// not acknowledge its invalidation.
	Lease time.Duration
	Owner CacheID // the one cache of a private object
	// Published is the version a versioned object starts published at: 0
	// (as 1) for a new export, the version a copy held elsewhere had for
	// an object restored after its node restarted, so that readers who
	// pinned it find it under the same number.
	Published uint64
}

// WriteID names a write at its home, from 1 in the order writes began.
type WriteID uint64

// Write is a write of one page at the home.
type Write struct {
	ID     WriteID
	Writer CacheID
	Page   uint32
	// Version the page has once this write commits. In versioned mode it
	// is the draft version the write lands in, known only from Ready on
	// (BeginWrite returns 0).
	Version uint64
	// Inval lists the caches to send Inval(Page, Version) to; each answers
	// with InvalAck. Set by BeginWrite only.
	Inval []CacheID
	// Deadline is when Ready will return this write, once the writes
	// ahead of it have committed, even if no InvalAck arrives. Set by
	// BeginWrite only.
	Deadline time.Duration
}

// HomeStats counts a home's protocol messages, since it was made.
type HomeStats struct {
	Reads     uint64 // read requests (Read calls)
	Writes    uint64 // write requests accepted (BeginWrite calls that succeeded)
	Invals    uint64 // invalidations to send (caches listed in Write.Inval)
	InvalAcks uint64 // acknowledgements received, stale ones included
	Expired   uint64 // invalidations Ready stopped waiting for: the lease ran out
	Commits   uint64
}

// lease is a cache's registration as a reader of a page, valid while
// now < until.
type lease struct {
	cache CacheID
	until time.Duration
}

// homePage is the directory entry of a page.
//
// Invariants: queue[0], if any, is the write in progress; waiting holds
// the caches it still waits for, and is empty when queue is or when
// applying (Ready has returned queue[0]). While queue is not empty,
// sharers is empty: a write takes the page's sharers into its waiting
// list, and reads register nobody until the queue drains, so the writes
// behind the first need no invalidation.
type homePage struct {
	version  uint64
	sharers  []lease // sorted by cache, expired ones until pruned
	queue    []Write // FIFO; Inval and Deadline cleared
	waiting  []lease
	applying bool
	ready    time.Duration // when queue[0] is ready without more acks
}

type pin struct {
	cache   CacheID
	version uint64
}

// Home is the directory of one shared object at its home node. See the
// package comment for how to drive it; it is not safe for concurrent use.
type Home struct {
	cfg       HomeConfig
	sealed    bool
	current   uint64 // versioned: the published version, from 1
	pages     map[uint32]*homePage
	pins      map[pin]int
	lastWrite WriteID
	stats     HomeStats
}

// NewHome returns the directory of an object nobody has read or written.
func NewHome(cfg HomeConfig) (*Home, error) {
	if !cfg.Mode.Valid() {
		return nil, fmt.Errorf("coherence mode %v: %w", cfg.Mode, vocab.ErrInvalidArgument)
	}
	if cfg.Pages == 0 {
		return nil, fmt.Errorf("coherent object of 0 pages: %w", vocab.ErrInvalidArgument)
	}
	if cfg.Mode == vocab.ModeCoherent && cfg.Lease <= 0 {
		return nil, fmt.Errorf("coherent object with lease %v: want > 0: %w", cfg.Lease, vocab.ErrInvalidArgument)
	}
	return &Home{cfg: cfg, current: max(cfg.Published, 1), pages: make(map[uint32]*homePage), pins: make(map[pin]int)}, nil
}

// Mode is the object's mode.
func (h *Home) Mode() vocab.Mode { return h.cfg.Mode }

// Stats returns the home's counters.
func (h *Home) Stats() HomeStats { return h.stats }

func (h *Home) checkPage(page uint32) error {
	if page >= h.cfg.Pages {
		return fmt.Errorf("page %d of an object of %d pages: %w", page, h.cfg.Pages, vocab.ErrInvalidArgument)
	}
	return nil
}

func (h *Home) checkOwner(c CacheID) error {
	if h.cfg.Mode == vocab.ModePrivate && c != h.cfg.Owner {
		return fmt.Errorf("cache %d: private object of cache %d: %w", c, h.cfg.Owner, vocab.ErrPermissionDenied)
	}
	return nil
}

// Read serves cache c's read of page at now, and says which version the
// reply carries and how long c may cache it; the caller sends the page's
// data at that version. version names the version to read of a versioned
// object, which c must have pinned, and is ignored in other modes.
//
// Coherent: while no write of the page is in progress, c is registered as
// a reader until now+Lease, and the grant is Lease (renewed if c was
// registered already). While one is, the grant is 0: the reply is current
// and may be returned, but not cached. Immutable: 0 until sealed, then
// Forever. Private: Forever, to the owner only (vocab.ErrPermissionDenied
// for others). Versioned: Forever. No mode but coherent registers
// anything, so no other mode ever invalidates.
func (h *Home) Read(c CacheID, page uint32, version uint64, now time.Duration) (ReadGrant, error) {
	if err := h.checkPage(page); err != nil {
		return ReadGrant{}, err
	}
	if err := h.checkOwner(c); err != nil {
		return ReadGrant{}, err
	}
	if h.cfg.Mode == vocab.ModeVersioned {
		if h.pins[pin{c, version}] == 0 {
			return ReadGrant{}, fmt.Errorf("read of version %d by cache %d, which has not pinned it: %w", version, c, vocab.ErrInvalidArgument)
		}
		h.stats.Reads++
		return ReadGrant{Version: version, Lease: Forever}, nil
	}
	h.stats.Reads++
	p := h.pages[page]
	g := ReadGrant{Sealed: h.sealed}
	if p != nil {
		g.Version = p.version
		if len(p.queue) > 0 {
			return g, nil
		}
	}
	switch h.cfg.Mode {
	case vocab.ModeCoherent:
		if p == nil {
			p = &homePage{}
			h.pages[page] = p
		}
		p.register(c, now+h.cfg.Lease, now)
		g.Lease = h.cfg.Lease
	case vocab.ModeImmutable:
		if h.sealed {
			g.Lease = Forever
		}
	case vocab.ModePrivate:
		g.Lease = Forever
	}
	return g, nil
}

// register makes c a reader until until, dropping registrations that have
// expired by now.
func (p *homePage) register(c CacheID, until, now time.Duration) {
	p.sharers = slices.DeleteFunc(p.sharers, func(l lease) bool { return l.until <= now && l.cache != c })
	i, found := slices.BinarySearchFunc(p.sharers, c, func(l lease, c CacheID) int { return cmp.Compare(l.cache, c) })
	if found {
		p.sharers[i].until = max(p.sharers[i].until, until)
		return
	}
	p.sharers = slices.Insert(p.sharers, i, lease{c, until})
}

// BeginWrite queues writer's write of page at now, and returns it with the
// caches to invalidate and the time by which Ready will return it. The
// writer's own copy is not invalidated: its cache dropped it and stopped
// caching the page when it sent the write (Cache.StartWrite). The caller
// keeps the write's data until Ready returns it.
//
// Writes of a sealed immutable object are refused with
// vocab.ErrPermissionDenied, as are a private object's writes by any cache
// but its owner.
func (h *Home) BeginWrite(writer CacheID, page uint32, now time.Duration) (Write, error) {
	if err := h.checkPage(page); err != nil {
		return Write{}, err
	}
	if err := h.checkOwner(writer); err != nil {
		return Write{}, err
	}
	if h.sealed {
		return Write{}, fmt.Errorf("write of page %d: object is sealed: %w", page, vocab.ErrPermissionDenied)
	}
	h.stats.Writes++
	p := h.pages[page]
	if p == nil {
		p = &homePage{}
		h.pages[page] = p
	}
	h.lastWrite++
	w := Write{ID: h.lastWrite, Writer: writer, Page: page}
	if h.cfg.Mode != vocab.ModeVersioned {
		w.Version = p.version + uint64(len(p.queue)) + 1
	}
	if len(p.queue) == 0 {
		p.ready = now
		for _, l := range p.sharers {
			if l.cache != writer && l.until > now {
				p.waiting = append(p.waiting, l)
				w.Inval = append(w.Inval, l.cache)
				p.ready = max(p.ready, l.until)
			}
		}
		p.sharers = nil
		h.stats.Invals += uint64(len(w.Inval))
	}
	w.Deadline = p.ready
	p.queue = append(p.queue, Write{ID: w.ID, Writer: writer, Page: page, Version: w.Version})
	return w, nil
}

// InvalAck records cache c's acknowledgement of Inval(page, version). An
// acknowledgement of a write that has committed already (it stopped
// waiting when c's lease expired) is ignored.
func (h *Home) InvalAck(c CacheID, page uint32, version uint64) error {
	if err := h.checkPage(page); err != nil {
		return err
	}
	h.stats.InvalAcks++
	p := h.pages[page]
	if p == nil || len(p.queue) == 0 || p.queue[0].Version != version {
		return nil
	}
	p.waiting = slices.DeleteFunc(p.waiting, func(l lease) bool { return l.cache == c })
	return nil
}

// Ready returns the write in progress on page if it may be applied at now:
// every cache it invalidated has acknowledged or its lease has expired.
// Once it has said so it says so until Commit. The write stays in
// progress, so the page's readers get no lease, until Commit: the caller
// applies its data at the home (or, for a kernel's write, lets the kernel
// run to completion) and then calls Commit.
func (h *Home) Ready(page uint32, now time.Duration) (Write, bool) {
	p := h.pages[page]
	if p == nil || len(p.queue) == 0 {
		return Write{}, false
	}
	for _, l := range p.waiting {
		if l.until > now {
			return Write{}, false
		}
	}
	h.stats.Expired += uint64(len(p.waiting))
	p.waiting = nil
	p.applying = true
	w := p.queue[0]
	if h.cfg.Mode == vocab.ModeVersioned {
		w.Version = h.current + 1
	}
	return w, true
}

// Commit ends the write in progress on page, which Ready has returned, and
// returns it: the page's version is now the write's. The caller
// acknowledges the writer with WriteAck(w.Page, w.Version). The next write
// of the page, if one waits, is ready at once: loop on Ready and Commit
// until Ready reports false.
func (h *Home) Commit(page uint32) (Write, error) {
	p := h.pages[page]
	if p == nil || !p.applying {
		return Write{}, fmt.Errorf("commit of page %d: no write is ready there: %w", page, vocab.ErrInvalidArgument)
	}
	h.stats.Commits++
	w := p.queue[0]
	p.queue = slices.Delete(p.queue, 0, 1)
	p.applying = false
	if h.cfg.Mode == vocab.ModeVersioned {
		w.Version = h.current + 1
	} else {
		p.version = w.Version
	}
	return w, nil
}

// Seal makes an immutable object read-only: writes that have begun still
// commit, later ones are refused, and reads of pages no write is pending
// on are granted Forever. Sealing twice is harmless.
func (h *Home) Seal() error {
	if h.cfg.Mode != vocab.ModeImmutable {
		return fmt.Errorf("seal of a %v object: %w", h.cfg.Mode, vocab.ErrInvalidArgument)
	}
	h.sealed = true
	return nil
}

// Pin makes cache c a reader of the published version of a versioned
// object, and returns it. The version, and the node's copy of its pages,
// stays until c unpins it as often as it pinned it, or is forgotten.
func (h *Home) Pin(c CacheID) (uint64, error) {
	if h.cfg.Mode != vocab.ModeVersioned {
		return 0, fmt.Errorf("pin of a %v object: %w", h.cfg.Mode, vocab.ErrInvalidArgument)
	}
	h.pins[pin{c, h.current}]++
	return h.current, nil
}

// Pins is how many pins cache c holds, each Pin counted until undone.
func (h *Home) Pins(c CacheID) int {
	n := 0
	for k, count := range h.pins {
		if k.cache == c {
			n += count
		}
	}
	return n
}

// PinnedVersions is how many distinct versions some cache pins.
func (h *Home) PinnedVersions() int {
	vs := map[uint64]bool{}
	for k := range h.pins {
		vs[k.version] = true
	}
	return len(vs)
}

// Unpin undoes one Pin of version by cache c.
func (h *Home) Unpin(c CacheID, version uint64) error {
	k := pin{c, version}
	if h.pins[k] == 0 {
		return fmt.Errorf("unpin of version %d by cache %d, which has not pinned it: %w", version, c, vocab.ErrInvalidArgument)
	}
	if h.pins[k]--; h.pins[k] == 0 {
		delete(h.pins, k)
	}
	return nil
}

// Forget drops every pin of cache c, whose mediator is gone. Its read
// leases stay until they expire: a mediator cut off from the node may
// still be serving reads from its copies.
func (h *Home) Forget(c CacheID) {
	for k := range h.pins {
		if k.cache == c {
			delete(h.pins, k)
		}
	}
}

// Publish makes the draft of a versioned object (the published version
// and every write committed since) the published version, and returns it.
// Writes that commit later land in the next draft. It fails with
// vocab.ErrUnavailable while a write is being applied (between Ready and
// Commit), which would otherwise be split between two versions.
func (h *Home) Publish() (uint64, error) {
	if h.cfg.Mode != vocab.ModeVersioned {
		return 0, fmt.Errorf("publish of a %v object: %w", h.cfg.Mode, vocab.ErrInvalidArgument)
	}
	for pg, p := range h.pages {
		if p.applying {
			return 0, fmt.Errorf("publish while write %d of page %d is being applied: %w", p.queue[0].ID, pg, vocab.ErrUnavailable)
		}
	}
	h.current++
	return h.current, nil
}

// Live lists, ascending, the versions of a versioned object whose pages
// the node must keep besides the draft: the published one and every pinned
// one. Other versions' copies may be freed. Objects of other modes have
// none.
func (h *Home) Live() []uint64 {
	if h.cfg.Mode != vocab.ModeVersioned {
		return nil
	}
	vs := []uint64{h.current}
	for k := range h.pins {
		vs = append(vs, k.version)
	}
	slices.Sort(vs)
	return slices.Compact(vs)
}
