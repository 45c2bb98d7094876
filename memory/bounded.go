package memory

import (
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api/vocab"
)

// Bounded returns a view of h that holds at most limit bytes of entries
// (whole frames, at least one) of its own: past that its Put fails with
// vocab.ErrOutOfMemory, as h's does when h is full. A mediator gives each
// container one, so that the spaces of its sessions, which evict whole
// chunks however little of each they use, share the host's memory and
// disk only as far as the container's grant says. Until Close, the view
// holds a share of h's RAM, in proportion to its limit among the open
// views' (see HostStore).
func (h *HostStore) Bounded(limit uint64) *BoundedStore {
	b := &BoundedStore{h: h, limit: max(1, limit/FrameSize), keys: map[uint64]struct{}{}, open: true}
	h.mu.Lock()
	h.views[b] = struct{}{}
	h.viewLimits += b.limit
	h.mu.Unlock()
	return b
}

// BoundedStore is a Store over a HostStore that counts its own entries.
type BoundedStore struct {
	h     *HostStore
	limit uint64 // entries

	// Guarded by h.mu.
	open  bool   // holds a share of h's RAM
	inRAM uint64 // its entries in RAM, those being filled included

	mu      sync.Mutex
	keys    map[uint64]struct{} // entries held
	pending uint64              // entries being put
	files   uint64              // entries held in FileStores bound to it, which count against its limit too
}

// reserve makes room for one entry, or says why there is none.
func (b *BoundedStore) reserve() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if held := uint64(len(b.keys)) + b.pending + b.files; held >= b.limit {
		return fmt.Errorf("host store: %d chunks of %d bytes held, the most this container may keep: %w",
			held, FrameSize, vocab.ErrOutOfMemory)
	}
	b.pending++
	return nil
}

// done ends a reservation, keeping key if err is nil.
func (b *BoundedStore) done(key uint64, err error) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending--
	if err == nil {
		b.keys[key] = struct{}{}
	}
	return key, err
}

// settle ends a reservation a FileStore made, counting its entry if it
// was stored; uncharge forgets one it dropped.
func (b *BoundedStore) settle(stored bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending--
	if stored {
		b.files++
	}
}

func (b *BoundedStore) uncharge() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.files--
}

func (b *BoundedStore) Put(p []byte) (uint64, error) {
	fill, err := copying(p)
	if err != nil {
		return 0, err
	}
	return b.putFrom(fill)
}

func (b *BoundedStore) putFrom(fill func(p []byte) error) (uint64, error) {
	if err := b.reserve(); err != nil {
		return 0, err
	}
	return b.done(b.h.putFor(b, fill))
}

func (b *BoundedStore) Get(key uint64, p []byte) error {
	if err := b.own(key); err != nil {
		return err
	}
	return b.h.Get(key, p)
}

func (b *BoundedStore) view(key uint64, f func(p []byte) error) error {
	if err := b.own(key); err != nil {
		return err
	}
	return b.h.view(key, f)
}

// own says whether key is one of this view's entries: a view never reads
// another's.
func (b *BoundedStore) own(key uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.keys[key]; !ok {
		return fmt.Errorf("host store: no entry %d here: %w", key, vocab.ErrInvalidArgument)
	}
	return nil
}

// Drop discards key if it is one of this view's; others are ignored, so a
// view never drops another's entry.
func (b *BoundedStore) Drop(key uint64) {
	b.mu.Lock()
	_, ok := b.keys[key]
	delete(b.keys, key)
	b.mu.Unlock()
	if ok {
		b.h.Drop(key)
	}
}

// Close gives up the view's share of the store's RAM, for when its owner
// is gone: the entries it still holds stay readable and droppable, and
// count as borrowed. Later calls do nothing.
func (b *BoundedStore) Close() {
	h := b.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if b.open {
		b.open = false
		delete(h.views, b)
		h.viewLimits -= b.limit
	}
}
