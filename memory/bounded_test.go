package memory

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
	"pgregory.net/rapid"
)

// TestBoundedStore: a bounded view holds at most its limit of entries,
// whatever the store underneath could take, gets room back as entries are
// dropped, and never reads or drops another view's entries.
func TestBoundedStore(t *testing.T) {
	h, err := NewHostStore(64*FrameSize, "")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a, b := h.Bounded(3*FrameSize), h.Bounded(2*FrameSize)
	page := make([]byte, FrameSize)
	var keys []uint64
	for i := range 3 {
		page[0] = byte(i + 1)
		k, err := a.Put(page)
		if err != nil {
			t.Fatalf("put %d of 3: %v", i, err)
		}
		keys = append(keys, k)
	}
	if _, err := a.Put(page); !errors.Is(err, vocab.ErrOutOfMemory) {
		t.Fatalf("fourth put into a view of three: %v, want out of memory", err)
	}
	if _, err := b.Put(page); err != nil {
		t.Fatalf("another view, with room of its own: %v", err)
	}
	if err := b.Get(keys[0], page); !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Fatalf("a view reading another's entry: %v, want invalid argument", err)
	}
	b.Drop(keys[0]) // not b's: ignored
	if err := a.Get(keys[0], page); err != nil || page[0] != 1 {
		t.Fatalf("entry after another view dropped it: %v, first byte %d", err, page[0])
	}
	a.Drop(keys[0])
	if _, err := a.Put(page); err != nil {
		t.Fatalf("put after a drop: %v", err)
	}
	if got := h.Stats().RAM; got != 4*FrameSize {
		t.Fatalf("store holds %d bytes, want 4 frames", got)
	}
	// Concurrent puts never pass the limit.
	c := h.Bounded(5 * FrameSize)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Put(make([]byte, FrameSize)); err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok != 5 {
		t.Fatalf("%d of 16 concurrent puts into a view of 5 succeeded", ok)
	}
}

// inRAM reports whether key's entry is in h's RAM (not spilled).
func inRAM(h *HostStore, key uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.ram[key]
	return ok
}

// TestBoundedStoresShareRAM: open views divide the store's RAM in
// proportion to their limits and lend what they do not use. One that
// filled the RAM alone loses what it borrowed, to the spill file, as
// another opens and needs its share, and gets everything again once the
// other closes.
func TestBoundedStoresShareRAM(t *testing.T) {
	h, err := NewHostStore(8*FrameSize, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	page := make([]byte, FrameSize)
	n := byte(0)
	want := map[uint64]byte{}
	put := func(v *BoundedStore, wantRAM bool, what string) uint64 {
		t.Helper()
		n++
		page[0] = n
		k, err := v.Put(page)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := inRAM(h, k); got != wantRAM {
			t.Fatalf("%s: in RAM %v, want %v (store %+v)", what, got, wantRAM, h.Stats())
		}
		want[k] = n
		return k
	}
	count := func(v *BoundedStore) uint64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return v.inRAM
	}
	a := h.Bounded(16 * FrameSize)
	idle := h.Bounded(16 * FrameSize) // opened, never used: lends its share
	var aKeys []uint64
	for i := range 8 {
		aKeys = append(aKeys, put(a, true, fmt.Sprintf("a beside an idle view, put %d of 8", i)))
	}
	put(a, false, "a past the RAM")
	idle.Close()

	b := h.Bounded(16 * FrameSize) // shares now 4 and 4; a holds 8
	for i := range 4 {
		put(b, true, fmt.Sprintf("b below its share, put %d of 4, taking RAM a borrowed", i))
	}
	if got := count(a); got != 4 {
		t.Fatalf("a holds %d entries in RAM after b took its share, want 4", got)
	}
	put(b, false, "b at its share, RAM full")
	put(a, false, "a at its share, RAM full")
	if k, err := h.Put(page); err != nil || inRAM(h, k) {
		t.Fatalf("an entry of no view with the RAM full: in RAM %v, %v", inRAM(h, k), err)
	}
	for _, k := range aKeys {
		if inRAM(h, k) {
			a.Drop(k) // one of a's RAM entries: the RAM has a free frame
			delete(want, k)
			break
		}
	}
	put(a, true, "a at its share, a frame free: lent")
	if got := h.Stats().Moved; got != 4 {
		t.Fatalf("%d entries moved to the spill file, want 4", got)
	}

	b.Close()
	b.Close() // a second close does nothing
	if h.viewLimits != 16 || len(h.views) != 1 {
		t.Fatalf("after b closed: views %d, limits %d, want 1 and 16", len(h.views), h.viewLimits)
	}
	// Every entry kept its bytes, moved or not.
	for k, v := range want {
		owner := a
		if err := owner.Get(k, page); err != nil {
			if err := b.Get(k, page); err != nil {
				t.Fatalf("entry %d: %v", k, err)
			}
		}
		if page[0] != v {
			t.Fatalf("entry %d holds %d, want %d", k, page[0], v)
		}
	}
}

