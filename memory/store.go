package memory

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/vgpu/vgpu/api/vocab"
)

// Store keeps the contents of evicted chunks while they have no frame. Every
// entry is exactly FrameSize bytes. A key belongs to whoever Put it, who
// must not Get or Drop it concurrently with a Drop of the same key; distinct
// keys may be used concurrently.
type Store interface {
	// Put stores a copy of p (FrameSize bytes) under a new key. It fails with
	// vocab.ErrOutOfMemory when the store is full.
	Put(p []byte) (key uint64, err error)
	// Get copies the entry of key into p (FrameSize bytes).
	Get(key uint64, p []byte) error
	// Drop discards the entry of key; a key not stored is ignored.
	Drop(key uint64)
}

// frameStore is implemented by stores that lend their own memory, which
// saves one copy of 2 MiB on every eviction and every fault.
type frameStore interface {
	Store
	// putFrom stores FrameSize bytes that fill writes into b, the store's
	// buffer for the new entry. If fill fails, nothing is stored.
	putFrom(fill func(b []byte) error) (uint64, error)
	// view calls f with the contents of key; f must neither keep nor
	// change b.
	view(key uint64, f func(b []byte) error) error
}

// framePool recycles FrameSize buffers for copies that cannot go straight
// to their destination.
var framePool = sync.Pool{New: func() any { return new([FrameSize]byte) }}

// HostStore is the Store of a mediator: evicted chunks live in host memory
// up to a budget, then in a spill file. It is safe for concurrent use; one
// HostStore serves every space of a mediator.
//
// The spill file is created exclusively with mode 0600 and unlinked at
// once, so no one else can open it and it never outlives the process. It is
// an array of FrameSize slots; a dropped entry's slot goes on a free list
// and is reused before the file grows.
//
// Entries are copied outside the lock: the lock only hands out and takes
// back buffers and slots.
//
// RAM is divided among the open bounded views (Bounded), in proportion to
// their limits (Σ shares ≤ budget), and lent while unused: any entry takes
// free RAM. A view below its share that finds the RAM full moves an entry
// that is borrowed (of a view above its share, or of the store's own Put,
// which belongs to no view) to the spill file, and takes its RAM. So one
// view cannot push another's entries, within that one's share, to the
// spill file, and idle shares cost nobody anything. Without a spill file
// nothing moves: RAM goes to whoever takes it first.
type HostStore struct {
	budget uint64 // bytes of RAM for entries
	dir    string

	mu         sync.Mutex
	spillLimit uint64 // bytes of spill file; 0 means no limit
	closed     bool
	next       uint64                     // the last key handed out
	ram        map[uint64]ramEntry        // entries in RAM
	spare      [][]byte                   // buffers of dropped RAM entries, for reuse
	ramUsed    uint64                     // bytes of RAM entries, those being filled included
	file       *os.File                   // nil without a spill directory, or once closed
	slots      map[uint64]int64           // entries in the spill file, by slot
	free       []int64                    // unused slots below size
	size       int64                      // slots the file spans
	spillUsed  uint64                     // bytes of slots in use, those being filled included
	moved      uint64                     // entries reclaim moved to the spill file
	views      map[*BoundedStore]struct{} // open views, which hold shares of RAM
	viewLimits uint64                     // their limits, in entries
}

// ramEntry is an entry in RAM and the view it counts against (nil: none).
type ramEntry struct {
	buf    []byte
	owner  *BoundedStore
	moving bool // being written to the spill file: buf is read, so never reused
}

// maxSpare bounds the RAM buffers kept for reuse after their entries are
// dropped, so that a burst of evictions does not pin its memory.
const maxSpare = 16

// HostStoreStats is a snapshot of a HostStore's use.
type HostStoreStats struct {
	RAM        uint64 // bytes of entries in RAM
	Spilled    uint64 // bytes of entries in the spill file
	Budget     uint64 // RAM the store may use
	SpillLimit uint64 // bytes the spill file may hold; 0 means no limit
	SpillFile  bool   // whether the store has a spill file
	Moved      uint64 // entries moved from RAM to the spill file for views below their shares
}

