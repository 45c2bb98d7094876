package memory

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

func mustAllocHint(t *testing.T, s *Space, dev uint32, size uint64, hint vocab.Hint) uint64 {
	t.Helper()
	va, err := s.AllocHint(dev, size, hint)
	if err != nil {
		t.Fatalf("alloc %d on device %d with hint %v: %v", size, dev, hint, err)
	}
	return va
}

func chunkOf(va uint64) uint64 { return va &^ (Page2M - 1) }

// TestAllocHintPacking: small allocations share a chunk only with those of
// the same device and hint, and Hint reports what they were given.
func TestAllocHintPacking(t *testing.T) {
	s := NewSpace(newFakeNode(8).lease(0), 0)
	w1 := mustAllocHint(t, s, 0, Page4K, vocab.HintWeight)
	w2 := mustAllocHint(t, s, 0, Page64K, vocab.HintWeight)
	act := mustAllocHint(t, s, 0, Page4K, vocab.HintActivation)
	none := mustAlloc(t, s, 0, Page4K)
	w3 := mustAllocHint(t, s, 1, Page4K, vocab.HintWeight)
	act2 := mustAllocHint(t, s, 0, 3*Page4K, vocab.HintActivation)
	if chunkOf(w1) != chunkOf(w2) || chunkOf(act) != chunkOf(act2) {
		t.Errorf("same device and hint not packed: %#x %#x, %#x %#x", w1, w2, act, act2)
	}
	chunks := map[uint64]bool{chunkOf(w1): true, chunkOf(act): true, chunkOf(none): true, chunkOf(w3): true}
	if len(chunks) != 4 || s.Stats().Frames != 4 {
		t.Errorf("different hints or devices share chunks: %#x %#x %#x %#x, %d frames", w1, act, none, w3, s.Stats().Frames)
	}
	for va, want := range map[uint64]vocab.Hint{w1: vocab.HintWeight, w2 + Page64K - 1: vocab.HintWeight, act2: vocab.HintActivation, none: vocab.HintNone} {
		if h, sealed, err := s.Hint(va); h != want || sealed || err != nil {
			t.Errorf("hint of %#x: %v, sealed %v, %v; want %v", va, h, sealed, err, want)
		}
	}
	_, _, err := s.Hint(w1 + Page4K)
	wantErr(t, "hint of a free address", err, vocab.ErrInvalidAddress, fmt.Sprintf("%#x", w1+Page4K))

	before := s.Stats()
	_, err = s.AllocHint(0, Page4K, vocab.Hint(9))
	wantErr(t, "invalid hint", err, vocab.ErrInvalidArgument, "hint(9)")
	if st := s.Stats(); !sameStats(st, before) {
		t.Errorf("refused alloc changed stats: %+v, was %+v", st, before)
	}
}

// TestEvictionOrderByHint: victims go by class first (activation and
// staging, none, kv-cache, weight), then least recently translated, both
// when the space's cap is reached and when the device is full.
func TestEvictionOrderByHint(t *testing.T) {
	for _, tc := range []struct {
		name     string
		frames   int    // of the device
		resident uint64 // the space's cap
	}{
		{"cap", 16, 5 * FrameSize},
		{"device full", 5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := newFakeNode(tc.frames)
			s := NewSpace(node.lease(0), 0)
			s.Oversubscribe(newStore(t, 16, false), tc.resident)
			w := mustAllocHint(t, s, 0, Page2M, vocab.HintWeight)
			kv := mustAllocHint(t, s, 0, Page2M, vocab.HintKVCache)
			none := mustAlloc(t, s, 0, Page2M)
			stg := mustAllocHint(t, s, 0, Page2M, vocab.HintStaging)
			act := mustAllocHint(t, s, 0, Page2M, vocab.HintActivation)
			// Least recently translated first is the reverse of the classes.
			for _, va := range []uint64{w, kv, none, stg, act} {
				mustTranslate(t, s, va, 1)
			}
			probes := make([]uint64, 5)
			for i := range probes {
				probes[i] = mustAllocHint(t, s, 0, Page2M, vocab.HintWeight) // evicted: no room
			}
			for i, want := range []uint64{stg, act, none, kv, w} {
				mustTranslate(t, s, probes[i], 1)
				if s.Resident(Range{VA: want, Len: 1}) {
					t.Fatalf("fault %d did not evict %#x", i, want)
				}
				if st := s.Stats(); st.Evictions != uint64(i+1) || st.Frames != 5 {
					t.Fatalf("fault %d: %+v", i, st)
				}
			}
		})
	}
}

