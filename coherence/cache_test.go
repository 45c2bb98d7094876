package coherence

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api/vocab"
)

func newCache(t *testing.T, capacity int64, margin time.Duration) *Cache {
	t.Helper()
	c, err := NewCache(capacity, margin)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fill reads k into c: sent at sent, answered with g and data at now.
func fill(t *testing.T, c *Cache, k Key, g ReadGrant, data string, sent, now time.Duration) bool {
	t.Helper()
	ok, err := c.Fill(c.StartRead(k, sent), g, []byte(data), now)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestNewCacheRefuses(t *testing.T) {
	_, err := NewCache(0, 0)
	wantErr(t, err, vocab.ErrInvalidArgument, "capacity 0")
	_, err = NewCache(1, -1)
	wantErr(t, err, vocab.ErrInvalidArgument, "margin -1ns")
}

func TestCacheLeaseCountsFromSend(t *testing.T) {
	c := newCache(t, 1<<10, 10*time.Millisecond)
	k := Key{Object: 1, Page: 2}
	// Sent at 0, answered at 0.5 s: valid until 1 s − 10 ms.
	if !fill(t, c, k, ReadGrant{Version: 3, Lease: sec}, "d", 0, sec/2) {
		t.Fatal("not cached")
	}
	if d, v, ok := c.Lookup(k, sec-11*time.Millisecond); !ok || v != 3 || string(d) != "d" {
		t.Fatalf("Lookup before the deadline = %q, %d, %v", d, v, ok)
	}
	if _, _, ok := c.Lookup(k, sec-10*time.Millisecond); ok {
		t.Fatal("hit at the deadline")
	}
	// An answer whose lease ran out in flight is returned, not cached.
	if fill(t, c, k, ReadGrant{Version: 3, Lease: sec}, "d", 0, sec) {
		t.Error("cached a reply whose lease had run out")
	}
	// Lease 0: once only.
	if fill(t, c, k, ReadGrant{Version: 3}, "d", sec, sec) {
		t.Error("cached a reply with lease 0")
	}
	st := c.Stats()
	if st.Hits != 1 || st.Misses != 1 || st.Reads != 3 || st.Fills != 1 || st.Uncached != 2 || st.Pages != 0 || st.Bytes != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestCacheForever(t *testing.T) {
	c := newCache(t, 1<<10, sec)
	k := Key{Object: 1, Version: 4, Page: 0}
	if !fill(t, c, k, ReadGrant{Version: 4, Lease: Forever}, "v4", 1<<62, 1<<62) {
		t.Fatal("not cached")
	}
	if _, v, ok := c.Lookup(k, 1<<62+1<<61); !ok || v != 4 {
		t.Error("a Forever copy expired")
	}
	if _, _, ok := c.Lookup(Key{Object: 1, Version: 5}, 0); ok {
		t.Error("hit for another version")
	}
	// A lease so long that its deadline would overflow is Forever.
	k = Key{Object: 2}
	if !fill(t, c, k, ReadGrant{Lease: 1<<62 + 5}, "x", 1<<62, 1<<62) {
		t.Fatal("not cached")
	}
	if _, _, ok := c.Lookup(k, Forever-1); !ok {
		t.Error("a lease past the end of time expired")
	}
}

func TestCacheInvalidate(t *testing.T) {
	c := newCache(t, 1<<10, 0)
	k := Key{Object: 1, Page: 0}
	fill(t, c, k, ReadGrant{Version: 2, Lease: sec}, "v2", 0, 0)
	c.Invalidate(1, 0, 2) // a late Inval of the write that made v2: keep
	if _, _, ok := c.Lookup(k, 0); !ok {
		t.Fatal("copy of v2 dropped by Inval(v2)")
	}
	c.Invalidate(1, 0, 3)
	if _, _, ok := c.Lookup(k, 0); ok {
		t.Fatal("copy of v2 kept after Inval(v3)")
	}
	// An Inval that overtakes the reply: the reply is not cached, but a
	// reply at the new version is.
	t1 := c.StartRead(k, 0)
	t2 := c.StartRead(k, 0)
	c.Invalidate(1, 0, 4)
	if ok, _ := c.Fill(t1, ReadGrant{Version: 3, Lease: sec}, []byte("v3"), 0); ok {
		t.Error("cached v3 after Inval(v4)")
	}
	if ok, _ := c.Fill(t2, ReadGrant{Version: 4, Lease: sec}, []byte("v4"), 0); !ok {
		t.Error("did not cache v4 after Inval(v4)")
	}
	c.Invalidate(2, 0, 1) // an object it never held
	if st := c.Stats(); st.Invals != 4 {
		t.Errorf("%d invalidations counted, want 4", st.Invals)
	}
}

func TestCacheOwnWrites(t *testing.T) {
	c := newCache(t, 1<<10, 0)
	k := Key{Object: 1, Page: 0}
	fill(t, c, k, ReadGrant{Version: 1, Lease: sec}, "v1", 0, 0)
	before := c.StartRead(k, 0) // a read sent before the write
	if err := c.StartWrite(1, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := c.Lookup(k, 0); ok {
		t.Fatal("hit on a page this cache is writing")
	}
	during := c.StartRead(k, 0)
	if ok, _ := c.Fill(during, ReadGrant{Version: 1, Lease: sec}, []byte("v1"), 0); ok {
		t.Error("cached a reply while writing the page")
	}
	if err := c.FinishWrite(1, 0, 2); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.Fill(before, ReadGrant{Version: 1, Lease: sec}, []byte("v1"), 0); ok {
		t.Error("cached v1 after the write made v2")
	}
	if !fill(t, c, k, ReadGrant{Version: 2, Lease: sec}, "v2", 0, 0) {
		t.Error("did not cache v2 after the write")
	}
	wantErr(t, c.FinishWrite(1, 0, 3), vocab.ErrInvalidArgument, "object 1", "page 0")
	// A failed write (version 0) just ends.
	if err := c.StartWrite(1, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.FinishWrite(1, 0, 0); err != nil {
		t.Fatal(err)
	}
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := newCache(t, 10, 0)
	g := ReadGrant{Lease: Forever}
	for p := range uint32(3) {
		fill(t, c, Key{Object: 1, Page: p}, g, "abcd", 0, 0) // 4 bytes each
	}
	// 12 > 10 bytes: page 0 went. Touch page 1, then add page 3: page 2 goes.
	if _, _, ok := c.Lookup(Key{Object: 1, Page: 0}, 0); ok {
		t.Error("page 0 not evicted")
	}
	c.Lookup(Key{Object: 1, Page: 1}, 0)
	fill(t, c, Key{Object: 2, Page: 3}, g, "ab", 0, 0)
	fill(t, c, Key{Object: 2, Page: 4}, g, "ab", 0, 0)
	for _, tc := range []struct {
		k    Key
		want bool
	}{{Key{Object: 1, Page: 1}, true}, {Key{Object: 1, Page: 2}, false}, {Key{Object: 2, Page: 3}, true}, {Key{Object: 2, Page: 4}, true}} {
		if _, _, ok := c.Lookup(tc.k, 0); ok != tc.want {
			t.Errorf("%+v cached %v, want %v", tc.k, ok, tc.want)
		}
	}
	if fill(t, c, Key{Object: 3}, g, "01234567890", 0, 0) {
		t.Error("cached a page larger than the cache")
	}
	if st := c.Stats(); st.Evictions != 2 || st.Bytes != 8 || st.Pages != 3 {
		t.Errorf("stats %+v", st)
	}
}

// fillAs is fill for owner's read.
func fillAs(t rapid.TB, c *Cache, owner string, k Key, data []byte) bool {
	t.Helper()
	tk := c.StartRead(k, 0)
	tk.Owner = owner
	ok, err := c.Fill(tk, ReadGrant{Lease: Forever}, data, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// Owners share the cache: one alone uses all of it; one within its share
// keeps its copies however much another reads; one past its share evicts
// its own least recently used copies first.
func TestCacheOwnersShare(t *testing.T) {
	c := newCache(t, 8*4, 0) // 8 pages of 4 bytes
	page := []byte("abcd")
	for p := range uint32(8) {
		fillAs(t, c, "a", Key{Object: 1, Page: p}, page)
	}
	if st := c.Stats(); st.Pages != 8 || st.Evictions != 0 {
		t.Fatalf("one owner alone: %+v, want the whole cache", st)
	}
	for p := range uint32(3) {
		fillAs(t, c, "b", Key{Object: 2, Page: p}, page)
	}
	// a held 8 pages, more than any: its three oldest went.
	for p := range uint32(8) {
		if _, _, ok := c.Lookup(Key{Object: 1, Page: p}, 0); ok != (p >= 3) {
			t.Errorf("a's page %d cached %v", p, ok)
		}
	}
	for round := range 3 {
		for p := range uint32(20) {
			fillAs(t, c, "a", Key{Object: 3, Page: p + uint32(round)*20}, page)
		}
	}
	for p := range uint32(3) {
		if _, _, ok := c.Lookup(Key{Object: 2, Page: p}, 0); !ok {
			t.Errorf("b, within its share, lost page %d to a's reads", p)
		}
	}
	// Another owner's hit neither moves a copy in its owner's order nor
	// makes it theirs: b's copies are b's.
	if w := c.owners["b"]; w == nil || w.bytes != 12 {
		t.Fatalf("b holds %+v, want 12 bytes", w)
	}
}

// TestCacheOwnersShareProperty: over random fills of random owners, the
// bytes held never pass the capacity, every owner's count is its copies'
// bytes, and an owner that holds no more than its share (capacity over the
// owners holding copies, the filling one included) keeps every copy
// through another owner's fill of a page no larger than that share.
func TestCacheOwnersShareProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		capacity := rapid.Int64Range(8, 64).Draw(rt, "capacity")
		c, err := NewCache(capacity, 0)
		if err != nil {
			rt.Fatal(err)
		}
		for i := range rapid.IntRange(1, 80).Draw(rt, "fills") {
			who := rapid.SampledFrom([]string{"a", "b", "c", "d"}).Draw(rt, "owner")
			n := rapid.Int64Range(1, 8).Draw(rt, "bytes")
			k := len(c.owners)
			if c.owners[who] == nil {
				k++
			}
			share := capacity / int64(k)
			before := map[string][]Key{}
			for _, e := range c.entries() {
				if e.owner.name != who && e.owner.bytes <= share {
					before[e.owner.name] = append(before[e.owner.name], e.key)
				}
			}
			fillAs(rt, c, who, Key{Object: uint64(i % 5), Page: uint32(i)}, make([]byte, n))
			for name, keys := range before {
				for _, key := range keys {
					if o := c.objects[key.Object]; n <= share && (o == nil || o.entries[key] == nil) {
						rt.Fatalf("%s, within its share of %d bytes, lost %+v to %s's fill of %d", name, share, key, who, n)
					}
				}
			}
			var total int64
			for name, w := range c.owners {
				var sum int64
				for el := w.lru.Front(); el != nil; el = el.Next() {
					sum += int64(len(el.Value.(*entry).data))
				}
				if sum != w.bytes || w.lru.Len() == 0 {
					rt.Fatalf("owner %s counts %d bytes, holds %d in %d copies", name, w.bytes, sum, w.lru.Len())
				}
				total += sum
			}
			if st := c.Stats(); total != st.Bytes || st.Bytes > capacity {
				rt.Fatalf("owners hold %d bytes, the cache %d of %d", total, st.Bytes, capacity)
			}
		}
	})
}

func TestCacheBookkeepingRefusals(t *testing.T) {
	c := newCache(t, 1<<10, 0)
	k := Key{Object: 1, Version: 2, Page: 3}
	_, err := c.Fill(Ticket{Key: k}, ReadGrant{}, nil, 0)
	wantErr(t, err, vocab.ErrInvalidArgument, "object 1 version 2 page 3")
	wantErr(t, c.AbortRead(Ticket{Key: k}), vocab.ErrInvalidArgument, "object 1")
	tk := c.StartRead(k, 0)
	if err := c.AbortRead(tk); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fill(tk, ReadGrant{}, nil, 0); !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Errorf("Fill after AbortRead: %v", err)
	}
	if len(c.objects) != 0 {
		t.Errorf("cache keeps %d objects with nothing in them", len(c.objects))
	}
}

func TestCacheSealAndDrop(t *testing.T) {
	c := newCache(t, 1<<10, 0)
	k := Key{Object: 1}
	fill(t, c, k, ReadGrant{Lease: Forever, Sealed: true}, "x", 0, 0)
	wantErr(t, c.StartWrite(1, 5), vocab.ErrPermissionDenied, "object 1", "page 5")
	tk := c.StartRead(Key{Object: 1, Page: 1}, 0)
	c.Drop(1)
	c.Drop(9)
	if _, _, ok := c.Lookup(k, 0); ok {
		t.Error("hit after Drop")
	}
	if err := c.StartWrite(1, 0); err != nil {
		t.Errorf("write after Drop of a sealed object: %v", err)
	}
	if st := c.Stats(); st.Bytes != 0 || st.Pages != 0 {
		t.Errorf("stats after Drop %+v", st)
	}
	// What was in flight at the Drop still ends.
	if _, err := c.Fill(tk, ReadGrant{Lease: Forever}, nil, 0); err != nil {
		t.Errorf("Fill of a read in flight at the Drop: %v", err)
	}
	if err := c.FinishWrite(1, 0, 0); err != nil {
		t.Errorf("FinishWrite of a write begun after the Drop: %v", err)
	}
}

// TestCacheDropKeepsReadsInFlight: a Drop (another tenant of the mediator
// is revoked) while a read is in flight does not forget it. Otherwise the
// Inval of a write that follows finds nothing to raise the floor of, and
// the old reply, arriving after a later read of the page began, is cached
// as current after the write was acknowledged.
func TestCacheDropKeepsReadsInFlight(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeCoherent, Pages: 1, Lease: 200 * time.Millisecond})
	c := newCache(t, 1<<10, 0)
	const reader, writer = CacheID(1), CacheID(2)
	k := Key{Object: 7}
	old := c.StartRead(k, 0)
	g, err := h.Read(reader, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Drop(7) // the reply is still on its way
	w, err := h.BeginWrite(writer, 0, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c.Invalidate(7, 0, w.Version)
	if err := h.InvalAck(reader, 0, w.Version); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.Ready(0, time.Millisecond); !ok {
		t.Fatal("the write is not ready once its invalidation is acknowledged")
	}
	if w, err = h.Commit(0); err != nil {
		t.Fatal(err)
	}
	c.StartRead(k, 2*time.Millisecond) // another session reads the page
	if _, err := c.Fill(old, g, []byte("old"), 3*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if data, v, ok := c.Lookup(k, 4*time.Millisecond); ok && v < w.Version {
		t.Errorf("after write v%d was acknowledged, the cache serves v%d %q", w.Version, v, data)
	}
}

// TestCacheDropKeepsWritesInFlight: the acknowledgement of a write sent
// before a Drop ends that write, not one sent after it, so the later
// writer's own read, answered before its write, is not cached as current.
func TestCacheDropKeepsWritesInFlight(t *testing.T) {
	h := newHome(t, HomeConfig{Mode: vocab.ModeCoherent, Pages: 1, Lease: 200 * time.Millisecond})
	c := newCache(t, 1<<10, 0)
	const first, second = CacheID(1), CacheID(2) // two connections of one mediator
	k := Key{Object: 7}
	commit := func(w Write, now time.Duration) Write {
		t.Helper()
		if _, ok := h.Ready(0, now); !ok {
			t.Fatalf("write %d is not ready", w.ID)
		}
		w, err := h.Commit(0)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	if err := c.StartWrite(7, 0); err != nil {
		t.Fatal(err)
	}
	w1, err := h.BeginWrite(first, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	w1 = commit(w1, 0) // its acknowledgement is on its way
	c.Drop(7)
	rd := c.StartRead(k, time.Millisecond)
	g, err := h.Read(second, 0, 0, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartWrite(7, 0); err != nil {
		t.Fatal(err)
	}
	w2, err := h.BeginWrite(second, 0, 2*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	w2 = commit(w2, 2*time.Millisecond)
	if err := c.FinishWrite(7, 0, w1.Version); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fill(rd, g, []byte("v1"), 3*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := c.FinishWrite(7, 0, w2.Version); err != nil {
		t.Fatalf("the acknowledgement of the write begun after the Drop: %v", err)
	}
	if _, v, ok := c.Lookup(k, 4*time.Millisecond); ok && v < w2.Version {
		t.Errorf("after write v%d was acknowledged, the cache serves v%d", w2.Version, v)
	}
}

// TestCacheForgetsEvictedSealedObjects: a sealed object whose copies were
// all evicted is forgotten, so a mediator that reads many objects keeps
// only those it holds copies of.
func TestCacheForgetsEvictedSealedObjects(t *testing.T) {
	c := newCache(t, 1<<10, 0)
	for obj := uint64(1); obj <= 100; obj++ {
		fill(t, c, Key{Object: obj}, ReadGrant{Lease: Forever, Sealed: true}, string(make([]byte, 1<<10)), 0, 0)
	}
	if n := len(c.objects); n != 1 {
		t.Errorf("%d objects known after 100 sealed ones evicted each other, want 1", n)
	}
}