// NewHostStore returns a store that keeps up to budget bytes (rounded down
// to whole frames) in RAM and spills the rest to a file in spillDir. With
// spillDir "" there is no spill file, and Put fails once RAM is full.
func NewHostStore(budget uint64, spillDir string) (*HostStore, error) {
	h := &HostStore{
		budget: budget / FrameSize * FrameSize,
		dir:    spillDir,
		ram:    make(map[uint64]ramEntry),
		slots:  make(map[uint64]int64),
		views:  make(map[*BoundedStore]struct{}),
	}
	if spillDir == "" {
		return h, nil
	}
	f, err := os.CreateTemp(spillDir, "vgpu-spill-*") // O_EXCL, mode 0600
	if err != nil {
		return nil, fmt.Errorf("host store: create spill file in %q: %w: %w", spillDir, err, vocab.ErrInvalidArgument)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("host store: unlink spill file %q: %w: %w", f.Name(), err, vocab.ErrInvalidArgument)
	}
	h.file = f
	return h, nil
}

// SetSpillLimit caps the spill file at limit bytes (rounded down to whole
// frames); 0 removes the cap. Entries already spilled stay.
func (h *HostStore) SetSpillLimit(limit uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.spillLimit = limit / FrameSize * FrameSize
	if limit != 0 && h.spillLimit == 0 {
		h.spillLimit = FrameSize
	}
}

// Stats returns a snapshot of the store's use.
func (h *HostStore) Stats() HostStoreStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return HostStoreStats{
		RAM:        uint64(len(h.ram)) * FrameSize,
		Spilled:    uint64(len(h.slots)) * FrameSize,
		Budget:     h.budget,
		SpillLimit: h.spillLimit,
		SpillFile:  h.file != nil,
		Moved:      h.moved,
	}
}

// Close releases the spill file and every entry. Later calls fail, except
// Drop, which does nothing.
func (h *HostStore) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return fmt.Errorf("host store: close: %w", errStoreClosed)
	}
	h.closed = true
	h.ram, h.spare, h.slots, h.free = nil, nil, nil, nil
	h.ramUsed, h.spillUsed = 0, 0
	if h.file == nil {
		return nil
	}
	err := h.file.Close()
	h.file = nil
	if err != nil {
		return fmt.Errorf("host store: close spill file: %w: %w", err, vocab.ErrInternal)
	}
	return nil
}

var errStoreClosed = fmt.Errorf("host store closed: %w", vocab.ErrInvalidArgument)

// reservation is room for one entry: a RAM buffer, or a slot of the file.
type reservation struct {
	ram   bool
	buf   []byte        // a spare buffer, or nil to make one
	owner *BoundedStore // whose RAM share it counts against, if ram
	slot  int64         // unless ram
}

// share is the entries of RAM reserved for view v while it is open. Called
// with h.mu held.
func (h *HostStore) share(v *BoundedStore) uint64 {
	if !v.open {
		return 0
	}
	frames := h.budget / FrameSize
	if h.viewLimits <= frames {
		return v.limit
	}
	// Rounded down, so that the shares never add up to more than budget.
	return frames * v.limit / h.viewLimits
}

// borrowed returns an entry in RAM that counts against no view or against
// one above its share, and is not being moved. Called with h.mu held.
func (h *HostStore) borrowed() (uint64, bool) {
	for k, e := range h.ram {
		if !e.moving && (e.owner == nil || e.owner.inRAM > h.share(e.owner)) {
			return k, true
		}
	}
	return 0, false
}

