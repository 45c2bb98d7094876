package memory

import (
	"errors"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api"
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
