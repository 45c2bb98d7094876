package memory

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/vgpu/vgpu/api/vocab"
)

// FileStore is a Store in a file of its own that outlives the process: the
// store of a session whose mediator journals it, so that its evicted
// chunks survive a restart of the mediator. The file is an array of
// FrameSize slots, key k in slot k-1; a dropped key's slot is reused
// before the file grows. Each entry's CRC-32C (Castagnoli), taken as it is
// put, is kept for its journal record (Sum); a restore checks the
// reopened file's entries against the sums the journal recorded
// (OpenFileStore, Adopt, Verify), so a damaged file is refused, never
// served.
//
// An entry is in the page cache once Put returns (pwrite, no fsync): it
// survives the death of the process, which is what it is for, not that of
// the host, which takes the tenants with it.
//
// It is safe for concurrent use; distinct keys are read and written
// outside its lock.
type FileStore struct {
	path  string
	bound *BoundedStore // whose limit its entries count against, or nil

	mu     sync.Mutex
	f      *os.File          // guarded by mu; nil once closed
	sums   map[uint64]uint32 // live entries' CRC-32Cs by key; guarded by mu
	free   []uint64          // unused keys up to next; guarded by mu
	next   uint64            // the highest key the file spans; guarded by mu
	filled bool              // false while a restore adopts entries (OpenFileStore to Verify); guarded by mu
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CreateFileStore creates the store's file at path, exclusively, mode
// 0600. bound, if not nil, counts its entries against a container's limit
// (BoundedStore), as a HostStore view's would.
func CreateFileStore(path string, bound *BoundedStore) (*FileStore, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("file store: create %q: %w: %w", path, err, vocab.ErrInvalidArgument)
	}
	return &FileStore{path: path, bound: bound, f: f, sums: map[uint64]uint32{}, filled: true}, nil
}

// OpenFileStore opens the file a FileStore left at path, for a restore: it
// holds no entry until the restore adopts those its journal names
// (Adopt), and Verify checks them; Put fails until then.
func OpenFileStore(path string, bound *BoundedStore) (*FileStore, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("file store: open %q: %w: %w", path, err, vocab.ErrInvalidArgument)
	}
	return &FileStore{path: path, bound: bound, f: f, sums: map[uint64]uint32{}}, nil
}

var errFileStoreClosed = fmt.Errorf("file store closed: %w", vocab.ErrInvalidArgument)

// Sum returns the CRC-32C of key's entry, and whether it is held.
func (s *FileStore) Sum(key uint64) (uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum, ok := s.sums[key]
	return sum, ok
}

// Bytes is the bytes of the entries it holds.
func (s *FileStore) Bytes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return uint64(len(s.sums)) * FrameSize
}

// Put writes a copy of p, FrameSize bytes, to a free slot.
func (s *FileStore) Put(p []byte) (uint64, error) {
	if len(p) != FrameSize {
		return 0, fmt.Errorf("file store: put of %d bytes, want %d: %w", len(p), FrameSize, vocab.ErrInvalidArgument)
	}
	if s.bound != nil {
		if err := s.bound.reserve(); err != nil {
			return 0, err
		}
	}
	key, err := s.put(p)
	if s.bound != nil {
		s.bound.settle(err == nil)
	}
	return key, err
}

func (s *FileStore) put(p []byte) (uint64, error) {
	sum := crc32.Checksum(p, castagnoli)
	s.mu.Lock()
	if s.f == nil || !s.filled {
		s.mu.Unlock()
		return 0, fmt.Errorf("file store %q: put: %w", s.path, errFileStoreClosed)
	}
	var key uint64
	if n := len(s.free); n > 0 {
		key, s.free = s.free[n-1], s.free[:n-1]
	} else {
		s.next++
		key = s.next
	}
	f := s.f
	s.mu.Unlock()
	_, err := f.WriteAt(p, int64(key-1)*FrameSize)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil { // closed meanwhile: the entry goes with the store
		return 0, fmt.Errorf("file store %q: put: %w", s.path, errFileStoreClosed)
	}
	if err != nil {
		s.free = append(s.free, key)
		class := vocab.ErrInternal
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			class = vocab.ErrOutOfMemory
		}
		return 0, fmt.Errorf("file store: write slot %d of %q: %w: %w", key-1, s.path, err, class)
	}
	s.sums[key] = sum
	return key, nil
}

