package memory

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

func mustAlloc(t *testing.T, s *Space, dev uint32, size uint64) uint64 {
	t.Helper()
	va, err := s.Alloc(dev, size)
	if err != nil {
		t.Fatalf("alloc %d on device %d: %v", size, dev, err)
	}
	return va
}

func mustTranslate(t *testing.T, s *Space, va, n uint64) []vocab.Extent {
	t.Helper()
	_, xs, err := s.Translate(va, n)
	if err != nil {
		t.Fatalf("translate %#x+%d: %v", va, n, err)
	}
	return xs
}

// wantErr checks that err wraps sentinel and names every value in names.
func wantErr(t *testing.T, what string, err, sentinel error, names ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("%s: %v, want %v", what, err, sentinel)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("%s: message %q does not name %s", what, err, n)
		}
	}
}

func TestAllocAlignmentAndRounding(t *testing.T) {
	tests := []struct {
		size, rounded, align uint64
	}{
		{1, Page4K, Page4K},
		{Page4K, Page4K, Page4K},
		{Page4K + 1, 2 * Page4K, Page4K},
		{Page64K - 1, Page64K, Page64K},
		{Page64K, Page64K, Page64K},
		{100 << 10, 100 << 10, Page64K},
		{Page2M - 1, Page2M, Page2M},
		{Page2M, Page2M, Page2M},
		{Page2M + 1, Page2M + Page4K, Page2M},
		{5 << 20, 5 << 20, Page2M},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.size), func(t *testing.T) {
			s := NewSpace(newFakeNode(8).lease(0), 0)
			// A small allocation first, so alignment is not a mere accident of
			// an empty space.
			mustAlloc(t, s, 0, 1)
			va := mustAlloc(t, s, 0, tt.size)
			if va%tt.align != 0 {
				t.Errorf("address %#x is not %#x-aligned", va, tt.align)
			}
			if got := s.Stats().Allocated; got != Page4K+tt.rounded {
				t.Errorf("allocated %d, want %d", got, Page4K+tt.rounded)
			}
			dev, end, err := s.Span(va + tt.size - 1)
			if err != nil || dev != 0 || end != va+tt.size {
				t.Errorf("span: device %d, end %#x, %v; want end %#x", dev, end, err, va+tt.size)
			}
			if _, _, err := s.Span(va + tt.size); tt.size != tt.rounded && !errors.Is(err, vocab.ErrInvalidAddress) {
				t.Errorf("span of the rounded tail: %v, want ErrInvalidAddress", err)
			}
			xs := mustTranslate(t, s, va, tt.size)
			if xs[0].Addr%tt.align != 0 {
				t.Errorf("physical start %#x is not %#x-aligned like the virtual one", xs[0].Addr, tt.align)
			}
		})
	}
}

func TestAllocBadSize(t *testing.T) {
	s := NewSpace(newFakeNode(8).lease(0), 0)
	for _, size := range []uint64{0, maxAlloc + 1, math.MaxUint64} {
		_, err := s.Alloc(0, size)
		wantErr(t, fmt.Sprintf("alloc %d", size), err, vocab.ErrInvalidArgument, fmt.Sprint(size))
	}
	if st := s.Stats(); st != (Stats{}) {
		t.Errorf("stats after failed allocs: %+v", st)
	}
}

func TestFreeErrors(t *testing.T) {
	s := NewSpace(newFakeNode(8).lease(0), 0)
	small := mustAlloc(t, s, 0, 3*Page4K)
	freed := mustAlloc(t, s, 0, Page4K)
	if err := s.Free(freed); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		va   uint64
	}{
		{"double free", freed},
		{"interior page", small + Page4K},
		{"interior byte", small + 1},
		{"null", 0},
		{"never allocated", vaBase + 1<<40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, "free", s.Free(tt.va), vocab.ErrInvalidAddress, fmt.Sprintf("%#x", tt.va))
		})
	}
	if st := s.Stats(); st.Allocations != 1 || st.Allocated != 3*Page4K {
		t.Errorf("failed frees changed the stats: %+v", st)
	}
}

