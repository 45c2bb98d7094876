package memory

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
	"pgregory.net/rapid"
)

// writeVA writes p at va through the space's translation into the fake
// node's frames, as a copy to the device would.
func writeVA(t testing.TB, node *fakeNode, s *Space, va uint64, p []byte) {
	t.Helper()
	dev, xs, err := s.Translate(va, uint64(len(p)))
	if err != nil {
		t.Fatalf("translate %#x+%d: %v", va, len(p), err)
	}
	copyExtents(node, dev, xs, p, true)
}

// readVA reads n bytes at va as a copy from the device would.
func readVA(t testing.TB, node *fakeNode, s *Space, va, n uint64) []byte {
	t.Helper()
	dev, xs, err := s.Translate(va, n)
	if err != nil {
		t.Fatalf("translate %#x+%d: %v", va, n, err)
	}
	p := make([]byte, n)
	copyExtents(node, dev, xs, p, false)
	return p
}

// copyExtents copies p into (write) or out of the node memory of xs.
func copyExtents(node *fakeNode, dev uint32, xs []vocab.Extent, p []byte, write bool) {
	for _, x := range xs {
		for pa, end := x.Addr, x.Addr+x.Len; pa < end; {
			n := min(end, (pa|(FrameSize-1))+1) - pa
			b := node.bytes(dev, pa)[pa%FrameSize:][:n]
			if write {
				copy(b, p)
			} else {
				copy(p, b)
			}
			p, pa = p[n:], pa+n
		}
	}
}

// pattern returns n bytes that differ with seed and with the 4 KiB page:
// each page is one random block of the seed, with the seed and the page
// number written at both ends.
func pattern(seed uint64, n int) []byte {
	block := make([]byte, Page4K)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i < len(block); i += 8 {
		binary.LittleEndian.PutUint64(block[i:], r.Uint64())
	}
	p := make([]byte, n)
	for off := 0; off < n; off += Page4K {
		page := p[off:min(n, off+Page4K)]
		copy(page, block)
		var tag [16]byte
		binary.LittleEndian.PutUint64(tag[:], seed)
		binary.LittleEndian.PutUint64(tag[8:], uint64(off/Page4K))
		copy(page, tag[:])
		if len(page) >= 32 {
			copy(page[len(page)-16:], tag[:])
		}
	}
	return p
}

