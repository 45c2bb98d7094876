package memory

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api"
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
	if _, err := a.Put(page); !errors.Is(err, api.ErrOutOfMemory) {
		t.Fatalf("fourth put into a view of three: %v, want out of memory", err)
	}
	if _, err := b.Put(page); err != nil {
		t.Fatalf("another view, with room of its own: %v", err)
	}
	if err := b.Get(keys[0], page); !errors.Is(err, api.ErrInvalidArgument) {
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
// proportion to their limits. One that filled the RAM alone spills once
// another opens and needs its share, and gets everything again once the
// other closes.
func TestBoundedStoresShareRAM(t *testing.T) {
	h, err := NewHostStore(8*FrameSize, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	page := make([]byte, FrameSize)
	put := func(v *BoundedStore, wantRAM bool, what string) uint64 {
		t.Helper()
		k, err := v.Put(page)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := inRAM(h, k); got != wantRAM {
			t.Fatalf("%s: in RAM %v, want %v (store %+v)", what, got, wantRAM, h.Stats())
		}
		return k
	}
	a := h.Bounded(16 * FrameSize)
	var aKeys []uint64
	for i := range 8 {
		aKeys = append(aKeys, put(a, true, fmt.Sprintf("a alone, put %d of 8", i)))
	}
	put(a, false, "a alone, past the RAM")

	b := h.Bounded(16 * FrameSize) // shares now 4 and 4; a holds 8
	put(b, false, "b while a holds all the RAM it borrowed")
	a.Drop(aKeys[0])
	a.Drop(aKeys[1])
	put(a, false, "a over its share, with the free RAM b's")
	put(b, true, "b under its share")
	put(b, true, "b under its share, the last free frame")
	a.Drop(aKeys[2])
	a.Drop(aKeys[3])
	put(b, true, "b, third of its four")
	put(b, true, "b, fourth of its four")
	put(b, false, "b at its share, with no RAM free")

	// A store's own entries only borrow: b's unused share is kept from them.
	a.Drop(aKeys[4])
	if k, err := h.Put(page); err != nil || inRAM(h, k) {
		t.Fatalf("an entry of no view while a is at its share and b at its: in RAM %v, %v", inRAM(h, k), err)
	}

	b.Close()
	b.Close() // a second close does nothing
	put(a, true, "a alone again")
	if h.viewLimits != 16 || len(h.views) != 1 {
		t.Fatalf("after b closed: views %d, limits %d, want 1 and 16", len(h.views), h.viewLimits)
	}
}

// TestBoundedStoresRAMProperty: over any sequence of puts, drops and
// views opening and closing, a borrower never takes RAM that an open
// view's unused share needs, a view below its share gets RAM whenever any
// is free, the shares never add up to more than the budget, and each
// view's count of its RAM entries is exact.
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
		for range rapid.IntRange(1, 80).Draw(rt, "steps") {
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
					keys[v] = append(ks[:i], ks[i+1:]...)
				}
			default:
				v := views[rapid.IntRange(0, len(views)-1).Draw(rt, "putter")]
				h.mu.Lock()
				free := (h.budget - h.ramUsed) / FrameSize
				under := v.inRAM < h.share(v)
				h.mu.Unlock()
				k, err := v.Put(page)
				if err != nil {
					if errors.Is(err, api.ErrOutOfMemory) {
						continue // at its limit
					}
					rt.Fatal(err)
				}
				keys[v] = append(keys[v], k)
				ram := inRAM(h, k)
				if under && free > 0 && !ram {
					rt.Fatalf("a view below its share spilled with %d frames of RAM free", free)
				}
				h.mu.Lock()
				if ram && !under {
					left := (h.budget - h.ramUsed) / FrameSize
					for o := range h.views {
						if s := h.share(o); o != v && s > o.inRAM && left < s-o.inRAM {
							h.mu.Unlock()
							rt.Fatalf("a borrower took RAM of an open view's unused share")
						}
					}
				}
				h.mu.Unlock()
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
	})
}