func TestTranslateErrors(t *testing.T) {
	s := NewSpace(newFakeNode(8).lease(0), 0)
	a := mustAlloc(t, s, 0, Page4K)
	b := mustAlloc(t, s, 0, Page4K)
	if b != a+Page4K {
		t.Fatalf("two pages at %#x and %#x are not adjacent; the test needs them so", a, b)
	}
	gone := mustAlloc(t, s, 0, Page4K)
	if err := s.Free(gone); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		va, n uint64
		names []string
	}{
		{"empty", a, 0, []string{fmt.Sprintf("%#x", a), "empty"}},
		{"past the end", a + 10, Page4K - 9, []string{fmt.Sprintf("%#x", a+10), fmt.Sprint(Page4K - 9), "past"}},
		{"across two allocations", a, 2 * Page4K, []string{fmt.Sprintf("%#x", a), "past"}},
		{"wrapping length", a, math.MaxUint64, []string{"past"}},
		{"after free", gone, 1, []string{fmt.Sprintf("%#x", gone), "no live allocation"}},
		{"null", 0, 1, []string{"0x0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.Translate(tt.va, tt.n)
			wantErr(t, "translate", err, vocab.ErrInvalidAddress, tt.names...)
		})
	}
	_, _, err := s.Span(gone)
	wantErr(t, "span after free", err, vocab.ErrInvalidAddress, fmt.Sprintf("%#x", gone))
}

func TestTranslateExtents(t *testing.T) {
	for _, scatter := range []bool{false, true} {
		t.Run(fmt.Sprintf("scatter=%v", scatter), func(t *testing.T) {
			node := newFakeNode(8)
			node.scatter = scatter
			s := NewSpace(node.lease(0), 0)
			va := mustAlloc(t, s, 3, 3<<20)
			dev, xs, err := s.Translate(va, 3<<20)
			if err != nil || dev != 3 {
				t.Fatalf("translate: device %d, %v", dev, err)
			}
			want := 1
			if scatter {
				want = 2
			}
			if len(xs) != want || vocab.ExtentsLen(xs) != 3<<20 {
				t.Fatalf("extents %v: want %d runs of 3 MiB in all", xs, want)
			}
			// A window straddling the frame boundary.
			sub := mustTranslate(t, s, va+Page2M-8, 16)
			if want := sliceExtents(xs, Page2M-8, 16); !slices.Equal(sub, want) {
				t.Errorf("window: %v, want %v", sub, want)
			}
		})
	}
}

func TestQuotaExact(t *testing.T) {
	const limit = 1 << 20
	s := NewSpace(newFakeNode(8).lease(0), limit)
	first := mustAlloc(t, s, 0, limit-Page4K-100) // rounds to limit-Page4K
	last := mustAlloc(t, s, 0, Page4K)            // ends exactly at the limit
	_, err := s.Alloc(0, 1)
	wantErr(t, "one byte over", err, vocab.ErrQuotaExceeded, "1 bytes", fmt.Sprint(limit), fmt.Sprint(limit))
	if err := s.Free(last); err != nil {
		t.Fatal(err)
	}
	_, err = s.Alloc(0, Page4K+1)
	wantErr(t, "over after rounding", err, vocab.ErrQuotaExceeded, fmt.Sprint(Page4K+1), fmt.Sprint(limit-Page4K))
	mustAlloc(t, s, 0, Page4K)
	if st := s.Stats(); st.Allocated != limit {
		t.Errorf("allocated %d, want %d", st.Allocated, limit)
	}
	if err := s.Free(first); err != nil {
		t.Fatal(err)
	}
	mustAlloc(t, s, 1, limit-Page4K)
}