func newStore(t testing.TB, ramFrames uint64, spill bool) *HostStore {
	t.Helper()
	dir := ""
	if spill {
		dir = t.TempDir()
	}
	h, err := NewHostStore(ramFrames*FrameSize, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestOversubscribeRoundTrip keeps twice as much memory as the device has
// and cycles through it: every byte comes back, chunks fault in and out,
// and full chunks are single 2 MiB leaves whenever they are resident.
func TestOversubscribeRoundTrip(t *testing.T) {
	for _, lend := range []bool{true, false} {
		t.Run(fmt.Sprintf("lend=%v", lend), func(t *testing.T) {
			node := newFakeNode(2)
			hs := newStore(t, 1, true) // one frame of RAM, then the spill file
			var store Store = hs
			if !lend {
				store = newCheckedStore(hs, false)
			}
			s := NewSpace(node.lease(0), 0)
			s.Oversubscribe(store, 0)
			big := mustAlloc(t, s, 0, 3*Page2M)
			small := mustAlloc(t, s, 0, 5*Page4K)
			// The device cannot back the 3 chunks of big, which start
			// evicted; small gets a frame.
			st := s.Stats()
			if st.Resident != Page2M || st.Evicted != 3*Page2M || st.Frames != 1 || st.Allocated != 3*Page2M+5*Page4K {
				t.Fatalf("after allocating twice the device: %+v", st)
			}
			data := map[uint64][]byte{
				big: pattern(1, Page2M), big + Page2M: pattern(2, Page2M), big + 2*Page2M: pattern(3, Page2M),
				small: pattern(4, 5*Page4K),
			}
			for round := range 3 {
				for _, va := range []uint64{big, big + Page2M, big + 2*Page2M, small} {
					if round == 0 {
						writeVA(t, node, s, va, data[va])
						continue
					}
					if got := readVA(t, node, s, va, uint64(len(data[va]))); !bytes.Equal(got, data[va]) {
						t.Fatalf("round %d: %#x lost its data", round, va)
					}
				}
			}
			st = s.Stats()
			if st.Frames != 2 || st.Faults == 0 || st.Evictions == 0 || st.Resident+st.Evicted != 4*Page2M {
				t.Errorf("after cycling: %+v", st)
			}
			if hst := hs.Stats(); hst.RAM != FrameSize || hst.Spilled != FrameSize {
				t.Errorf("store: %+v, want one entry in RAM and one spilled", hst)
			}
			// A full resident chunk is one 2 MiB leaf.
			mustTranslate(t, s, big, Page2M)
			s.mu.Lock()
			l, ok := s.pt.walk(big)
			s.mu.Unlock()
			if !ok || l.class != class2M {
				t.Errorf("faulted-in full chunk: leaf %+v, %v; want a 2 MiB leaf", l, ok)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if hst := hs.Stats(); hst.RAM != 0 || hst.Spilled != 0 || len(node.owner) != 0 || len(node.violations) != 0 {
				t.Errorf("after close: store %+v, %d frames leased, violations %v", hst, len(node.owner), node.violations)
			}
		})
	}
}

// TestOversubscribeZeroChunks: a chunk created evicted reads as zero, also
// when it is faulted into a frame reused from another chunk.
func TestOversubscribeZeroChunks(t *testing.T) {
	node := newFakeNode(1)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(newStore(t, 4, false), 0)
	a := mustAlloc(t, s, 0, Page2M)
	b := mustAlloc(t, s, 0, Page2M) // the device is full: b starts evicted
	writeVA(t, node, s, a, bytes.Repeat([]byte{0xaa}, Page2M))
	if got := readVA(t, node, s, b, Page2M); !bytes.Equal(got, make([]byte, Page2M)) {
		t.Fatal("a never-written chunk faulted into a reused frame is not zero")
	}
	if node.zeros != 1 || node.writes != 0 || node.reads != 1 {
		t.Errorf("node saw %d reads, %d writes, %d zeros; want 1, 0, 1", node.reads, node.writes, node.zeros)
	}
	if got := readVA(t, node, s, a, Page2M); !bytes.Equal(got, bytes.Repeat([]byte{0xaa}, Page2M)) {
		t.Fatal("evicted chunk lost its data")
	}
}

// TestOversubscribeCap: the resident cap holds, a range larger than it
// fails with out-of-memory naming both sizes, and nothing changes.
func TestOversubscribeCap(t *testing.T) {
	node := newFakeNode(8)
	store := newStore(t, 8, false)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(store, 2*FrameSize)
	va := mustAlloc(t, s, 0, 3*Page2M)
	if st := s.Stats(); st.Frames != 2 || st.Evicted != Page2M {
		t.Fatalf("3 chunks under a cap of 2: %+v", st)
	}
	before := s.Stats()
	_, _, err := s.Translate(va, 2*Page2M+1)
	wantErr(t, "range over the cap", err, vocab.ErrOutOfMemory, fmt.Sprint(2*Page2M+1), fmt.Sprint(2*FrameSize))
	if st := s.Stats(); st != before {
		t.Errorf("failed translate changed stats: %+v, was %+v", st, before)
	}
	for off := uint64(0); off < 3*Page2M; off += Page2M / 2 {
		mustTranslate(t, s, va+off, Page2M/2)
		if st := s.Stats(); st.Frames > 2 {
			t.Fatalf("%d frames over the cap of 2", st.Frames)
		}
	}
	if len(node.held(0)) != 2 {
		t.Errorf("space holds %d frames, cap 2", len(node.held(0)))
	}
}

// TestOversubscribeFull: when neither the device nor the host store can
// take more, a fault fails with out-of-memory that names both budgets, and
// nothing changes; an allocation still succeeds (the quota allows it).
func TestOversubscribeFull(t *testing.T) {
	node := newFakeNode(1)
	store := newStore(t, 0, false)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(store, 0)
	a := mustAlloc(t, s, 0, Page2M)
	b := mustAlloc(t, s, 0, Page2M)
	data := pattern(7, Page2M)
	writeVA(t, node, s, a, data)
	before := s.Stats()
	_, _, err := s.Translate(b, 1)
	wantErr(t, "both full", err, vocab.ErrOutOfMemory, "host store full", "0 of 0 bytes of host memory", "no spill file")
	if st := s.Stats(); !sameStats(st, before) {
		t.Errorf("stats %+v, were %+v", st, before)
	}
	if got := readVA(t, node, s, a, Page2M); !bytes.Equal(got, data) {
		t.Error("resident chunk changed by a failed fault")
	}
	// Device full and nothing else to evict: the other chunk is in the range.
	_, err = s.TranslateAll([]Range{{VA: a, Len: 1}, {VA: b, Len: 1}})
	wantErr(t, "device full", err, vocab.ErrOutOfMemory, "device 0", "fewer free", "may be evicted")

	// The same with a quota: over it is quota exceeded, not out of memory.
	q := NewSpace(newFakeNode(1).lease(0), 2*Page2M)
	q.Oversubscribe(newStore(t, 0, false), 0)
	mustAlloc(t, q, 0, 2*Page2M)
	_, err = q.Alloc(0, 1)
	wantErr(t, "over the quota", err, vocab.ErrQuotaExceeded)
}

// TestTranslateAllKeepsOperands: translating a command's operands together
// never evicts one for another, where one by one it would.
func TestTranslateAllKeepsOperands(t *testing.T) {
	node := newFakeNode(2)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(newStore(t, 8, false), 0)
	src := mustAlloc(t, s, 0, Page2M)
	dst := mustAlloc(t, s, 0, Page2M)
	other := mustAlloc(t, s, 0, Page2M) // evicted: the device holds two
	mustTranslate(t, s, dst, 1)         // src is now the coldest
	if s.Resident(Range{VA: other, Len: 1}) || !s.Resident(Range{VA: src, Len: 1}, Range{VA: dst, Len: 1}) {
		t.Fatal("Resident disagrees with the placement")
	}
	ts, err := s.TranslateAll([]Range{{VA: src, Len: Page2M}, {VA: other, Len: Page2M}})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Resident(Range{VA: src, Len: 1}, Range{VA: other, Len: 1}) || s.Resident(Range{VA: dst, Len: 1}) {
		t.Fatal("TranslateAll evicted an operand, or kept the unrelated chunk")
	}
	if ts[0].Extents[0].Addr == ts[1].Extents[0].Addr {
		t.Fatalf("two operands share a frame: %v", ts)
	}
	_, err = s.TranslateAll([]Range{{VA: src, Len: 1}, {VA: dst, Len: 1}, {VA: other, Len: 1}})
	wantErr(t, "three operands, two frames", err, vocab.ErrOutOfMemory)
	_, err = s.TranslateAll([]Range{{VA: src, Len: 1}, {VA: 0, Len: 1}})
	wantErr(t, "an invalid operand", err, vocab.ErrInvalidAddress)
}

// TestFaultAcrossDevices: under a cap, a fault on one device may evict a
// chunk of another, whose frame goes back to its node.
func TestFaultAcrossDevices(t *testing.T) {
	node := newFakeNode(4)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(newStore(t, 8, false), FrameSize)
	a := mustAlloc(t, s, 0, Page2M)
	b := mustAlloc(t, s, 1, Page2M)
	writeVA(t, node, s, a, pattern(1, Page2M))
	writeVA(t, node, s, b, pattern(2, Page2M))
	if got := readVA(t, node, s, a, Page2M); !bytes.Equal(got, pattern(1, Page2M)) {
		t.Fatal("device 0 chunk lost its data")
	}
	held := node.held(0)
	if len(held) != 1 || !held[devFrame{0, mustTranslate(t, s, a, 1)[0].Addr &^ (FrameSize - 1)}] {
		t.Fatalf("space holds %v; want only device 0's frame", held)
	}
}

// cappedLease is a lease whose lessee may hold at most max frames in all,
// as a container's sessions hold at most its grant: a grant past it fails
// as a full device's does.
type cappedLease struct {
	lease
	max int
}

func (c cappedLease) Grant(dev uint32, n int) ([]uint64, error) {
	if held := len(c.n.held(c.id)); held+n > c.max {
		return nil, fmt.Errorf("%d frames held, %d more wanted, at most %d: %w", held, n, c.max, vocab.ErrOutOfMemory)
	}
	return c.lease.Grant(dev, n)
}

// TestFaultReturnsVictimsBeforeGrant: a victim of the cap whose frame no
// fault-in reuses (here, on another device) goes back to the source before
// the fault-in asks for frames, so a source that counts what the space
// holds grants them.
func TestFaultReturnsVictimsBeforeGrant(t *testing.T) {
	node := newFakeNode(4)
	s := NewSpace(cappedLease{node.lease(0), 1}, 0)
	s.Oversubscribe(newStore(t, 8, false), FrameSize)
	a := mustAlloc(t, s, 0, Page2M)
	b := mustAlloc(t, s, 1, Page2M) // evicted: the cap is one frame
	writeVA(t, node, s, a, pattern(1, Page2M))
	writeVA(t, node, s, b, pattern(2, Page2M))
	for i, va := range []uint64{a, b} {
		if got := readVA(t, node, s, va, Page2M); !bytes.Equal(got, pattern(uint64(i+1), Page2M)) {
			t.Fatalf("chunk on device %d lost its data", i)
		}
	}
	if st := s.Stats(); st.Frames != 1 || st.Evictions != 3 || len(node.violations) != 0 {
		t.Errorf("after faulting in on each device in turn: %+v, %v", st, node.violations)
	}
}

// TestSealedFramesAreNotReused: a fault-in never refills a frame the source
// sealed (it would refuse), whether the cap or a full device makes it evict
// the sealed chunk: it returns the frame and takes a fresh one.
func TestSealedFramesAreNotReused(t *testing.T) {
	for _, tc := range []struct {
		name     string
		frames   int    // of the device
		resident uint64 // the cap
	}{
		{"under the cap", 4, FrameSize},
		{"device full", 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := newFakeNode(tc.frames)
			s := NewSpace(node.lease(0), 0)
			s.Oversubscribe(newStore(t, 8, false), tc.resident)
			w := mustAllocHint(t, s, 0, Page2M, vocab.HintWeight)
			writeVA(t, node, s, w, pattern(1, Page2M))
			seal := []Range{{VA: w, Len: Page2M, SealFrames: true}}
			_, err := s.TranslateAll(seal)
			wantErr(t, "seal frames of an unsealed allocation", err, vocab.ErrInvalidArgument, "not sealed")
			if err := s.Seal(w); err != nil {
				t.Fatal(err)
			}
			_, err = s.TranslateAll([]Range{{VA: w, Len: Page4K, SealFrames: true}})
			wantErr(t, "seal frames of part of a chunk", err, vocab.ErrInvalidArgument, "not whole chunks")
			ts, err := s.TranslateAll(seal)
			if err != nil {
				t.Fatal(err)
			}
			node.lease(0).seal(ts[0].Dev, ts[0].Extents)
			sealed := devFrame{0, ts[0].Extents[0].Addr}

			b := mustAlloc(t, s, 0, Page2M) // evicted: no room
			writeVA(t, node, s, b, pattern(2, Page2M))
			if got := readVA(t, node, s, w, Page2M); !bytes.Equal(got, pattern(1, Page2M)) {
				t.Fatal("the sealed chunk lost its data")
			}
			if got := readVA(t, node, s, b, Page2M); !bytes.Equal(got, pattern(2, Page2M)) {
				t.Fatal("the other chunk lost its data")
			}
			if len(node.violations) != 0 {
				t.Fatal(node.violations)
			}
			if st := s.Stats(); st.Evictions != 3 || !slices.Contains(node.returns[0], sealed) {
				t.Errorf("sealed frame %#x not returned (returns %v): %+v", sealed.frame, node.returns[0], st)
			}
		})
	}
}

// TestFaultGrantsOneByOne: a fault-in that needs more frames than the node
// can grant in one run takes what it can, then evicts for the rest.
func TestFaultGrantsOneByOne(t *testing.T) {
	node := newFakeNode(4)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(newStore(t, 8, false), 0)
	va := mustAlloc(t, s, 0, 3*Page2M) // frames 0-2
	for i := range uint64(3) {
		writeVA(t, node, s, va+i*Page2M, pattern(i, Page2M))
	}
	other := NewSpace(node.lease(1), 0)
	mustAlloc(t, other, 0, Page2M) // frame 3
	for _, off := range []uint64{0, Page2M} {
		if ok, err := s.evict(va + off); !ok || err != nil {
			t.Fatalf("evict: %v, %v", ok, err)
		}
	}
	mustAlloc(t, other, 0, Page2M) // one of the two frames just returned
	// A grant of 2 fails, one of 1 succeeds, and the third chunk is evicted
	// for the other frame.
	for i := range uint64(2) {
		if got := readVA(t, node, s, va+i*Page2M, Page2M); i == 0 && !bytes.Equal(got, pattern(i, Page2M)) {
			t.Fatalf("chunk %d lost its data", i)
		}
	}
	mustTranslate(t, s, va, 2*Page2M)
	if st := s.Stats(); st.Frames != 2 || st.Evicted != Page2M || st.Faults != 2 || st.Evictions != 3 {
		t.Errorf("after the fault: %+v", st)
	}
	for i := range uint64(3) {
		if got := readVA(t, node, s, va+i*Page2M, Page2M); !bytes.Equal(got, pattern(i, Page2M)) {
			t.Fatalf("chunk %d lost its data", i)
		}
	}
	if len(node.violations) != 0 {
		t.Error(node.violations)
	}
}

// TestFaultIOFailure: a node that fails mid fault-in loses no data; the
// next try succeeds.
func TestFaultIOFailure(t *testing.T) {
	for _, op := range []string{"read", "write"} {
		t.Run(op, func(t *testing.T) {
			node := newFakeNode(1)
			store := newStore(t, 4, false)
			s := NewSpace(node.lease(0), 0)
			s.Oversubscribe(store, 0)
			a := mustAlloc(t, s, 0, Page2M)
			b := mustAlloc(t, s, 0, Page2M)
			writeVA(t, node, s, a, pattern(1, Page2M))
			writeVA(t, node, s, b, pattern(2, Page2M)) // a evicted
			before := s.Stats()
			if op == "write" {
				// Read of b succeeds, the write of a's contents fails.
				s.src = failOnWrite{node.lease(0)}
			} else {
				node.failIO = fmt.Errorf("link down: %w", vocab.ErrUnavailable)
			}
			_, _, err := s.Translate(a, 1)
			wantErr(t, "fault with failing "+op, err, vocab.ErrUnavailable, "link down")
			s.src = node.lease(0)
			if op == "read" {
				// Nothing committed: as it was.
				if st := s.Stats(); !sameStats(st, before) {
					t.Errorf("stats %+v, were %+v", st, before)
				}
			} else if st := s.Stats(); st.Frames != 0 || st.Evicted != 2*Page2M || len(node.held(0)) != 0 {
				// Both evicted, the frame returned.
				t.Errorf("after a failed write: %+v, %d frames held", st, len(node.held(0)))
			}
			for _, x := range []struct {
				va   uint64
				seed uint64
			}{{a, 1}, {b, 2}, {a, 1}} {
				if got := readVA(t, node, s, x.va, Page2M); !bytes.Equal(got, pattern(x.seed, Page2M)) {
					t.Fatalf("%#x lost its data", x.va)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if st := store.Stats(); st.RAM != 0 || len(node.violations) != 0 {
				t.Errorf("after close: %+v, %v", st, node.violations)
			}
		})
	}
}

type failOnWrite struct{ lease }

func (f failOnWrite) Write(uint32, uint64, []byte) error {
	return fmt.Errorf("link down: %w", vocab.ErrUnavailable)
}

// TestFreeAndCloseDropEntries: freeing an evicted chunk's last page and
// closing the space drop its store entries, exactly once.
func TestFreeAndCloseDropEntries(t *testing.T) {
	hs := newStore(t, 8, false)
	store := newCheckedStore(hs, false)
	node := newFakeNode(8)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(store, 0)
	a := mustAlloc(t, s, 0, 2*Page2M)
	b := mustAlloc(t, s, 0, Page4K)
	c := mustAlloc(t, s, 0, Page4K) // shares b's chunk
	for _, va := range []uint64{a, a + Page2M, b} {
		if ok, err := s.evict(va); !ok || err != nil {
			t.Fatalf("evict %#x: %v, %v", va, ok, err)
		}
	}
	if store.count() != 3 || s.Stats().Frames != 0 {
		t.Fatalf("%d entries, %+v", store.count(), s.Stats())
	}
	if err := s.Free(a); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(b); err != nil { // c keeps the chunk
		t.Fatal(err)
	}
	if store.count() != 1 {
		t.Fatalf("%d entries after freeing, want c's chunk only", store.count())
	}
	if ok, err := s.evict(c); ok || err != nil {
		t.Fatalf("evict of an evicted chunk: %v, %v", ok, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if store.count() != 0 || len(store.problems()) != 0 || hs.Stats().RAM != 0 {
		t.Errorf("after close: %d entries, %v, %+v", store.count(), store.problems(), hs.Stats())
	}
	if _, err := s.evict(0); !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Errorf("evict after close: %v", err)
	}
}

func TestOversubscribeMisuse(t *testing.T) {
	s := NewSpace(newFakeNode(1).lease(0), 0)
	if _, err := s.evict(0); !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Errorf("evict without oversubscription: %v", err)
	}
	if !s.Resident(Range{VA: vaBase, Len: 1}) {
		t.Error("a space that does not oversubscribe is always resident")
	}
	mustPanic(t, "nil store", func() { s.Oversubscribe(nil, 0) })
	mustAlloc(t, s, 0, 1)
	mustPanic(t, "in use", func() { s.Oversubscribe(newStore(t, 1, false), 0) })
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", what)
		}
	}()
	f()
}

// TestOversubscribeConcurrent runs allocations, frees and stats from many
// goroutines on one oversubscribed space, with translate-and-access
// serialised as the mediator does, and checks every byte.
func TestOversubscribeConcurrent(t *testing.T) {
	node := newFakeNode(6)
	hs := newStore(t, 4, true)
	s := NewSpace(node.lease(0), 0)
	s.Oversubscribe(hs, 4*FrameSize)
	var issue sync.Mutex // translate and access, as one session's pipeline
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			sizes := []uint64{Page4K, 100 << 10, Page2M, 3 << 20}
			for i := range 20 {
				size := sizes[(g+i)%len(sizes)]
				va, err := s.Alloc(uint32(g%2), size)
				if err != nil {
					t.Error(err)
					return
				}
				data := pattern(uint64(g*100+i), int(size))
				issue.Lock()
				writeVA(t, node, s, va, data)
				issue.Unlock()
				s.Stats()
				issue.Lock()
				got := readVA(t, node, s, va, size)
				issue.Unlock()
				if !bytes.Equal(got, data) {
					t.Errorf("goroutine %d: allocation %#x lost its data", g, va)
				}
				if err := s.Free(va); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Allocations != 0 || st.Frames != 0 || st.Evicted != 0 || len(node.held(0)) != 0 {
		t.Errorf("after balanced allocs and frees: %+v", st)
	}
	if st := hs.Stats(); st.RAM != 0 || st.Spilled != 0 {
		t.Errorf("store keeps %+v", st)
	}
}

// sameStats compares stats but for the TLB counters.
func sameStats(a, b Stats) bool {
	a.TLBHits, a.TLBMisses, b.TLBHits, b.TLBMisses = 0, 0, 0, 0
	return a == b
}

// refillingLease is a lease of a node that keeps the bytes of the sealed
// frames returned to it (fakeNode.kept) and refills frames from them, as a
// node that retains sealed frames does.
type refillingLease struct {
	lease
	asked    int   // frames asked to refill
	requests int   // refill requests answered
	fail     error // when set, refills fail with it
}

func (l *refillingLease) Return(dev uint32, frames []uint64) error {
	l.n.mu.Lock()
	for _, f := range frames {
		if k := (devFrame{dev, f}); l.n.sealed[k] && l.n.owner[k] == l.id {
			b := make([]byte, FrameSize)
			copy(b, l.n.data[k])
			l.n.kept[sha256.Sum256(b)] = b
		}
	}
	l.n.mu.Unlock()
	return l.lease.Return(dev, frames)
}

func (l *refillingLease) Refill(dev uint32, frames []uint64, sums [][32]byte) ([]bool, error) {
	n := l.n
	n.mu.Lock()
	defer n.mu.Unlock()
	hit := make([]bool, len(frames))
	for i, f := range frames {
		if err := l.access("refill", dev, f, nil); err != nil {
			return nil, err
		}
		l.asked++
		if l.fail != nil {
			return nil, l.fail
		}
		if b, ok := n.kept[sums[i]]; ok {
			n.data[devFrame{dev, f}] = slices.Clone(b)
			hit[i] = true
		}
	}
	l.requests++
	return hit, nil
}

// Interface check: a refillingLease is what a space asks to refill.
var _ Refiller = (*refillingLease)(nil)

// TestSealedChunksRefillFromTheSource: a chunk sealed at the source and
// evicted comes back from the source's own copy, no bytes written; where
// the source no longer has it, or never sealed it, it is written as
// before; every read sees the chunk's bytes.
func TestSealedChunksRefillFromTheSource(t *testing.T) {
	node := newFakeNode(4)
	src := &refillingLease{lease: node.lease(0)}
	s := NewSpace(src, 0)
	s.Oversubscribe(newStore(t, 8, false), FrameSize) // one chunk resident
	w := mustAllocHint(t, s, 0, Page2M, vocab.HintWeight)
	writeVA(t, node, s, w, pattern(1, Page2M))
	if err := s.Seal(w); err != nil {
		t.Fatal(err)
	}
	ts, err := s.TranslateAll([]Range{{VA: w, Len: Page2M, SealFrames: true}})
	if err != nil {
		t.Fatal(err)
	}
	src.seal(ts[0].Dev, ts[0].Extents)
	plain := mustAllocHint(t, s, 0, Page2M, vocab.HintWeight) // sealed here, not at the source
	writeVA(t, node, s, plain, pattern(2, Page2M))
	if err := s.Seal(plain); err != nil {
		t.Fatal(err)
	}
	// check reads chunk va back and wants the totals of refills, refills
	// asked for, and frames written by its fault-in.
	check := func(va uint64, seed uint64, refills, asked, writes int) {
		t.Helper()
		before := node.writes
		if got := readVA(t, node, s, va, Page2M); !bytes.Equal(got, pattern(seed, Page2M)) {
			t.Fatalf("chunk %#x lost its bytes", va)
		}
		if st := s.Stats(); st.Refills != uint64(refills) || src.asked != asked || node.writes-before != writes {
			t.Fatalf("chunk %#x: %d refills of %d asked, %d frames written: want %d of %d, %d", va, st.Refills, src.asked, node.writes-before, refills, asked, writes)
		}
	}
	check(w, 1, 1, 1, 0)     // plain evicted, w back from the source's copy
	check(plain, 2, 1, 1, 1) // never sealed at the source: written, not asked
	src.fail = fmt.Errorf("node lost its index: %w", vocab.ErrInternal)
	check(w, 1, 1, 2, 1) // asked, failed, written
	src.fail = nil
	check(plain, 2, 1, 2, 1)
	clear(node.kept)
	check(w, 1, 1, 3, 1) // asked, missed, written
	check(plain, 2, 1, 3, 1)
	check(w, 1, 1, 3, 1) // after a miss, not asked again
	if len(node.violations) != 0 {
		t.Fatal(node.violations)
	}
}

// TestRefillModel: weights of a chunk each, sealed at the source, in the
// space alone, or not at all, written and read at random through a small
// resident cap, with a node that now and then forgets the frames it kept:
// every read sees the bytes last written, and no frame is touched that the
// space does not hold.
func TestRefillModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		node := newFakeNode(8)
		src := &refillingLease{lease: node.lease(0)}
		s := NewSpace(src, 0)
		s.Oversubscribe(newStore(t, 32, false), uint64(rapid.IntRange(1, 3).Draw(rt, "resident"))*FrameSize)
		type buf struct {
			va, seed uint64
			sealed   bool
		}
		var bufs []*buf
		seed := uint64(0)
		pick := func() *buf { return bufs[rapid.IntRange(0, len(bufs)-1).Draw(rt, "buffer")] }
		for range rapid.IntRange(1, 40).Draw(rt, "steps") {
			switch op := rapid.IntRange(0, 4).Draw(rt, "op"); {
			case op == 0 || len(bufs) == 0:
				if len(bufs) == 6 {
					continue
				}
				seed++
				b := &buf{va: mustAllocHint(t, s, 0, Page2M, vocab.HintWeight), seed: seed}
				writeVA(t, node, s, b.va, pattern(b.seed, Page2M))
				if how := rapid.IntRange(0, 2).Draw(rt, "seal"); how > 0 {
					b.sealed = true
					if err := s.Seal(b.va); err != nil {
						rt.Fatal(err)
					}
					if how == 2 { // and at the source, as a weight on its node
						ts, err := s.TranslateAll([]Range{{VA: b.va, Len: Page2M, SealFrames: true}})
						if err != nil {
							rt.Fatal(err)
						}
						src.seal(ts[0].Dev, ts[0].Extents)
					}
				}
				bufs = append(bufs, b)
			case op == 1:
				if b := pick(); !b.sealed {
					seed++
					b.seed = seed
					writeVA(t, node, s, b.va, pattern(b.seed, Page2M))
				}
			case op == 2:
				node.mu.Lock()
				clear(node.kept) // the node reclaimed what it retained
				node.mu.Unlock()
			default:
				b := pick()
				if got := readVA(t, node, s, b.va, Page2M); !bytes.Equal(got, pattern(b.seed, Page2M)) {
					rt.Fatalf("buffer %#x does not read its bytes (seed %d)", b.va, b.seed)
				}
			}
			if len(node.violations) != 0 {
				rt.Fatal(node.violations)
			}
		}
		if st := s.Stats(); st.Refills > uint64(src.asked) || st.Refills > st.Faults {
			rt.Fatalf("%d refills, %d asked, %d faults", st.Refills, src.asked, st.Faults)
		}
		s.Close()
	})
}