// TestSealRefusesWrites: a sealed allocation refuses write translations,
// alone or among a command's ranges, before anything faults in; reads and
// other allocations are unaffected; bad addresses are refused.
func TestSealRefusesWrites(t *testing.T) {
	node := newFakeNode(1)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(newStore(t, 4, false), 0)
	a := mustAllocHint(t, s, 0, Page2M, vocab.HintWeight)
	b := mustAlloc(t, s, 0, Page2M) // evicted: the device has one frame
	for range 2 {                   // sealing twice is fine
		if err := s.Seal(a); err != nil {
			t.Fatalf("seal %#x: %v", a, err)
		}
	}
	if h, sealed, err := s.Hint(a + 5); h != vocab.HintWeight || !sealed || err != nil {
		t.Errorf("hint of sealed %#x: %v, %v, %v", a, h, sealed, err)
	}
	_, _, err := s.TranslateWrite(a+Page4K, 8)
	wantErr(t, "write to sealed", err, vocab.ErrPermissionDenied, fmt.Sprintf("%#x", a+Page4K), "sealed")
	mustTranslate(t, s, a, Page2M)

	// b's chunk is evicted: a refused command must not fault it in.
	before := s.Stats()
	_, err = s.TranslateAll([]Range{{VA: b, Len: 1, Write: true}, {VA: a, Len: 1, Write: true}})
	wantErr(t, "command writing a sealed operand", err, vocab.ErrPermissionDenied, fmt.Sprintf("%#x", a))
	if st := s.Stats(); !sameStats(st, before) || s.Resident(Range{VA: b, Len: 1}) {
		t.Errorf("refused command changed the space: %+v, was %+v", st, before)
	}
	if _, err := s.TranslateAll([]Range{{VA: a, Len: 1}, {VA: b, Len: 1, Write: true}}); err == nil {
		t.Error("two chunks fit a device of one frame")
	}
	if _, _, err := s.TranslateWrite(b, Page2M); err != nil {
		t.Errorf("write to unsealed %#x: %v", b, err)
	}

	err = s.Seal(a + Page4K)
	wantErr(t, "seal inside", err, vocab.ErrInvalidAddress, fmt.Sprintf("%#x", a+Page4K), fmt.Sprintf("%#x", a))
	err = s.Seal(vaBase - Page4K)
	wantErr(t, "seal of nothing", err, vocab.ErrInvalidAddress, fmt.Sprintf("%#x", vaBase-Page4K))
	if err := s.Free(a); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Hint(a)
	wantErr(t, "hint of a freed allocation", err, vocab.ErrInvalidAddress)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "seal after close", s.Seal(b), vocab.ErrInvalidArgument)
}