func TestCloseReturnsAllFrames(t *testing.T) {
	node := newFakeNode(16)
	s := NewSpace(node.lease(7), 0)
	for _, a := range []struct {
		dev  uint32
		size uint64
	}{{0, Page4K}, {0, 5 << 20}, {1, Page64K}, {1, Page2M}, {2, 1}} {
		mustAlloc(t, s, a.dev, a.size)
	}
	held := node.held(7)
	if len(held) != s.Stats().Frames {
		t.Fatalf("node holds %d frames for the space, stats say %d", len(held), s.Stats().Frames)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(node.held(7)) != 0 || len(node.violations) != 0 {
		t.Fatalf("after close: %d frames still held, violations %v", len(node.held(7)), node.violations)
	}
	if got := len(node.returns[7]); got != len(held) {
		t.Errorf("%d frames returned, %d were held", got, len(held))
	}
	if st := s.Stats(); st.Frames != 0 || st.Allocations != 0 || st.Allocated != 0 {
		t.Errorf("stats after close: %+v", st)
	}
	_, err := s.Alloc(0, 1)
	wantErr(t, "alloc after close", err, vocab.ErrInvalidArgument, "closed")
	wantErr(t, "free after close", s.Free(vaBase), vocab.ErrInvalidArgument, "closed")
	_, _, err = s.Translate(vaBase, 1)
	wantErr(t, "translate after close", err, vocab.ErrInvalidArgument, "closed")
	_, _, err = s.Span(vaBase)
	wantErr(t, "span after close", err, vocab.ErrInvalidArgument, "closed")
	wantErr(t, "second close", s.Close(), vocab.ErrInvalidArgument, "closed")
}

func TestGrantFailureRollsBack(t *testing.T) {
	node := newFakeNode(3)
	s := NewSpace(node.lease(0), 0)
	keep := mustAlloc(t, s, 0, Page2M+Page4K) // two frames, the second mostly free
	before := s.Stats()

	_, err := s.Alloc(0, 2*Page2M)
	wantErr(t, "device full", err, vocab.ErrOutOfMemory, fmt.Sprint(2*Page2M))

	node.failGrant = fmt.Errorf("node gone: %w", vocab.ErrUnavailable)
	_, err = s.Alloc(1, Page4K)
	wantErr(t, "grant fails", err, vocab.ErrUnavailable, "node gone")

	if st := s.Stats(); st != before {
		t.Errorf("stats after failed allocs: %+v, was %+v", st, before)
	}
	if len(node.held(0)) != 2 {
		t.Errorf("space holds %d frames, want 2", len(node.held(0)))
	}
	// The failed allocations left no reserved addresses behind: the next
	// large one takes the chunk right after the first allocation.
	va := mustAlloc(t, s, 0, Page2M)
	if va != keep+2*Page2M {
		t.Errorf("next allocation at %#x, want %#x", va, keep+2*Page2M)
	}
	// Small allocations still fit in the tail of the second frame, 64 KiB
	// aligned after its first page.
	mustAlloc(t, s, 0, Page2M-2*Page64K)
	if st := s.Stats(); st.Frames != 3 {
		t.Errorf("%d frames, want 3", st.Frames)
	}
}

// badSource grants what it is told to, right or wrong.
type badSource struct {
	grant    []uint64
	returned []uint64
}

func (b *badSource) Grant(uint32, int) ([]uint64, error) { return b.grant, nil }
func (b *badSource) Read(uint32, uint64, []byte) error   { return nil }
func (b *badSource) Write(uint32, uint64, []byte) error  { return nil }
func (b *badSource) Zero(uint32, uint64) error           { return nil }
func (b *badSource) Return(_ uint32, frames []uint64) error {
	b.returned = append(b.returned, frames...)
	return nil
}

func TestBadGrantRefused(t *testing.T) {
	tests := []struct {
		name         string
		grant        []uint64
		wantReturned []uint64
	}{
		{"too few", []uint64{0}, []uint64{0}},
		{"too many", []uint64{0, FrameSize, 2 * FrameSize}, []uint64{0, FrameSize, 2 * FrameSize}},
		{"misaligned", []uint64{0, FrameSize + Page4K}, []uint64{0}},
		{"repeated", []uint64{FrameSize, FrameSize}, []uint64{FrameSize}},
		{"already held", []uint64{8 * FrameSize, 9 * FrameSize}, []uint64{9 * FrameSize}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &badSource{grant: []uint64{8 * FrameSize}}
			s := NewSpace(src, 0)
			mustAlloc(t, s, 0, Page2M)
			before := s.Stats()
			src.grant = tt.grant
			_, err := s.Alloc(0, 2*Page2M)
			wantErr(t, "alloc", err, vocab.ErrInternal, "grant 2 frames")
			if !slices.Equal(src.returned, tt.wantReturned) {
				t.Errorf("returned %#x, want %#x", src.returned, tt.wantReturned)
			}
			if st := s.Stats(); st != before {
				t.Errorf("stats %+v, was %+v", st, before)
			}
		})
	}
}