// TestRefillsOneRequestPerFault: a fault-in of a weight of several chunks,
// all sealed at the source, asks the source once for all of them.
func TestRefillsOneRequestPerFault(t *testing.T) {
	node := newFakeNode(8)
	src := &refillingLease{lease: node.lease(0)}
	s := NewSpace(src, 0)
	s.Oversubscribe(newStore(t, 16, false), 3*FrameSize)
	w := mustAllocHint(t, s, 0, 3*Page2M, vocab.HintWeight)
	writeVA(t, node, s, w, pattern(1, 3*Page2M))
	if err := s.Seal(w); err != nil {
		t.Fatal(err)
	}
	ts, err := s.TranslateAll([]Range{{VA: w, Len: 3 * Page2M, SealFrames: true}})
	if err != nil {
		t.Fatal(err)
	}
	src.seal(ts[0].Dev, ts[0].Extents)
	other := mustAlloc(t, s, 0, 3*Page2M)
	writeVA(t, node, s, other, pattern(2, 3*Page2M)) // evicts the weight
	writes := node.writes
	if got := readVA(t, node, s, w, 3*Page2M); !bytes.Equal(got, pattern(1, 3*Page2M)) {
		t.Fatal("the weight lost its bytes")
	}
	if st := s.Stats(); st.Refills != 3 || src.asked != 3 || src.requests != 1 || node.writes != writes {
		t.Fatalf("%d refills, %d frames asked in %d requests, %d frames written: want 3, 3, 1, 0",
			st.Refills, src.asked, src.requests, node.writes-writes)
	}
}
