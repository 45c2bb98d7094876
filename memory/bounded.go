package memory

import (
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api"
)

// Bounded returns a view of h that holds at most limit bytes of entries
// (whole frames, at least one) of its own: past that its Put fails with
// api.ErrOutOfMemory, as h's does when h is full. A mediator gives each
// container one, so that the spaces of its sessions, which evict whole
// chunks however little of each they use, share the host's memory and
// disk only as far as the container's grant says.
func (h *HostStore) Bounded(limit uint64) Store {
	return &boundedStore{h: h, limit: max(1, limit/FrameSize), keys: map[uint64]struct{}{}}
}

// boundedStore is a Store over a HostStore that counts its own entries.
type boundedStore struct {
	h     *HostStore
	limit uint64 // entries

	mu      sync.Mutex
	keys    map[uint64]struct{} // entries held
	pending uint64              // entries being put
}

// reserve makes room for one entry, or says why there is none.
func (b *boundedStore) reserve() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if uint64(len(b.keys))+b.pending >= b.limit {
		return fmt.Errorf("host store: %d chunks of %d bytes held, the most this container may keep: %w",
			uint64(len(b.keys))+b.pending, FrameSize, api.ErrOutOfMemory)
	}
	b.pending++
	return nil
}

// done ends a reservation, keeping key if err is nil.
func (b *boundedStore) done(key uint64, err error) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending--
	if err == nil {
		b.keys[key] = struct{}{}
	}
	return key, err
}

func (b *boundedStore) Put(p []byte) (uint64, error) {
	if err := b.reserve(); err != nil {
		return 0, err
	}
	return b.done(b.h.Put(p))
}

func (b *boundedStore) putFrom(fill func(p []byte) error) (uint64, error) {
	if err := b.reserve(); err != nil {
		return 0, err
	}
	return b.done(b.h.putFrom(fill))
}

func (b *boundedStore) Get(key uint64, p []byte) error {
	if err := b.own(key); err != nil {
		return err
	}
	return b.h.Get(key, p)
}

func (b *boundedStore) view(key uint64, f func(p []byte) error) error {
	if err := b.own(key); err != nil {
		return err
	}
	return b.h.view(key, f)
}

// own says whether key is one of this view's entries: a view never reads
// another's.
func (b *boundedStore) own(key uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.keys[key]; !ok {
		return fmt.Errorf("host store: no entry %d here: %w", key, api.ErrInvalidArgument)
	}
	return nil
}

// Drop discards key if it is one of this view's; others are ignored, so a
// view never drops another's entry.
func (b *boundedStore) Drop(key uint64) {
	b.mu.Lock()
	_, ok := b.keys[key]
	delete(b.keys, key)
	b.mu.Unlock()
	if ok {
		b.h.Drop(key)
	}
}