func TestReturnFailureKeepsAccounting(t *testing.T) {
	node := newFakeNode(4)
	s := NewSpace(node.lease(0), 0)
	va := mustAlloc(t, s, 0, 4<<20)
	node.failReturn = fmt.Errorf("connection reset: %w", vocab.ErrUnavailable)
	err := s.Free(va)
	wantErr(t, "free", err, vocab.ErrUnavailable, fmt.Sprintf("%#x", va), "2 frames")
	if st := s.Stats(); st.Allocations != 0 || st.Allocated != 0 || st.Frames != 0 {
		t.Errorf("stats after free with a failed return: %+v", st)
	}
	wantErr(t, "second free", s.Free(va), vocab.ErrInvalidAddress)
	mustAlloc(t, s, 0, Page4K)
	wantErr(t, "close", s.Close(), vocab.ErrUnavailable, "1 frames")
	if len(node.violations) != 0 {
		t.Errorf("violations: %v", node.violations)
	}
}

func TestFramesReturnedWhenUnused(t *testing.T) {
	node := newFakeNode(4)
	s := NewSpace(node.lease(0), 0)
	a := mustAlloc(t, s, 0, Page4K)
	b := mustAlloc(t, s, 0, Page64K)
	if s.Stats().Frames != 1 {
		t.Fatalf("two small allocations hold %d frames, want 1", s.Stats().Frames)
	}
	if err := s.Free(a); err != nil {
		t.Fatal(err)
	}
	if s.Stats().Frames != 1 {
		t.Fatalf("frame returned while still in use")
	}
	if err := s.Free(b); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Frames != 0 || st.Mapped != 0 || len(node.held(0)) != 0 {
		t.Errorf("unused frame kept: %+v", st)
	}
}

func TestDevicesDoNotShareFrames(t *testing.T) {
	node := newFakeNode(4)
	s := NewSpace(node.lease(0), 0)
	a := mustAlloc(t, s, 0, Page4K)
	b := mustAlloc(t, s, 1, Page4K)
	if a>>shift2M == b>>shift2M {
		t.Errorf("allocations of devices 0 and 1 share the chunk at %#x", a&^(Page2M-1))
	}
	for va, want := range map[uint64]uint32{a: 0, b: 1} {
		if dev, _, err := s.Translate(va, 1); err != nil || dev != want {
			t.Errorf("translate %#x: device %d, %v; want %d", va, dev, err, want)
		}
	}
	if s.Stats().Frames != 2 {
		t.Errorf("%d frames, want one per device", s.Stats().Frames)
	}
}