// reclaim makes room in RAM for an entry of owner, if owner is below its
// share and the RAM is full, by moving a borrowed entry to the spill file.
// Called with h.mu held, which it releases while it writes.
func (h *HostStore) reclaim(owner *BoundedStore) {
	if owner == nil || h.ramUsed+FrameSize <= h.budget || owner.inRAM >= h.share(owner) {
		return
	}
	key, ok := h.borrowed()
	if !ok {
		return
	}
	r, ok := h.reserveSlot()
	if !ok {
		return
	}
	e := h.ram[key]
	e.moving = true
	h.ram[key] = e
	f := h.file
	h.mu.Unlock()
	// Readers of the entry read buf meanwhile; a Drop takes it out of RAM
	// but leaves buf alone.
	_, err := f.WriteAt(e.buf, r.slot*FrameSize)
	h.mu.Lock()
	if h.closed {
		return
	}
	now, ok := h.ram[key]
	if !ok || err != nil {
		if ok {
			now.moving = false
			h.ram[key] = now
		}
		h.releaseSlot(r.slot)
		return
	}
	// buf is not reused: a Get may still be copying from it.
	delete(h.ram, key)
	h.ramUsed -= FrameSize
	if now.owner != nil {
		now.owner.inRAM--
	}
	h.slots[key] = r.slot
	h.moved++
}

// reserve takes room for one entry of owner (nil: none), RAM first.
func (h *HostStore) reserve(owner *BoundedStore) (reservation, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.reclaim(owner)
	}
	if h.closed {
		return reservation{}, errStoreClosed
	}
	if h.ramUsed+FrameSize <= h.budget {
		h.ramUsed += FrameSize
		if owner != nil {
			owner.inRAM++
		}
		var b []byte
		if n := len(h.spare); n > 0 {
			b, h.spare = h.spare[n-1], h.spare[:n-1]
		}
		return reservation{ram: true, buf: b, owner: owner}, nil
	}
	if r, ok := h.reserveSlot(); ok {
		return r, nil
	}
	spill := "no spill file"
	if h.file != nil {
		spill = fmt.Sprintf("%d of %d bytes of spill file in use", h.spillUsed, h.spillLimit)
		if h.spillLimit == 0 {
			spill = fmt.Sprintf("%d bytes of spill file in use and the file cannot grow", h.spillUsed)
		}
	}
	return reservation{}, fmt.Errorf("host store full: %d of %d bytes of host memory in use, %s: %w",
		h.ramUsed, h.budget, spill, vocab.ErrOutOfMemory)
}

// reserveSlot takes a slot of the spill file, if there is one with room.
// Called with h.mu held.
func (h *HostStore) reserveSlot() (reservation, bool) {
	if h.file == nil || h.spillLimit != 0 && h.spillUsed+FrameSize > h.spillLimit {
		return reservation{}, false
	}
	h.spillUsed += FrameSize
	slot := h.size
	if n := len(h.free); n > 0 {
		slot, h.free = h.free[n-1], h.free[:n-1]
	} else {
		h.size++
	}
	return reservation{slot: slot}, true
}

// releaseSlot gives back a slot of the spill file. Called with h.mu held.
func (h *HostStore) releaseSlot(slot int64) {
	h.spillUsed -= FrameSize
	h.free = append(h.free, slot)
}

// commit records a filled reservation under a new key; release gives back
// one that was not filled.
func (h *HostStore) commit(r reservation) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, errStoreClosed
	}
	h.next++
	if r.ram {
		h.ram[h.next] = ramEntry{buf: r.buf, owner: r.owner}
	} else {
		h.slots[h.next] = r.slot
	}
	return h.next, nil
}

func (h *HostStore) release(r reservation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	if r.ram {
		h.ramUsed -= FrameSize
		if r.owner != nil {
			r.owner.inRAM--
		}
		if r.buf != nil {
			h.keepSpare(r.buf)
		}
	} else {
		h.releaseSlot(r.slot)
	}
}

func (h *HostStore) keepSpare(b []byte) {
	if len(h.spare) < maxSpare {
		h.spare = append(h.spare, b)
	}
}

// Put stores a copy of p, which must be FrameSize bytes.
func (h *HostStore) Put(p []byte) (uint64, error) {
	fill, err := copying(p)
	if err != nil {
		return 0, err
	}
	return h.putFrom(fill)
}

