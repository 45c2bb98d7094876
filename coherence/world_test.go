package coherence

import (
	"cmp"
	"container/list"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

// This file is a world for the model checker (model_test.go) and the
// property test (property_test.go): one coherent object at its Home, the
// Cache of each of several mediators, clients that read and write pages
// through them, and a network that delivers the messages in flight in any
// order. The node's data of a page is modelled as the sequence of the
// client write ids committed to it, so a version is the length of that
// sequence and a copy's data tells which writes it reflects.

const obj = 7 // the world's object

type wconf struct {
	caches, pages int
	writes        int // client writes in a run
	lease, margin time.Duration
	capacity      int64
	crash         bool // one cache may crash
	drops         int  // Drops of the object, by any cache, in a run
	maxReads      int  // reads in flight per cache and page
	maxCacheReads int  // reads in flight per cache, if not 0
	maxWrites     int  // writes in flight per cache
	readOnly      int  // caches 0..readOnly-1 only read
	writeOnly     int  // the next writeOnly caches only write
	// eager: the node commits a write as soon as it is ready, in the same
	// step as the event or the tick that made it so. Otherwise a commit is
	// an action of its own, which may come any time later.
	eager bool
}

type msgKind uint8

const (
	mReadReq  msgKind = iota // cache → home
	mReadResp                // home → cache
	mWriteReq                // cache → home
	mWriteAck                // home → cache
	mInval                   // home → cache
	mInvalAck                // cache → home
)

var msgNames = [...]string{"ReadReq", "ReadResp", "WriteReq", "WriteAck", "Inval", "InvalAck"}

func (k msgKind) toHome() bool { return k == mReadReq || k == mWriteReq || k == mInvalAck }

type msg struct {
	kind    msgKind
	cache   int // the cache that sends or receives it
	page    uint32
	version uint64 // WriteAck, Inval, InvalAck
	wid     byte   // client write id: WriteReq, WriteAck
	ticket  Ticket // ReadReq, ReadResp
	grant   ReadGrant
	data    string // ReadResp
}

func (m msg) String() string {
	s := fmt.Sprintf("%s(cache %d, page %d", msgNames[m.kind], m.cache, m.page)
	switch m.kind {
	case mReadReq:
		s += fmt.Sprintf(", sent at %d", m.ticket.Sent)
	case mReadResp:
		s += fmt.Sprintf(", sent at %d, v%d %q, lease %d", m.ticket.Sent, m.grant.Version, m.data, m.grant.Lease)
	case mWriteReq:
		s += fmt.Sprintf(", w%d", m.wid)
	case mWriteAck:
		s += fmt.Sprintf(", w%d, v%d", m.wid, m.version)
	default:
		s += fmt.Sprintf(", v%d", m.version)
	}
	return s + ")"
}

// clock is a participant's clock: offset + now*rate/100 at real time now.
type clock struct{ offset, rate int64 }

func (c clock) at(now time.Duration) time.Duration {
	return time.Duration(c.offset + int64(now)*c.rate/100)
}

type ack struct {
	wid     byte
	page    uint32
	version uint64
}

type world struct {
	conf    *wconf
	now     time.Duration // real time
	clocks  []clock       // [0] the home's, [1+c] cache c's; nil: all read real time
	home    *Home
	log     []string // per page: the ids of the writes committed, in order
	caches  []*Cache
	crashed int // the crashed cache, or -1
	dropped int // Drops so far
	reads   [][]int
	writes  []int
	issued  int // client writes issued
	acked   []ack
	writeOf map[WriteID]byte // the node's buffer: home write → client write id
	msgs    []msg
	trace   []string // actions taken, when tracing
	// Copy on write: a clone shares the home and caches of its original
	// until it changes them (mutHome, mutCache).
	ownHome   bool
	ownCaches uint64 // bit c: caches[c] is this world's own
}

func newWorld(conf *wconf, clocks []clock) (*world, error) {
	h, err := NewHome(HomeConfig{Mode: vocab.ModeCoherent, Pages: uint32(conf.pages), Lease: conf.lease})
	if err != nil {
		return nil, err
	}
	w := &world{conf: conf, clocks: clocks, home: h, log: make([]string, conf.pages), crashed: -1,
		writes: make([]int, conf.caches), writeOf: map[WriteID]byte{}, ownHome: true, ownCaches: ^uint64(0)}
	for range conf.caches {
		c, err := NewCache(conf.capacity, conf.margin)
		if err != nil {
			return nil, err
		}
		w.caches = append(w.caches, c)
		w.reads = append(w.reads, make([]int, conf.pages))
	}
	return w, nil
}

// local is participant i's clock (0: the home, 1+c: cache c).
func (w *world) local(i int) time.Duration {
	if w.clocks == nil {
		return w.now
	}
	return w.clocks[i].at(w.now)
}

func (w *world) clone() *world {
	n := *w
	n.ownHome, n.ownCaches = false, 0
	n.log = slices.Clone(w.log)
	n.caches = slices.Clone(w.caches)
	n.reads = make([][]int, len(w.reads))
	for i, r := range w.reads {
		n.reads[i] = slices.Clone(r)
	}
	n.writes = slices.Clone(w.writes)
	n.acked = slices.Clone(w.acked)
	n.writeOf = maps.Clone(w.writeOf)
	n.msgs = slices.Clone(w.msgs)
	n.trace = slices.Clip(w.trace)
	return &n
}

func (w *world) mutHome() *Home {
	if !w.ownHome {
		w.home, w.ownHome = w.home.clone(), true
	}
	return w.home
}

func (w *world) mutCache(c int) *Cache {
	if w.ownCaches&(1<<c) == 0 {
		w.caches[c] = w.caches[c].clone()
		w.ownCaches |= 1 << c
	}
	return w.caches[c]
}

type actKind uint8

const (
	aTick    actKind = iota // i: how long
	aRead                   // cache i reads page j
	aWrite                  // cache i writes page j
	aDeliver                // deliver msgs[i]
	aCommit                 // the node commits page i
	aCrash                  // cache i crashes
	aDrop                   // cache i drops the object (its mediator ended another tenant's import)
)

type action struct {
	kind actKind
	i, j int
}

// actions appends the actions enabled in w, but time steps, to as.
func (w *world) actions(as []action) []action {
	for c := range w.caches {
		if c == w.crashed {
			continue
		}
		for p := range w.conf.pages {
			if w.reads[c][p] < w.conf.maxReads && !w.writeOnly(c) && (w.conf.maxCacheReads == 0 || sum(w.reads[c]) < w.conf.maxCacheReads) {
				as = append(as, action{aRead, c, p})
			}
			if w.issued < w.conf.writes && w.writes[c] < w.conf.maxWrites && !w.readOnly(c) {
				as = append(as, action{aWrite, c, p})
			}
		}
		if w.conf.crash && w.crashed < 0 {
			as = append(as, action{aCrash, c, 0})
		}
		if w.dropped < w.conf.drops {
			as = append(as, action{aDrop, c, 0})
		}
	}
	for i := range w.msgs {
		as = append(as, action{aDeliver, i, 0})
	}
	for p := range w.conf.pages {
		if !w.conf.eager && w.canCommit(uint32(p)) {
			as = append(as, action{aCommit, p, 0})
		}
	}
	return as
}

// data is page p's data at the node: its name, then the ids of the writes
// committed to it.
func (w *world) data(p uint32) string { return string(rune('a'+p)) + w.log[p] }

func sum(ns []int) (s int) {
	for _, n := range ns {
		s += n
	}
	return s
}

func (w *world) readOnly(c int) bool { return c < w.conf.readOnly }
func (w *world) writeOnly(c int) bool {
	return c >= w.conf.readOnly && c < w.conf.readOnly+w.conf.writeOnly
}

// canCommit says whether the node may apply and commit a write of page now.
func (w *world) canCommit(page uint32) bool {
	if p := w.home.pages[page]; p == nil || len(p.queue) == 0 {
		return false
	}
	_, ok := w.home.clone().Ready(page, w.local(0))
	return ok
}

func (w *world) send(m msg) {
	if !m.kind.toHome() && m.cache == w.crashed {
		return // lost: nobody will ever process it
	}
	w.msgs = append(w.msgs, m)
}

// do takes action a. It fails only if the Home or a Cache refuses a call
// the protocol makes, or a read returns data that is not current.
func (w *world) do(a action) error {
	if err := w.step(a); err != nil || !w.conf.eager {
		return err
	}
	for p := range w.conf.pages {
		for w.canCommit(uint32(p)) {
			if err := w.commit(uint32(p)); err != nil {
				return err
			}
		}
	}
	return nil
}

// commit has the node apply and commit the write in progress on page
// (canCommit).
func (w *world) commit(page uint32) error {
	h := w.mutHome()
	h.Ready(page, w.local(0))
	wr, err := h.Commit(page)
	if err != nil {
		return err
	}
	wid := w.writeOf[wr.ID]
	delete(w.writeOf, wr.ID)
	w.log[wr.Page] += string([]byte{wid})
	w.send(msg{kind: mWriteAck, cache: int(wr.Writer), page: wr.Page, version: wr.Version, wid: wid})
	return nil
}

func (w *world) step(a action) error {
	if w.trace != nil {
		w.trace = append(w.trace, w.describe(a))
	}
	switch a.kind {
	case aTick:
		w.now += time.Duration(a.i)
	case aRead:
		c, p := a.i, uint32(a.j)
		k := Key{Object: obj, Page: p}
		if data, v, ok := w.mutCache(c).Lookup(k, w.local(1+c)); ok {
			if string(data) != w.data(p) || v != uint64(len(w.log[p])) {
				return fmt.Errorf("cache %d read page %d from its copy: v%d %q, but the home has v%d %q", c, p, v, data, len(w.log[p]), w.data(p))
			}
			return nil
		}
		t := w.mutCache(c).StartRead(k, w.local(1+c))
		w.reads[c][p]++
		w.send(msg{kind: mReadReq, cache: c, page: p, ticket: t})
	case aWrite:
		c, p := a.i, uint32(a.j)
		if err := w.mutCache(c).StartWrite(obj, p); err != nil {
			return err
		}
		w.issued++
		w.writes[c]++
		w.send(msg{kind: mWriteReq, cache: c, page: p, wid: byte(w.issued)})
	case aDeliver:
		m := w.msgs[a.i]
		w.msgs = slices.Delete(w.msgs, a.i, a.i+1)
		return w.deliver(m)
	case aCommit:
		return w.commit(uint32(a.i))
	case aCrash:
		w.crashed = a.i
		w.msgs = slices.DeleteFunc(w.msgs, func(m msg) bool { return !m.kind.toHome() && m.cache == a.i })
	case aDrop:
		w.mutCache(a.i).Drop(obj)
		w.dropped++
	}
	return nil
}

func (w *world) deliver(m msg) error {
	c, p := m.cache, m.page
	switch m.kind {
	case mReadReq:
		g, err := w.mutHome().Read(CacheID(c), p, 0, w.local(0))
		if err != nil {
			return err
		}
		w.send(msg{kind: mReadResp, cache: c, page: p, ticket: m.ticket, grant: g, data: w.data(p)})
	case mReadResp:
		w.reads[c][p]--
		_, err := w.mutCache(c).Fill(m.ticket, m.grant, []byte(m.data), w.local(1+c))
		return err
	case mWriteReq:
		wr, err := w.mutHome().BeginWrite(CacheID(c), p, w.local(0))
		if err != nil {
			return err
		}
		w.writeOf[wr.ID] = m.wid
		for _, x := range wr.Inval {
			w.send(msg{kind: mInval, cache: int(x), page: p, version: wr.Version})
		}
	case mInval:
		w.mutCache(c).Invalidate(obj, p, m.version)
		w.send(msg{kind: mInvalAck, cache: c, page: p, version: m.version})
	case mInvalAck:
		return w.mutHome().InvalAck(CacheID(c), p, m.version)
	case mWriteAck:
		w.writes[c]--
		w.acked = append(w.acked, ack{m.wid, p, m.version})
		return w.mutCache(c).FinishWrite(obj, p, m.version)
	}
	return nil
}

func (w *world) describe(a action) string {
	switch a.kind {
	case aTick:
		return fmt.Sprintf("t=%d: tick %d", w.now, a.i)
	case aRead:
		return fmt.Sprintf("t=%d: cache %d reads page %d", w.now, a.i, a.j)
	case aWrite:
		return fmt.Sprintf("t=%d: cache %d writes page %d (w%d)", w.now, a.i, a.j, w.issued+1)
	case aDeliver:
		return fmt.Sprintf("t=%d: deliver %v", w.now, w.msgs[a.i])
	case aCommit:
		return fmt.Sprintf("t=%d: node commits page %d", w.now, a.i)
	case aDrop:
		return fmt.Sprintf("t=%d: cache %d drops the object", w.now, a.i)
	default:
		return fmt.Sprintf("t=%d: cache %d crashes", w.now, a.i)
	}
}

// check asserts the invariants in w.
func (w *world) check() error {
	h := w.home
	for pg, p := range h.pages {
		if len(p.queue) > 0 && len(p.sharers) > 0 {
			return fmt.Errorf("page %d: readers %v registered while writes %v wait", pg, p.sharers, p.queue)
		}
		if len(p.queue) == 0 && len(p.waiting) > 0 {
			return fmt.Errorf("page %d: waits for %v with no write in progress", pg, p.waiting)
		}
		for i, q := range p.queue {
			if q.Version != p.version+uint64(i)+1 {
				return fmt.Errorf("page %d at v%d: write %d of the queue would make v%d", pg, p.version, i, q.Version)
			}
		}
	}
	for pg, l := range w.log {
		if v := h.version(uint32(pg)); v != uint64(len(l)) {
			return fmt.Errorf("page %d: home at v%d but %d writes committed", pg, v, len(l))
		}
	}
	// Every valid copy is current: in particular, none is older than a
	// committed (let alone acknowledged) write.
	for c, cache := range w.caches {
		for _, e := range cache.entries() {
			if w.local(1+c) < e.deadline && (e.version != h.version(e.key.Page) || string(e.data) != w.data(e.key.Page)) {
				return fmt.Errorf("cache %d holds page %d at v%d %q valid until %d (now %d), but the home has v%d %q",
					c, e.key.Page, e.version, e.data, e.deadline, w.local(1+c), h.version(e.key.Page), w.data(e.key.Page))
			}
		}
	}
	// No acknowledged write is lost.
	for _, a := range w.acked {
		if l := w.log[a.page]; a.version == 0 || a.version > uint64(len(l)) || l[a.version-1] != a.wid {
			return fmt.Errorf("write w%d acknowledged as page %d v%d, but the page has %q", a.wid, a.page, a.version, l)
		}
	}
	return nil
}

func (h *Home) version(page uint32) uint64 {
	if p := h.pages[page]; p != nil {
		return p.version
	}
	return 0
}

// entries lists the copies by owner (in order of name), each owner's most
// recently used first.
func (c *Cache) entries() []*entry {
	var es []*entry
	for _, name := range slices.Sorted(maps.Keys(c.owners)) {
		for el := c.owners[name].lru.Front(); el != nil; el = el.Next() {
			es = append(es, el.Value.(*entry))
		}
	}
	return es
}

// drain runs w on, fairly, with no new client operation: it delivers every
// message, commits what is ready and lets time pass a step at a time. It
// fails unless, within rounds steps, every write has committed and every
// live cache's reads and writes are answered.
func (w *world) drain(step time.Duration, rounds int) error {
	for range rounds + 1 {
		for {
			if len(w.msgs) > 0 {
				if err := w.do(action{aDeliver, 0, 0}); err != nil {
					return err
				}
				continue
			}
			p := -1
			for pg := range w.conf.pages {
				if !w.conf.eager && w.canCommit(uint32(pg)) {
					p = pg
					break
				}
			}
			if p < 0 {
				break
			}
			if err := w.do(action{aCommit, p, 0}); err != nil {
				return err
			}
		}
		if err := w.check(); err != nil {
			return err
		}
		if w.quiet() {
			return nil
		}
		if err := w.do(action{aTick, int(step), 0}); err != nil {
			return err
		}
	}
	var pending []Write
	for _, p := range w.home.pages {
		pending = append(pending, p.queue...)
	}
	return fmt.Errorf("not quiet after %d steps of %v: writes at the home %+v, writes in flight per cache %v, reads %v, crashed %d",
		rounds, step, pending, w.writes, w.reads, w.crashed)
}

func (w *world) quiet() bool {
	for _, p := range w.home.pages {
		if len(p.queue) > 0 {
			return false
		}
	}
	for c := range w.caches {
		if c != w.crashed && (w.writes[c] > 0 || slices.ContainsFunc(w.reads[c], func(n int) bool { return n > 0 })) {
			return false
		}
	}
	return true
}

// Cloning and canonical keys, for the model checker.

func (h *Home) clone() *Home {
	n := *h
	n.pages = make(map[uint32]*homePage, len(h.pages))
	for k, p := range h.pages {
		q := *p
		q.sharers = slices.Clone(p.sharers)
		q.queue = slices.Clone(p.queue)
		q.waiting = slices.Clone(p.waiting)
		n.pages[k] = &q
	}
	n.pins = maps.Clone(h.pins)
	return &n
}

func (c *Cache) clone() *Cache {
	n := &Cache{capacity: c.capacity, margin: c.margin, owners: make(map[string]*owner, len(c.owners)),
		objects: make(map[uint64]*object, len(c.objects)), stats: c.stats}
	for id, o := range c.objects {
		m := &object{sealed: o.sealed, entries: make(map[Key]*list.Element, len(o.entries)), inflight: make(map[Key]*inflight, len(o.inflight))}
		for k, f := range o.inflight {
			g := *f
			m.inflight[k] = &g
		}
		n.objects[id] = m
	}
	for name, w := range c.owners {
		m := &owner{name: name, bytes: w.bytes}
		m.lru.Init()
		n.owners[name] = m
		for el := w.lru.Front(); el != nil; el = el.Next() {
			e := *el.Value.(*entry)
			e.owner = m
			n.objects[e.key.Object].entries[e.key] = m.lru.PushBack(&e)
		}
	}
	return n
}

// keyer encodes a state canonically. Times are encoded relative to now
// and clamped: a lease that has expired (until <= now) acts as none
// whenever it expired, since time only grows, and a read sent longer than
// lease-margin ago can no longer be cached. So states that differ only by
// a shift in time share a key, and time may pass without bound. Caches are
// interchangeable: a cache's number is its rank in an order of the caches
// by what each holds and has in flight (rank), so that states that differ
// only by the caches' numbers mostly share a key too. Two states share a
// key only if one is the other with times shifted and caches renumbered.
type keyer struct {
	b      []byte
	now    time.Duration
	oldest time.Duration // the clamp of send times: margin − lease
	rank   []int         // by cache number
}

func (k *keyer) u(v uint64) { k.b = binary.AppendUvarint(k.b, v) }

func (k *keyer) flag(b bool) {
	if b {
		k.u(1)
	} else {
		k.u(0)
	}
}

func (k *keyer) id(c int) { k.u(uint64(k.rank[c])) }

func (k *keyer) until(t time.Duration) {
	if t == Forever {
		k.u(1 << 62)
		return
	}
	k.u(uint64(max(t-k.now, 0)))
}

func (k *keyer) sent(t time.Duration) { k.b = binary.AppendVarint(k.b, int64(max(t-k.now, k.oldest))) }

func (k *keyer) str(s string) { k.u(uint64(len(s))); k.b = append(k.b, s...) }

// leases encodes registrations in the order of the caches' ranks.
func (k *keyer) leases(ls []lease) {
	var live []lease
	for _, l := range ls {
		live = append(live, lease{CacheID(k.rank[l.cache]), l.until})
	}
	slices.SortFunc(live, func(a, b lease) int { return cmp.Compare(a.cache, b.cache) })
	for _, l := range live {
		k.u(uint64(l.cache) + 1)
		k.until(l.until)
	}
	k.u(0)
}

func (k *keyer) home(h *Home) {
	k.u(uint64(h.lastWrite))
	k.u(h.current)
	for _, pg := range slices.Sorted(maps.Keys(h.pages)) {
		p := h.pages[pg]
		k.u(uint64(pg))
		k.u(p.version)
		k.flag(p.applying)
		k.leases(p.sharers)
		k.leases(p.waiting)
		k.u(uint64(len(p.queue)))
		for _, q := range p.queue {
			k.u(uint64(q.ID))
			k.id(int(q.Writer))
			k.u(q.Version)
		}
	}
}

// cache encodes c. Unless ordered (the cache may evict), LRU order does
// not matter and an expired copy acts as none. A crashed cache only holds
// copies.
func (k *keyer) cache(c *Cache, ordered, crashed bool) {
	es := c.entries()
	if !ordered {
		slices.SortFunc(es, func(a, b *entry) int { return cmp.Compare(a.key.Page, b.key.Page) })
	}
	k.u(uint64(len(es)))
	for _, e := range es {
		k.u(uint64(e.key.Page))
		k.u(e.version)
		k.str(string(e.data))
		k.until(e.deadline)
	}
	if crashed {
		return
	}
	for _, id := range slices.Sorted(maps.Keys(c.objects)) {
		o := c.objects[id]
		k.u(id)
		k.u(uint64(len(o.inflight)))
		k.flag(o.sealed)
		for _, key := range slices.SortedFunc(maps.Keys(o.inflight), func(a, b Key) int { return cmp.Compare(a.Page, b.Page) }) {
			f := o.inflight[key]
			k.u(uint64(key.Page))
			k.u(uint64(f.reads))
			k.u(uint64(f.writes))
			k.u(f.floor)
		}
	}
}

// msg encodes m, but for its cache when that is not to be encoded.
func (k *keyer) msg(m msg, cache bool) string {
	k.b = k.b[:0]
	k.u(uint64(m.kind))
	if cache {
		k.id(m.cache)
	}
	k.u(uint64(m.page))
	k.u(m.version)
	k.u(uint64(m.wid))
	k.sent(m.ticket.Sent)
	k.u(m.grant.Version)
	k.u(uint64(m.grant.Lease))
	k.str(m.data)
	return string(k.b)
}

// key is w's canonical encoding (for worlds whose clocks read real time).
func (w *world) key() string {
	n := len(w.caches)
	ordered := w.conf.capacity < int64(w.conf.pages+w.conf.writes) // the pages' data may not all fit
	// Each cache's signature: what it holds and has in flight, what the
	// home holds for it, and its messages, without cache numbers.
	self := make([]int, n) // ranks for a signature: the cache itself 0, others 1
	sigs := make([]string, n)
	ms := make([]string, 0, len(w.msgs))
	pages := slices.Sorted(maps.Keys(w.home.pages))
	for c := range n {
		for i := range self {
			self[i] = 1
		}
		self[c] = 0
		k := &keyer{now: w.now, oldest: w.conf.margin - w.conf.lease, rank: self}
		k.flag(w.readOnly(c))
		k.flag(w.writeOnly(c))
		k.flag(c == w.crashed)
		if c != w.crashed {
			k.u(uint64(w.writes[c]))
			for _, r := range w.reads[c] {
				k.u(uint64(r))
			}
		}
		k.cache(w.caches[c], ordered, c == w.crashed)
		for _, pg := range pages {
			p := w.home.pages[pg]
			k.u(uint64(pg))
			for _, ls := range [][]lease{p.sharers, p.waiting} {
				if i := slices.IndexFunc(ls, func(l lease) bool { return int(l.cache) == c }); i >= 0 {
					k.u(1)
					k.until(ls[i].until)
				} else {
					k.u(0)
				}
			}
			for i, q := range p.queue {
				if int(q.Writer) == c {
					k.u(uint64(i) + 1)
				}
			}
			k.u(0)
		}
		ms = ms[:0]
		mk := &keyer{now: k.now, oldest: k.oldest, rank: self}
		for _, m := range w.msgs {
			if m.cache == c {
				ms = append(ms, mk.msg(m, false))
			}
		}
		slices.Sort(ms)
		for _, m := range ms {
			k.str(m)
		}
		sigs[c] = string(k.b)
	}
	order := make([]int, n) // caches by rank
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(sigs[a], sigs[b]) })
	rank := make([]int, n)
	for r, c := range order {
		rank[c] = r
	}

	k := &keyer{now: w.now, oldest: w.conf.margin - w.conf.lease, rank: rank}
	if w.crashed >= 0 {
		k.u(uint64(rank[w.crashed] + 1))
	} else {
		k.u(0)
	}
	k.u(uint64(w.issued))
	k.u(uint64(w.dropped))
	for _, c := range order {
		k.flag(w.readOnly(c))
		k.flag(w.writeOnly(c))
		if c != w.crashed {
			k.u(uint64(w.writes[c]))
			for _, r := range w.reads[c] {
				k.u(uint64(r))
			}
		}
		k.cache(w.caches[c], ordered, c == w.crashed)
	}
	acked := slices.Clone(w.acked)
	slices.SortFunc(acked, func(a, b ack) int { return cmp.Compare(a.wid, b.wid) })
	for _, a := range acked {
		k.u(uint64(a.wid))
		k.u(uint64(a.page))
		k.u(a.version)
	}
	for _, l := range w.log {
		k.str(l)
	}
	for _, id := range slices.Sorted(maps.Keys(w.writeOf)) {
		k.u(uint64(id))
		k.u(uint64(w.writeOf[id]))
	}
	ms = ms[:0]
	mk := &keyer{now: k.now, oldest: k.oldest, rank: rank}
	for _, m := range w.msgs {
		ms = append(ms, mk.msg(m, true))
	}
	slices.Sort(ms)
	k.u(uint64(len(ms)))
	for _, m := range ms {
		k.str(m)
	}
	k.home(w.home)
	return string(k.b)
}

func (w *world) traceString() string { return strings.Join(w.trace, "\n") }