// TestCoalesceAndSplinter fills a frame with small allocations, which must
// coalesce into one 2 MiB leaf, then frees one, which must splinter it with
// every other translation unchanged.
func TestCoalesceAndSplinter(t *testing.T) {
	s := NewSpace(newFakeNode(4).lease(0), 0)
	var vas []uint64
	for range 16 {
		vas = append(vas, mustAlloc(t, s, 0, Page4K))
	}
	if st := s.Stats(); st.Mapped64K != Page64K || st.Mapped4K != 0 {
		t.Fatalf("16 pages: %+v, want one 64 KiB leaf", st)
	}
	for range 31 {
		vas = append(vas, mustAlloc(t, s, 0, Page64K))
	}
	if st := s.Stats(); st.Mapped2M != Page2M || st.Mapped64K != 0 || st.Frames != 1 {
		t.Fatalf("full frame: %+v, want one 2 MiB leaf", st)
	}
	pa := func(va uint64) uint64 { return mustTranslate(t, s, va, Page4K)[0].Addr }
	base := pa(vas[0])
	for _, va := range vas {
		if pa(va) != base+(va-vas[0]) {
			t.Fatalf("%#x is at %#x, not at its offset in the frame at %#x", va, pa(va), base)
		}
	}

	if err := s.Free(vas[3]); err != nil { // one 4 KiB page
		t.Fatal(err)
	}
	if st := s.Stats(); st.Mapped2M != 0 || st.Mapped64K != Page2M-Page64K || st.Mapped4K != Page64K-Page4K {
		t.Fatalf("after freeing a page: %+v", st)
	}
	for _, va := range slices.Delete(slices.Clone(vas), 3, 4) {
		if pa(va) != base+(va-vas[0]) {
			t.Errorf("%#x moved to %#x", va, pa(va))
		}
	}
	// Filling the hole coalesces again.
	if va := mustAlloc(t, s, 0, Page4K); va != vas[3] {
		t.Fatalf("hole at %#x not reused, got %#x", vas[3], va)
	}
	if st := s.Stats(); st.Mapped2M != Page2M {
		t.Errorf("refilled frame: %+v, want one 2 MiB leaf", st)
	}
}

func TestTLB(t *testing.T) {
	s := NewSpace(newFakeNode(4).lease(0), 0)
	va := mustAlloc(t, s, 0, Page2M)
	mustAlloc(t, s, 1, Page2M) // device 1's first frame
	mustTranslate(t, s, va, 4)
	mustTranslate(t, s, va+Page2M-4, 4)
	if st := s.Stats(); st.TLBMisses != 1 || st.TLBHits != 1 {
		t.Errorf("two accesses to one 2 MiB leaf: %d hits, %d misses; want 1, 1", st.TLBHits, st.TLBMisses)
	}
	// Freeing must invalidate: the address comes back mapped to another
	// frame, and a stale entry would still say the old one.
	old := mustTranslate(t, s, va, 4)[0].Addr
	if err := s.Free(va); err != nil {
		t.Fatal(err)
	}
	if again := mustAlloc(t, s, 1, Page2M); again != va {
		t.Fatalf("allocation at %#x, want the freed %#x", again, va)
	}
	dev, xs, err := s.Translate(va, 4)
	if err != nil || dev != 1 || xs[0].Addr == old {
		t.Fatalf("translate reused address: device %d, %v, %v; want device 1 away from %#x", dev, xs, err, old)
	}
}

// TestConcurrentUse runs allocations, translations and frees from many
// goroutines; the race detector and the final accounting judge it.
func TestConcurrentUse(t *testing.T) {
	node := newFakeNode(64)
	s := NewSpace(node.lease(0), 0)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			sizes := []uint64{1, Page64K, 3 << 20, 100 << 10}
			for i := range 50 {
				size := sizes[(g+i)%len(sizes)]
				va, err := s.Alloc(uint32(g%2), size)
				if err != nil {
					t.Error(err)
					return
				}
				if _, xs, err := s.Translate(va, size); err != nil || vocab.ExtentsLen(xs) != size {
					t.Errorf("translate %#x+%d: %v, %v", va, size, xs, err)
				}
				s.Stats()
				if err := s.Free(va); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Allocations != 0 || st.Frames != 0 || len(node.held(0)) != 0 {
		t.Errorf("after balanced allocs and frees: %+v", st)
	}
}