// TestBoundedStoresRAMProperty: over any sequence of puts, drops and
// views opening and closing, an entry goes to RAM whenever a frame of it is
// free, a view below its share gets RAM whenever some entry in RAM is
// borrowed, the shares never add up to more than the budget, each view's
// count of its RAM entries is exact, and every entry keeps its bytes.
func TestBoundedStoresRAMProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		budget := rapid.Uint64Range(1, 12).Draw(rt, "budget")
		h, err := NewHostStore(budget*FrameSize, t.TempDir())
		if err != nil {
			rt.Fatal(err)
		}
		defer h.Close()
		page := make([]byte, FrameSize)
		var views []*BoundedStore
		keys := map[*BoundedStore][]uint64{}
		want := map[uint64]uint64{}
		for step := range rapid.IntRange(1, 80).Draw(rt, "steps") {
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
			case op == 0 || len(views) == 0:
				views = append(views, h.Bounded(rapid.Uint64Range(1, 10).Draw(rt, "limit")*FrameSize))
			case op == 1:
				views[rapid.IntRange(0, len(views)-1).Draw(rt, "close")].Close()
			case op < 4:
				v := views[rapid.IntRange(0, len(views)-1).Draw(rt, "dropper")]
				if ks := keys[v]; len(ks) > 0 {
					i := rapid.IntRange(0, len(ks)-1).Draw(rt, "key")
					v.Drop(ks[i])
					delete(want, ks[i])
					keys[v] = append(ks[:i], ks[i+1:]...)
				}
			default:
				v := views[rapid.IntRange(0, len(views)-1).Draw(rt, "putter")]
				h.mu.Lock()
				free := h.ramUsed < h.budget
				_, lent := h.borrowed()
				under := v.inRAM < h.share(v)
				h.mu.Unlock()
				binary.LittleEndian.PutUint64(page, uint64(step))
				k, err := v.Put(page)
				if err != nil {
					if errors.Is(err, vocab.ErrOutOfMemory) {
						continue // at its limit
					}
					rt.Fatal(err)
				}
				keys[v] = append(keys[v], k)
				want[k] = uint64(step)
				ram := inRAM(h, k)
				if free && !ram {
					rt.Fatalf("an entry spilled with a frame of RAM free")
				}
				if under && lent && !ram {
					rt.Fatalf("a view below its share spilled while RAM was lent")
				}
			}
			h.mu.Lock()
			var shares uint64
			counted := map[*BoundedStore]uint64{}
			for _, e := range h.ram {
				counted[e.owner]++
			}
			for _, v := range views {
				shares += h.share(v)
				if counted[v] != v.inRAM {
					h.mu.Unlock()
					rt.Fatalf("a view counts %d entries in RAM, holds %d", v.inRAM, counted[v])
				}
			}
			h.mu.Unlock()
			if shares > budget {
				rt.Fatalf("shares add up to %d frames, the budget is %d", shares, budget)
			}
		}
		for v, ks := range keys {
			for _, k := range ks {
				if err := v.Get(k, page); err != nil {
					rt.Fatal(err)
				}
				if got := binary.LittleEndian.Uint64(page); got != want[k] {
					rt.Fatalf("entry %d holds %d, want %d", k, got, want[k])
				}
			}
		}
	})
}

// TestBoundedStoresConcurrentReclaim: two views fill the RAM, twice their
// shares, and keep reading their entries back while two views below their
// shares put, read and drop at once, which moves the lent entries to the
// spill file under their readers.
func TestBoundedStoresConcurrentReclaim(t *testing.T) {
	h, err := NewHostStore(8*FrameSize, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	tagged := func(tag uint64) []byte {
		page := make([]byte, FrameSize)
		binary.LittleEndian.PutUint64(page[FrameSize-8:], tag)
		return page
	}
	check := func(v *BoundedStore, k, tag uint64, page []byte) bool {
		if err := v.Get(k, page); err != nil {
			t.Error(err)
			return false
		}
		if got := binary.LittleEndian.Uint64(page[FrameSize-8:]); got != tag {
			t.Errorf("entry %d reads %#x, wrote %#x", k, got, tag)
			return false
		}
		return true
	}
	views := make([]*BoundedStore, 4)
	for w := range views {
		views[w] = h.Bounded(4 * FrameSize) // a share of 2
	}
	lent := [2]map[uint64]uint64{{}, {}} // key → tag, of each lender's entries
	for w := range lent {
		for i := range 4 {
			tag := uint64(w<<16 | i)
			k, err := views[w].Put(tagged(tag))
			if err != nil {
				t.Fatal(err)
			}
			lent[w][k] = tag
		}
	}
	if st := h.Stats(); st.RAM != h.budget || st.Spilled != 0 {
		t.Fatalf("the lenders' entries are not all in RAM: %+v", st)
	}
	done := make(chan struct{})
	var readers, writers sync.WaitGroup
	for w := range 2 {
		v := views[w]
		readers.Go(func() {
			page := make([]byte, FrameSize)
			for {
				for k, tag := range lent[w] {
					if !check(v, k, tag, page) {
						return
					}
				}
				select {
				case <-done:
					return
				default:
				}
			}
		})
	}
	for w := 2; w < 4; w++ {
		v := views[w]
		writers.Go(func() {
			page := make([]byte, FrameSize)
			var held []uint64
			for i := range 60 {
				tag := uint64(w<<16 | i)
				k, err := v.Put(tagged(tag))
				if errors.Is(err, vocab.ErrOutOfMemory) {
					v.Drop(held[0])
					held = held[1:]
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				held = append(held, k)
				if !check(v, k, tag, page) {
					return
				}
			}
		})
	}
	writers.Wait()
	close(done)
	readers.Wait()
	// Each writer below its share took two entries of RAM back from a lender.
	if st := h.Stats(); st.Moved < 4 {
		t.Fatalf("%d entries moved, want at least 4: the writers did not reclaim their shares (%+v)", st.Moved, st)
	}
}