// Get reads key's entry into p, FrameSize bytes.
func (s *FileStore) Get(key uint64, p []byte) error {
	if len(p) != FrameSize {
		return fmt.Errorf("file store: get of %d bytes, want %d: %w", len(p), FrameSize, vocab.ErrInvalidArgument)
	}
	s.mu.Lock()
	_, ok := s.sums[key]
	f := s.f
	s.mu.Unlock()
	switch {
	case f == nil:
		return fmt.Errorf("file store %q: get %d: %w", s.path, key, errFileStoreClosed)
	case !ok:
		return fmt.Errorf("file store %q: no entry %d: %w", s.path, key, vocab.ErrInvalidArgument)
	}
	if _, err := f.ReadAt(p, int64(key-1)*FrameSize); err != nil {
		return fmt.Errorf("file store: read slot %d of %q: %w: %w", key-1, s.path, err, vocab.ErrInternal)
	}
	return nil
}

// Drop discards key's entry; its slot is reused. A key not held is
// ignored.
func (s *FileStore) Drop(key uint64) {
	s.mu.Lock()
	_, ok := s.sums[key]
	if ok {
		delete(s.sums, key)
		if s.filled {
			s.free = append(s.free, key)
		}
	}
	s.mu.Unlock()
	if ok && s.bound != nil {
		s.bound.uncharge()
	}
}

// Adopt makes key, an entry of the reopened file whose CRC-32C the journal
// recorded as sum, one of the store's, as a restore replays the eviction
// that put it there. Verify checks it.
func (s *FileStore) Adopt(key uint64, sum uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.f == nil:
		return fmt.Errorf("file store %q: adopt %d: %w", s.path, key, errFileStoreClosed)
	case s.filled:
		return fmt.Errorf("file store %q: adopt %d after the restore: %w", s.path, key, vocab.ErrInvalidArgument)
	case key == 0:
		return fmt.Errorf("file store %q: adopt key 0: %w", s.path, vocab.ErrInvalidArgument)
	}
	if old, ok := s.sums[key]; ok {
		if old == sum { // a clean chunk evicted again: it kept its entry
			return nil
		}
		return fmt.Errorf("file store %q: key %d adopted again with CRC-32C %08x, held with %08x: %w", s.path, key, sum, old, vocab.ErrInvalidArgument)
	}
	if s.bound != nil {
		if err := s.bound.reserve(); err != nil {
			return err
		}
		s.bound.settle(true)
	}
	s.sums[key] = sum
	s.next = max(s.next, key)
	return nil
}

// Verify ends a restore: it reads every adopted entry and checks it
// against its sum, then frees the slots no entry holds for reuse. A
// missing or damaged entry fails it, naming the slot.
func (s *FileStore) Verify() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return fmt.Errorf("file store %q: verify: %w", s.path, errFileStoreClosed)
	}
	buf := framePool.Get().(*[FrameSize]byte)
	defer framePool.Put(buf)
	keys := slices.Sorted(func(yield func(uint64) bool) {
		for k := range s.sums {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		if _, err := s.f.ReadAt(buf[:], int64(k-1)*FrameSize); err != nil {
			return fmt.Errorf("file store %q: slot %d: %w: %w", s.path, k-1, err, vocab.ErrInvalidArgument)
		}
		if got := crc32.Checksum(buf[:], castagnoli); got != s.sums[k] {
			return fmt.Errorf("file store %q: slot %d has CRC-32C %08x, its journal records %08x: %w",
				s.path, k-1, got, s.sums[k], vocab.ErrInvalidArgument)
		}
	}
	for k := s.next; k >= 1; k-- {
		if _, ok := s.sums[k]; !ok {
			s.free = append(s.free, k)
		}
	}
	s.filled = true
	return nil
}

// Close closes the file and gives back what its entries count against
// the bound; Remove deletes the file too. The file stays for a next
// process otherwise (a handover, or a test's crash).
func (s *FileStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	if s.bound != nil {
		for range s.sums {
			s.bound.uncharge()
		}
	}
	s.sums, s.free = nil, nil
	if err != nil {
		return fmt.Errorf("file store: close %q: %w: %w", s.path, err, vocab.ErrInternal)
	}
	return nil
}

// Remove closes the store and deletes its file.
func (s *FileStore) Remove() error {
	err := s.Close()
	if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("file store: remove %q: %w: %w", s.path, rerr, vocab.ErrInternal))
	}
	return err
}