// copying returns the fill of an entry that copies p, which must be
// FrameSize bytes.
func copying(p []byte) (func(b []byte) error, error) {
	if len(p) != FrameSize {
		return nil, fmt.Errorf("host store: put of %d bytes, want %d: %w", len(p), FrameSize, vocab.ErrInvalidArgument)
	}
	return func(b []byte) error { copy(b, p); return nil }, nil
}

func (h *HostStore) putFrom(fill func(b []byte) error) (uint64, error) {
	return h.putFor(nil, fill)
}

// putFor stores an entry of owner (nil: none) that fill writes.
func (h *HostStore) putFor(owner *BoundedStore, fill func(b []byte) error) (uint64, error) {
	r, err := h.reserve(owner)
	if err != nil {
		return 0, err
	}
	if r.ram {
		if r.buf == nil {
			r.buf = make([]byte, FrameSize)
		}
		err = fill(r.buf)
	} else {
		err = h.spill(r.slot, fill)
	}
	if err != nil {
		h.release(r)
		return 0, err
	}
	return h.commit(r)
}

// spill fills a scratch buffer and writes it to slot.
func (h *HostStore) spill(slot int64, fill func(b []byte) error) error {
	buf := framePool.Get().(*[FrameSize]byte)
	defer framePool.Put(buf)
	if err := fill(buf[:]); err != nil {
		return err
	}
	f := h.spillFile()
	if f == nil {
		return errStoreClosed
	}
	if _, err := f.WriteAt(buf[:], slot*FrameSize); err != nil {
		class := vocab.ErrInternal
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			class = vocab.ErrOutOfMemory
		}
		return fmt.Errorf("host store: write slot %d of the spill file in %q: %w: %w", slot, h.dir, err, class)
	}
	return nil
}

func (h *HostStore) spillFile() *os.File {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.file
}

// Get copies the entry of key into p, which must be FrameSize bytes.
func (h *HostStore) Get(key uint64, p []byte) error {
	if len(p) != FrameSize {
		return fmt.Errorf("host store: get of %d bytes, want %d: %w", len(p), FrameSize, vocab.ErrInvalidArgument)
	}
	h.mu.Lock()
	e, inRAM := h.ram[key]
	slot, spilled := h.slots[key]
	f, closed := h.file, h.closed
	h.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("host store: get %d: %w", key, errStoreClosed)
	case inRAM:
		copy(p, e.buf)
		return nil
	case spilled:
		if _, err := f.ReadAt(p, slot*FrameSize); err != nil {
			return fmt.Errorf("host store: read slot %d of the spill file in %q: %w: %w", slot, h.dir, err, vocab.ErrInternal)
		}
		return nil
	}
	return fmt.Errorf("host store: no entry %d: %w", key, vocab.ErrInvalidArgument)
}

func (h *HostStore) view(key uint64, f func(b []byte) error) error {
	h.mu.Lock()
	e, inRAM := h.ram[key]
	h.mu.Unlock()
	if inRAM {
		return f(e.buf)
	}
	buf := framePool.Get().(*[FrameSize]byte)
	defer framePool.Put(buf)
	if err := h.Get(key, buf[:]); err != nil {
		return err
	}
	return f(buf[:])
}

// Drop discards the entry of key; its RAM or slot is reused.
func (h *HostStore) Drop(key uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.ram[key]; ok {
		delete(h.ram, key)
		h.ramUsed -= FrameSize
		if e.owner != nil {
			e.owner.inRAM--
		}
		if !e.moving { // else reclaim is reading it
			h.keepSpare(e.buf)
		}
	} else if slot, ok := h.slots[key]; ok {
		delete(h.slots, key)
		h.releaseSlot(slot)
		if h.spillUsed == 0 && h.file.Truncate(0) == nil {
			// The last spilled entry is gone (and no slot is being
			// filled): give the disk back.
			h.free, h.size = h.free[:0], 0
		}
	}
}