// TestCleanEviction: a chunk whose allocations are all sealed is read back
// from the device at most once after sealing; a chunk that also holds an
// unsealed allocation, or gets a new one, is written back every time.
func TestCleanEviction(t *testing.T) {
	node := newFakeNode(1)
	store := newCheckedStore(newStore(t, 8, false), false)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(store, 0)
	w := mustAllocHint(t, s, 0, Page2M-Page64K, vocab.HintWeight)
	other := mustAlloc(t, s, 0, Page2M) // evicted: the device has one frame
	data := pattern(3, Page2M-Page64K)
	writeVA(t, node, s, w, data)
	if err := s.Seal(w); err != nil {
		t.Fatal(err)
	}
	// cycle brings other in, then w, and checks the counters and entries.
	cycle := func(step string, writeBacks, clean uint64, entries int) {
		t.Helper()
		mustTranslate(t, s, other, 1)
		if got := readVA(t, node, s, w, uint64(len(data))); !bytes.Equal(got, data) {
			t.Fatalf("%s: sealed %#x lost its data", step, w)
		}
		st := s.Stats()
		if st.WriteBacks != writeBacks || st.CleanEvictions != clean || node.readCount() != int(writeBacks) || store.count() != entries {
			t.Fatalf("%s: %d write-backs, %d clean, %d reads, %d entries; want %d, %d, %d, %d",
				step, st.WriteBacks, st.CleanEvictions, node.readCount(), store.count(), writeBacks, clean, writeBacks, entries)
		}
	}
	// The first eviction after sealing writes back; w keeps its entry when
	// faulted in (other's is there too), and later ones skip the read.
	cycle("first", 2, 0, 2)
	cycle("second", 3, 1, 2)
	cycle("third", 4, 2, 2)

	// A new allocation in w's chunk is not sealed: the kept entry goes,
	// and the chunk is written back until that one is sealed too.
	extra := mustAllocHint(t, s, 0, Page4K, vocab.HintWeight)
	if chunkOf(extra) != chunkOf(w) {
		t.Fatalf("%#x not packed with %#x", extra, w)
	}
	if store.count() != 1 {
		t.Fatalf("%d entries after a new allocation in a clean chunk, want other's only", store.count())
	}
	writeVA(t, node, s, extra, []byte{1, 2, 3})
	cycle("mixed", 6, 2, 1)
	cycle("mixed again", 8, 2, 1)
	if err := s.Seal(extra); err != nil {
		t.Fatal(err)
	}
	cycle("sealed again", 10, 2, 2)
	cycle("clean again", 11, 3, 2)
	if got := readVA(t, node, s, extra, 3); !bytes.Equal(got, []byte{1, 2, 3}) {
		t.Fatalf("%#x lost its data: %v", extra, got)
	}

	// Freeing and closing drop kept entries like any other.
	if err := s.Free(extra); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(w); err != nil {
		t.Fatal(err)
	}
	if store.count() != 1 {
		t.Fatalf("%d entries after freeing the resident clean chunk, want other's only", store.count())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if store.count() != 0 || len(store.problems()) != 0 || len(node.violations) != 0 {
		t.Errorf("after close: %d entries, %v, %v", store.count(), store.problems(), node.violations)
	}
}

// TestAllocationAt: any address inside an allocation's addressable range
// names the whole allocation, with its device and seal; the rounded
// tail, the gap after it and a freed allocation name none.
func TestAllocationAt(t *testing.T) {
	s := NewSpace(newFakeNode(8).lease(0), 0)
	small := mustAllocHint(t, s, 0, 100, vocab.HintKVCache)
	big := mustAllocHint(t, s, 1, Page2M+8, vocab.HintWeight)
	if err := s.Seal(big); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		va   uint64
		want Allocation
	}{
		{small, Allocation{VA: small, End: small + 100, Dev: 0}},
		{small + 99, Allocation{VA: small, End: small + 100, Dev: 0}},
		{big + Page2M, Allocation{VA: big, End: big + Page2M + 8, Dev: 1, Sealed: true}},
	} {
		if got, err := s.AllocationAt(tc.va); err != nil || got != tc.want {
			t.Errorf("allocation at %#x: %+v, %v; want %+v", tc.va, got, err, tc.want)
		}
	}
	if err := s.Free(small); err != nil {
		t.Fatal(err)
	}
	for _, va := range []uint64{small, big + Page2M + 8, big + Page2M + Page4K} {
		_, err := s.AllocationAt(va)
		wantErr(t, fmt.Sprintf("allocation at %#x", va), err, vocab.ErrInvalidAddress, fmt.Sprintf("%#x", va))
	}
}
