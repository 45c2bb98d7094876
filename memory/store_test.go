package memory

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

func mustPut(t testing.TB, h *HostStore, p []byte) uint64 {
	t.Helper()
	k, err := h.Put(p)
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	return k
}

func mustGet(t testing.TB, h *HostStore, key uint64, want []byte) {
	t.Helper()
	got := make([]byte, FrameSize)
	if err := h.Get(key, got); err != nil {
		t.Fatalf("get %d: %v", key, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("get %d: contents differ", key)
	}
}

func spillSize(t *testing.T, h *HostStore) int64 {
	t.Helper()
	fi, err := h.file.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestHostStoreRAMThenSpill: entries go to RAM up to the budget, then to a
// private, unlinked spill file, and come back intact from either.
func TestHostStoreRAMThenSpill(t *testing.T) {
	dir := t.TempDir()
	h, err := NewHostStore(2*FrameSize+FrameSize/2, dir) // rounds down to 2 frames
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("spill directory shows %d entries; the file must be unlinked", len(ents))
	}
	fi, err := h.file.Stat()
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("spill file mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	var keys []uint64
	for i := range 5 {
		keys = append(keys, mustPut(t, h, pattern(uint64(i), FrameSize)))
	}
	if st := h.Stats(); st.RAM != 2*FrameSize || st.Spilled != 3*FrameSize || st.Budget != 2*FrameSize || !st.SpillFile {
		t.Fatalf("stats %+v, want 2 frames in RAM and 3 spilled", st)
	}
	if n := spillSize(t, h); n != 3*FrameSize {
		t.Errorf("spill file of %d bytes, want 3 slots", n)
	}
	for i, k := range keys {
		mustGet(t, h, k, pattern(uint64(i), FrameSize))
	}
	// Lending: view sees the same bytes, from RAM or the file.
	for i, k := range keys {
		if err := h.view(k, func(b []byte) error {
			if !bytes.Equal(b, pattern(uint64(i), FrameSize)) {
				return errors.New("differs")
			}
			return nil
		}); err != nil {
			t.Errorf("view %d: %v", k, err)
		}
	}
}

// TestHostStoreSlotReuse: a dropped spilled entry's slot is reused before
// the file grows, and the file is emptied when its last entry goes.
func TestHostStoreSlotReuse(t *testing.T) {
	h, err := NewHostStore(0, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a := mustPut(t, h, pattern(1, FrameSize))
	b := mustPut(t, h, pattern(2, FrameSize))
	c := mustPut(t, h, pattern(3, FrameSize))
	h.Drop(b)
	h.Drop(b) // a second drop is ignored
	d := mustPut(t, h, pattern(4, FrameSize))
	if n := spillSize(t, h); n != 3*FrameSize {
		t.Errorf("file of %d bytes after reusing a slot, want %d", n, 3*FrameSize)
	}
	if d == b {
		t.Error("a key was handed out twice")
	}
	mustGet(t, h, a, pattern(1, FrameSize))
	mustGet(t, h, c, pattern(3, FrameSize))
	mustGet(t, h, d, pattern(4, FrameSize))
	if err := h.Get(b, make([]byte, FrameSize)); !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Errorf("get of a dropped key: %v", err)
	}
	for _, k := range []uint64{a, c, d} {
		h.Drop(k)
	}
	if n := spillSize(t, h); n != 0 {
		t.Errorf("file of %d bytes with no entries, want 0", n)
	}
	mustPut(t, h, pattern(5, FrameSize))
	if n := spillSize(t, h); n != FrameSize {
		t.Errorf("file of %d bytes with one entry", n)
	}
}

// TestHostStoreFull: with RAM and spill file full, Put fails with
// out-of-memory naming both budgets, and a Drop makes room again.
func TestHostStoreFull(t *testing.T) {
	tests := []struct {
		name  string
		spill bool
		limit uint64
		fits  int
		names []string
	}{
		{"no spill file", false, 0, 2, []string{fmt.Sprintf("%d of %d bytes of host memory", 2*FrameSize, 2*FrameSize), "no spill file"}},
		{"spill limit", true, 3 * FrameSize, 5, []string{fmt.Sprintf("%d of %d bytes of host memory", 2*FrameSize, 2*FrameSize),
			fmt.Sprintf("%d of %d bytes of spill file", 3*FrameSize, 3*FrameSize)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newStore(t, 2, tt.spill)
			h.SetSpillLimit(tt.limit)
			var keys []uint64
			for i := range tt.fits {
				keys = append(keys, mustPut(t, h, pattern(uint64(i), FrameSize)))
			}
			before := h.Stats()
			_, err := h.Put(pattern(99, FrameSize))
			wantErr(t, "put into a full store", err, vocab.ErrOutOfMemory, tt.names...)
			_, err = h.putFrom(func([]byte) error { t.Error("fill called on a full store"); return nil })
			wantErr(t, "putFrom into a full store", err, vocab.ErrOutOfMemory)
			if st := h.Stats(); st != before {
				t.Errorf("failed puts changed stats: %+v, were %+v", st, before)
			}
			h.Drop(keys[len(keys)-1])
			mustPut(t, h, pattern(7, FrameSize))
			for i, k := range keys[:len(keys)-1] {
				mustGet(t, h, k, pattern(uint64(i), FrameSize))
			}
		})
	}
}

func TestHostStoreMisuse(t *testing.T) {
	if _, err := NewHostStore(FrameSize, "/nonexistent/spill/dir"); !errors.Is(err, vocab.ErrInvalidArgument) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("bad spill directory: %v", err)
	}
	h := newStore(t, 1, true)
	_, err := h.Put(make([]byte, 10))
	wantErr(t, "short put", err, vocab.ErrInvalidArgument, "10 bytes")
	k := mustPut(t, h, pattern(1, FrameSize))
	wantErr(t, "short get", h.Get(k, make([]byte, 10)), vocab.ErrInvalidArgument, "10 bytes")
	wantErr(t, "unknown key", h.Get(k+100, make([]byte, FrameSize)), vocab.ErrInvalidArgument, fmt.Sprint(k+100))
	// A fill that fails stores nothing.
	boom := errors.New("boom")
	for range 3 { // RAM, then the file, then the file again (slot released)
		if _, err := h.putFrom(func([]byte) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("failed fill: %v", err)
		}
	}
	if st := h.Stats(); st.RAM != FrameSize || st.Spilled != 0 {
		t.Errorf("failed fills left %+v", st)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = h.Put(pattern(1, FrameSize))
	wantErr(t, "put after close", err, vocab.ErrInvalidArgument, "closed")
	wantErr(t, "get after close", h.Get(k, make([]byte, FrameSize)), vocab.ErrInvalidArgument, "closed")
	h.Drop(k)
	wantErr(t, "second close", h.Close(), vocab.ErrInvalidArgument, "closed")
	if st := h.Stats(); st.RAM != 0 || st.Spilled != 0 || st.SpillFile {
		t.Errorf("stats after close: %+v", st)
	}
}

// TestHostStoreConcurrent: many goroutines put, get, view and drop their
// own entries at once, in RAM and the spill file; the race detector and the
// contents judge it.
func TestHostStoreConcurrent(t *testing.T) {
	h := newStore(t, 3, true)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var keys []uint64
			var seeds []uint64
			for i := range 30 {
				seed := uint64(g*1000 + i)
				k, err := h.Put(pattern(seed, FrameSize))
				if err != nil {
					t.Error(err)
					return
				}
				keys, seeds = append(keys, k), append(seeds, seed)
				if i%3 == 2 { // drop the oldest
					got := make([]byte, FrameSize)
					if err := h.Get(keys[0], got); err != nil || !bytes.Equal(got, pattern(seeds[0], FrameSize)) {
						t.Errorf("goroutine %d: entry %d: %v or wrong contents", g, keys[0], err)
					}
					h.Drop(keys[0])
					keys, seeds = keys[1:], seeds[1:]
				}
				if err := h.view(k, func(b []byte) error {
					if !bytes.Equal(b, pattern(seed, FrameSize)) {
						return fmt.Errorf("entry %d differs", k)
					}
					return nil
				}); err != nil {
					t.Error(err)
				}
				h.Stats()
			}
			for _, k := range keys {
				h.Drop(k)
			}
		})
	}
	wg.Wait()
	if st := h.Stats(); st.RAM != 0 || st.Spilled != 0 {
		t.Errorf("after every entry is dropped: %+v", st)
	}
}
