package coherence

import (
	"container/list"
	"fmt"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

// Ticket is a read in flight: what a Cache needs back with the reply. It
// is a value; the caller keeps it with its request.
type Ticket struct {
	Key  Key
	Sent time.Duration // the cache's clock when the request was sent
	// Owner is whose read it is (a tenant): the copy its reply fills
	// counts against that owner's share of the cache (see Cache).
	Owner string
}

// CacheStats counts a cache's work since it was made, and its size now.
type CacheStats struct {
	Hits, Misses uint64 // Lookup calls
	Reads        uint64 // read requests (StartRead calls)
	Fills        uint64 // replies cached
	Uncached     uint64 // replies returned once but not cached
	Invals       uint64 // invalidations received
	Evictions    uint64 // copies evicted to make room
	Bytes        int64  // bytes of cached copies
	Pages        int    // cached copies
}

// entry is a cached copy, valid while now < deadline.
type entry struct {
	key      Key
	version  uint64
	data     []byte
	deadline time.Duration
	owner    *owner
}

// owner is what one owner's reads hold of a cache.
type owner struct {
	name  string
	bytes int64
	lru   list.List // of *entry, most recently used first
}

// inflight tracks the reads and writes of one key that are in flight.
// A reply to a read is cached only if no write of the key was in flight
// when it arrived and its version is at least floor: the highest version
// this cache was told, by an Inval or the ack of its own write, that the
// page has or will have while the read was in flight.
type inflight struct {
	reads, writes int
	floor         uint64
}

// object is what a cache holds of one object. Once it has no entry and
// nothing in flight it is forgotten, sealed or not: knowing an object is
// sealed only lets the cache refuse a write the node would refuse too, and
// the next read's grant says so again; keeping it would keep every object a
// mediator ever read.
type object struct {
	sealed   bool
	entries  map[Key]*list.Element // of *entry
	inflight map[Key]*inflight
}

// Cache holds a mediator's copies of shared pages, for all its sessions:
// at most a configured number of bytes. A copy serves every reader, but
// belongs to the owner whose read filled it (Ticket.Owner, a tenant), and
// room is made by evicting the least recently used copy of the owner that
// holds the most bytes, the new copy counted (a tie: the new copy's owner).
// So, with k owners holding copies, one that holds at most capacity/k (its
// share) never loses a copy to another's read of a page no larger than
// that; one that reads past its share evicts its own; one alone uses the
// whole cache. See the package comment for how to drive it; it is not safe
// for concurrent use.
//
// Every StartRead must be answered by exactly one Fill or AbortRead, and
// every StartWrite by exactly one FinishWrite. The data slices given to
// Fill and returned by Lookup are shared, never copied: nobody may modify
// them.
type Cache struct {
	capacity int64
	margin   time.Duration
	owners   map[string]*owner // those holding copies
	objects  map[uint64]*object
	stats    CacheStats
}

// NewCache returns an empty cache of capacity bytes. margin is taken off
// every lease, to cover how much slower this host's clock may run than the
// home's over a lease (docs/coherence.md, Leases).
func NewCache(capacity int64, margin time.Duration) (*Cache, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("cache capacity %d bytes: want > 0: %w", capacity, vocab.ErrInvalidArgument)
	}
	if margin < 0 {
		return nil, fmt.Errorf("lease margin %v: want >= 0: %w", margin, vocab.ErrInvalidArgument)
	}
	return &Cache{capacity: capacity, margin: margin, owners: make(map[string]*owner), objects: make(map[uint64]*object)}, nil
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats { return c.stats }

func (c *Cache) object(obj uint64) *object {
	o := c.objects[obj]
	if o == nil {
		o = &object{entries: make(map[Key]*list.Element), inflight: make(map[Key]*inflight)}
		c.objects[obj] = o
	}
	return o
}

// tidy forgets o once it holds nothing.
func (c *Cache) tidy(o *object, obj uint64) {
	if len(o.entries) == 0 && len(o.inflight) == 0 {
		delete(c.objects, obj)
	}
}

func (o *object) flight(k Key) *inflight {
	f := o.inflight[k]
	if f == nil {
		f = &inflight{}
		o.inflight[k] = f
	}
	return f
}

// landed forgets k's in-flight record once nothing is in flight.
func (o *object) landed(k Key, f *inflight) {
	if f.reads == 0 && f.writes == 0 {
		delete(o.inflight, k)
	}
}

// remove drops o's copy of k, if any.
func (c *Cache) remove(o *object, k Key) {
	if el, ok := o.entries[k]; ok {
		e := el.Value.(*entry)
		w := e.owner
		w.lru.Remove(el)
		if w.bytes -= int64(len(e.data)); w.lru.Len() == 0 {
			delete(c.owners, w.name)
		}
		delete(o.entries, k)
		c.stats.Bytes -= int64(len(e.data))
		c.stats.Pages--
	}
}

// victim is the owner whose least recently used copy goes to make room
// after fresh was cached for w: the one holding the most bytes, w on a
// tie, but never fresh itself while another copy can go.
func (c *Cache) victim(w *owner, fresh *list.Element) *owner {
	var v *owner
	for _, x := range c.owners {
		if x.lru.Back() == fresh {
			continue // w holds only the fresh copy
		}
		if v == nil || x.bytes > v.bytes || x.bytes == v.bytes && x == w {
			v = x
		}
	}
	if v == nil {
		return w
	}
	return v
}

// Lookup returns the cached copy of k and its version if it is valid at
// now: a coherent copy whose lease has not expired, or any copy of a
// sealed immutable, versioned or private object. An expired copy is
// dropped. On a miss the caller reads from the home (StartRead).
func (c *Cache) Lookup(k Key, now time.Duration) (data []byte, version uint64, ok bool) {
	o := c.objects[k.Object]
	if o != nil {
		if el, found := o.entries[k]; found {
			e := el.Value.(*entry)
			if now < e.deadline {
				e.owner.lru.MoveToFront(el)
				c.stats.Hits++
				return e.data, e.version, true
			}
			c.remove(o, k)
			c.tidy(o, k.Object)
		}
	}
	c.stats.Misses++
	return nil, 0, false
}

// StartRead records that a read of k is sent to the home at now, and
// returns the ticket to pass to Fill (or AbortRead) with its reply.
func (c *Cache) StartRead(k Key, now time.Duration) Ticket {
	c.object(k.Object).flight(k).reads++
	c.stats.Reads++
	return Ticket{Key: k, Sent: now}
}

func (c *Cache) endRead(t Ticket) (*object, *inflight, error) {
	o := c.objects[t.Key.Object]
	if o != nil {
		if f := o.inflight[t.Key]; f != nil && f.reads > 0 {
			f.reads--
			return o, f, nil
		}
	}
	return nil, nil, fmt.Errorf("object %d version %d page %d: no read in flight: %w",
		t.Key.Object, t.Key.Version, t.Key.Page, vocab.ErrInvalidArgument)
}

// Fill takes the home's reply to the read t at now: g and the page's
// data at g.Version. The caller returns data to the reader either way;
// Fill reports whether it also cached it, which it does when the lease,
// counted from t.Sent less the margin, has not run out by now, no write of
// the page from this cache is in flight, no invalidation received while
// the read was in flight concerned a later version, and data fits.
func (c *Cache) Fill(t Ticket, g ReadGrant, data []byte, now time.Duration) (bool, error) {
	o, f, err := c.endRead(t)
	if err != nil {
		return false, err
	}
	if g.Sealed {
		o.sealed = true
	}
	keep := f.writes == 0 && g.Version >= f.floor
	o.landed(t.Key, f)
	deadline := Forever
	if g.Lease < Forever-max(t.Sent, 0) {
		deadline = t.Sent + g.Lease - c.margin
	}
	if !keep || deadline <= now || int64(len(data)) > c.capacity {
		c.stats.Uncached++
		c.tidy(o, t.Key.Object)
		return false, nil
	}
	c.remove(o, t.Key)
	w := c.owners[t.Owner]
	if w == nil {
		w = &owner{name: t.Owner}
		w.lru.Init()
		c.owners[t.Owner] = w
	}
	fresh := w.lru.PushFront(&entry{key: t.Key, version: g.Version, data: data, deadline: deadline, owner: w})
	o.entries[t.Key] = fresh
	w.bytes += int64(len(data))
	c.stats.Bytes += int64(len(data))
	c.stats.Pages++
	c.stats.Fills++
	for c.stats.Bytes > c.capacity {
		e := c.victim(w, fresh).lru.Back().Value.(*entry)
		victim := c.objects[e.key.Object]
		c.remove(victim, e.key)
		c.tidy(victim, e.key.Object)
		c.stats.Evictions++
	}
	return true, nil
}

// AbortRead ends the read t without a reply (the request failed).
func (c *Cache) AbortRead(t Ticket) error {
	o, f, err := c.endRead(t)
	if err != nil {
		return err
	}
	o.landed(t.Key, f)
	c.tidy(o, t.Key.Object)
	return nil
}

// StartWrite records that this cache sends a write of page of obj to its
// home: it drops its copy and caches no reply for the page until
// FinishWrite. A write to an object known to be sealed is refused with
// vocab.ErrPermissionDenied, without asking the home.
func (c *Cache) StartWrite(obj uint64, page uint32) error {
	if o := c.objects[obj]; o != nil && o.sealed {
		return fmt.Errorf("write of object %d page %d: object is sealed: %w", obj, page, vocab.ErrPermissionDenied)
	}
	k := Key{Object: obj, Page: page}
	o := c.object(obj)
	c.remove(o, k)
	o.flight(k).writes++
	return nil
}

// FinishWrite ends a write begun by StartWrite, on the home's WriteAck
// carrying version, or with version 0 when the write failed. Replies to
// reads in flight that carry an older version are not cached.
func (c *Cache) FinishWrite(obj uint64, page uint32, version uint64) error {
	k := Key{Object: obj, Page: page}
	o := c.objects[obj]
	if o == nil || o.inflight[k] == nil || o.inflight[k].writes == 0 {
		return fmt.Errorf("object %d page %d: no write in flight: %w", obj, page, vocab.ErrInvalidArgument)
	}
	f := o.inflight[k]
	f.writes--
	f.floor = max(f.floor, version)
	o.landed(k, f)
	c.tidy(o, obj)
	return nil
}

// Invalidate takes the home's Inval of page of obj for version: it drops
// a copy older than version, and replies to reads in flight that carry an
// older version will not be cached. The caller then sends InvalAck with
// the same page and version.
func (c *Cache) Invalidate(obj uint64, page uint32, version uint64) {
	c.stats.Invals++
	o := c.objects[obj]
	if o == nil {
		return
	}
	k := Key{Object: obj, Page: page}
	if el, ok := o.entries[k]; ok && el.Value.(*entry).version < version {
		c.remove(o, k)
	}
	if f := o.inflight[k]; f != nil {
		f.floor = max(f.floor, version)
	}
	c.tidy(o, obj)
}

// Drop forgets obj's copies and that it is sealed: its buffer is gone, or
// a tenant of this mediator lost its grant and the others read it again
// from the home. Its reads and writes in flight stay recorded, so that
// each Fill, AbortRead and FinishWrite still ends its own StartRead or
// StartWrite: forgetting them would let a late reply or acknowledgement
// end a later read or write of the key, and a reply older than that
// write be cached. A reply to a read in flight may still be cached, as it
// would have been without the Drop (for an object that is gone, nobody
// looks it up again and it waits for eviction).
func (c *Cache) Drop(obj uint64) {
	o := c.objects[obj]
	if o == nil {
		return
	}
	for k := range o.entries {
		c.remove(o, k)
	}
	o.sealed = false
	c.tidy(o, obj)
}
