package memory

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

// A space rebuilt from its layout alone (Snapshot, RestoreLayout) — with
// large and small allocations, holes left by frees, a sealed one, chunks
// evicted to a store file and resident ones — reads back every byte, and
// places the next allocations where the original does, so a journal
// written after the snapshot replays onto it.
func TestSpaceRestoredFromItsLayout(t *testing.T) {
	node := newFakeNode(16)
	path := filepath.Join(t.TempDir(), "s.store")
	store, err := CreateFileStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := NewSpace(node.lease(0), 0)
	first.Oversubscribe(store, 3*FrameSize)
	big, err := first.Alloc(0, 5*FrameSize+Page64K) // six chunks, the last shared
	if err != nil {
		t.Fatal(err)
	}
	var small []uint64
	for i := range 6 {
		va, err := first.AllocHint(0, uint64(8<<10+i*Page64K), vocab.HintWeight)
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, va)
	}
	for _, i := range []int{1, 4} { // holes
		if err := first.Free(small[i]); err != nil {
			t.Fatal(err)
		}
	}
	// A chunk at a time: the space keeps three resident.
	access := func(s *Space, va uint64, p []byte, write bool) {
		for off := 0; off < len(p); off += FrameSize {
			piece := p[off:min(len(p), off+FrameSize)]
			dev, xs, err := s.Translate(va+uint64(off), uint64(len(piece)))
			if err != nil {
				t.Fatal(err)
			}
			copyExtents(node, dev, xs, piece, write)
		}
	}
	want := map[uint64][]byte{}
	for i, va := range []uint64{big, small[0], small[2], small[3], small[5]} {
		a, err := first.AllocationAt(va)
		if err != nil {
			t.Fatal(err)
		}
		want[va] = pattern(uint64(i+1), int(a.End-a.VA))
		access(first, va, want[va], true)
	}
	if err := first.Seal(small[2]); err != nil {
		t.Fatal(err)
	}
	var l Layout
	if err := first.Snapshot(func(got Layout) error { l = got; return nil }); err != nil {
		t.Fatal(err)
	}
	var frames [][]uint64
	stored := 0
	for i, c := range l.Chunks {
		if c.Resident {
			frames = append(frames, []uint64{c.Frame})
		}
		if c.Key != 0 {
			stored++
			l.Chunks[i].Sum, _ = store.Sum(c.Key)
		}
	}
	if stored == 0 || len(frames) == 0 || len(l.Allocs) != 5 {
		t.Fatalf("layout %+v: want chunks evicted to the store, resident ones and 5 allocations", l)
	}
	if err := store.Close(); err != nil { // the process dies
		t.Fatal(err)
	}

	reopened, err := OpenFileStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	src := &replaySource{lease: node.lease(0), next: frames}
	s := NewSpace(src, 0)
	s.Oversubscribe(reopened, 3*FrameSize)
	for _, c := range l.Chunks {
		if c.Key != 0 {
			if err := reopened.Adopt(c.Key, c.Sum); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.RestoreLayout(l); err != nil {
		t.Fatal(err)
	}
	if err := reopened.Verify(); err != nil {
		t.Fatal(err)
	}
	if len(src.next) != 0 {
		t.Fatalf("%d resident chunks' frames never asked for", len(src.next))
	}
	a, b := first.Stats(), s.Stats()
	if a.Allocations != b.Allocations || a.Allocated != b.Allocated || a.Frames != b.Frames || a.Evicted != b.Evicted || a.Mapped != b.Mapped {
		t.Fatalf("restored stats %+v, the first space's %+v", b, a)
	}
	if _, sealed, err := s.Hint(small[2]); err != nil || !sealed {
		t.Fatalf("the sealed allocation once restored: sealed %v, %v", sealed, err)
	}
	// The next allocations land where the first space puts them: in the
	// holes and tails of the chunks they share.
	for _, next := range []struct {
		size uint64
		hint vocab.Hint
	}{{8 << 10, vocab.HintWeight}, {Page64K, vocab.HintWeight}, {Page4K, vocab.HintNone}} {
		va1, err1 := first.AllocHint(0, next.size, next.hint)
		va2, err2 := s.AllocHint(0, next.size, next.hint)
		if err1 != nil || err2 != nil || va1 != va2 {
			t.Fatalf("alloc %d: the first space at %#x (%v), the restored one at %#x (%v)", next.size, va1, err1, va2, err2)
		}
	}
	for va, w := range want {
		got := make([]byte, len(w))
		if access(s, va, got, false); !bytes.Equal(got, w) {
			t.Fatalf("allocation %#x reads other bytes once restored", va)
		}
	}
}

// A layout no space could have had is refused, naming what is wrong, and
// leaves the space empty, with no frame taken from the source.
func TestRestoreLayoutRefusesBadLayouts(t *testing.T) {
	const c0, c1 = vaBase, vaBase + Page2M
	resident := func(va, frame uint64) ChunkLayout { return ChunkLayout{VA: va, Resident: true, Frame: frame} }
	for name, l := range map[string]Layout{
		"misaligned chunk":    {Chunks: []ChunkLayout{resident(c0+Page4K, 0)}, Allocs: []AllocLayout{{VA: c0 + Page4K, Size: 1}}},
		"chunks out of order": {Chunks: []ChunkLayout{resident(c1, 0), resident(c0, FrameSize)}, Allocs: []AllocLayout{{VA: c0, Size: Page2M}, {VA: c1, Size: 1}}},
		"shared frame":        {Chunks: []ChunkLayout{resident(c0, 0), resident(c1, 0)}, Allocs: []AllocLayout{{VA: c0, Size: 2 * Page2M}}},
		"unused chunk":        {Chunks: []ChunkLayout{resident(c0, 0), resident(c1, FrameSize)}, Allocs: []AllocLayout{{VA: c0, Size: 1}}},
		"no chunk":            {Allocs: []AllocLayout{{VA: c0, Size: 1}}},
		"overlap":             {Chunks: []ChunkLayout{resident(c0, 0)}, Allocs: []AllocLayout{{VA: c0, Size: 2 * Page4K}, {VA: c0 + Page4K, Size: 1}}},
		"misaligned alloc":    {Chunks: []ChunkLayout{resident(c0, 0)}, Allocs: []AllocLayout{{VA: c0 + Page4K, Size: Page64K}}},
		"crosses its chunk":   {Chunks: []ChunkLayout{resident(c0, 0), resident(c1, FrameSize)}, Allocs: []AllocLayout{{VA: c1 - Page64K, Size: 2 * Page64K}}},
		"evicted, no store":   {Chunks: []ChunkLayout{{VA: c0}}, Allocs: []AllocLayout{{VA: c0, Size: 1}}},
		"size 0":              {Chunks: []ChunkLayout{resident(c0, 0)}, Allocs: []AllocLayout{{VA: c0}}},
		"evicted, sealed":     {Chunks: []ChunkLayout{{VA: c0, FrameSealed: true}}, Allocs: []AllocLayout{{VA: c0, Size: 1}}},
	} {
		t.Run(name, func(t *testing.T) {
			node := newFakeNode(4)
			s := NewSpace(node.lease(0), 0)
			err := s.RestoreLayout(l)
			if !errors.Is(err, vocab.ErrInvalidArgument) {
				t.Fatalf("restore of a layout with a %s: %v, want invalid argument", name, err)
			}
			if st := s.Stats(); st.Allocations != 0 || st.Frames != 0 {
				t.Fatalf("a refused layout left %+v", st)
			}
			if _, err := s.Alloc(0, 1); err != nil {
				t.Fatalf("the space after a refused layout: %v", err)
			}
		})
	}
}
