package accelerator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
)

// framesAt returns the addresses of frame numbers nums.
func framesAt(nums ...int) []uint64 {
	out := make([]uint64, len(nums))
	for i, n := range nums {
		out[i] = uint64(n) * FrameSize
	}
	return out
}

// wantLocalErr checks a frame table error: class and the values it names.
func wantLocalErr(t *testing.T, err, sentinel error, parts ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %v, want %v", err, sentinel)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not name %q", err, p)
		}
	}
}

func mustAlloc(t *testing.T, ft *frameTable, o owner, n int) []uint64 {
	t.Helper()
	frames, err := ft.alloc(o, n)
	if err != nil {
		t.Fatalf("alloc(%d, %d): %v", o, n, err)
	}
	return frames
}

func TestFrameTableNew(t *testing.T) {
	for _, tc := range []struct {
		memory uint64
		frames int
	}{
		{0, 0}, {FrameSize - 1, 0}, {FrameSize, 1}, {FrameSize*3 + 5, 3}, {64 << 20, 32},
	} {
		total, free, _ := newFrameTable(tc.memory).usage()
		if total != tc.frames || free != tc.frames {
			t.Errorf("newFrameTable(%d).usage() = %d, %d; want %d, %d", tc.memory, total, free, tc.frames, tc.frames)
		}
	}
}

func TestFrameAllocContiguousFirstFit(t *testing.T) {
	ft := newFrameTable(8 * FrameSize)
	if got := mustAlloc(t, ft, 1, 3); !slices.Equal(got, framesAt(0, 1, 2)) {
		t.Fatalf("first alloc = %#x, want frames 0-2", got)
	}
	if got := mustAlloc(t, ft, 2, 2); !slices.Equal(got, framesAt(3, 4)) {
		t.Fatalf("second alloc = %#x, want frames 3-4", got)
	}
	// Free frames 0-2; the search goes on from the last allocation (frame
	// 5), then wraps around to the start.
	ft.release(framesAt(0, 1, 2))
	if got := mustAlloc(t, ft, 3, 2); !slices.Equal(got, framesAt(5, 6)) {
		t.Fatalf("third alloc = %#x, want frames 5-6", got)
	}
	if got := mustAlloc(t, ft, 3, 3); !slices.Equal(got, framesAt(0, 1, 2)) {
		t.Fatalf("wrapping alloc = %#x, want frames 0-2", got)
	}
	if total, free, _ := ft.usage(); total != 8 || free != 1 {
		t.Fatalf("usage = %d, %d; want 8, 1", total, free)
	}
}

// TestFrameAllocRunAcrossHint: a free run that straddles the place where the
// last allocation ended is still found whole.
func TestFrameAllocRunAcrossHint(t *testing.T) {
	ft := newFrameTable(8 * FrameSize)
	all := mustAlloc(t, ft, 1, 8)
	ft.release(all[:4])
	mustAlloc(t, ft, 2, 2) // frames 0, 1
	mustAlloc(t, ft, 2, 2) // frames 2, 3; the next search starts at frame 4
	// Free frames 0 and 2-4: the only run of three straddles frame 4.
	ft.release(framesAt(0, 2, 3, 4))
	if got := mustAlloc(t, ft, 3, 3); !slices.Equal(got, framesAt(2, 3, 4)) {
		t.Fatalf("alloc of 3 with frames 0 and 2-4 free = %#x, want the run 2-4", got)
	}
}

func TestFrameAllocScatteredWhenFragmented(t *testing.T) {
	ft := newFrameTable(8 * FrameSize)
	all := mustAlloc(t, ft, 1, 8)
	// Free every other frame: four free, no two in a row.
	ft.release([]uint64{all[1], all[3], all[5], all[7]})
	got := mustAlloc(t, ft, 2, 3)
	if !slices.Equal(got, framesAt(1, 3, 5)) {
		t.Fatalf("fragmented alloc = %#x, want frames 1, 3, 5 (ascending free frames)", got)
	}
	if owned := ft.ownedBy(2); !slices.Equal(owned, got) {
		t.Fatalf("ownedBy(2) = %#x, want %#x", owned, got)
	}
	if got := mustAlloc(t, ft, 3, 1); !slices.Equal(got, framesAt(7)) {
		t.Fatalf("last free frame: got %#x, want frame 7", got)
	}
}

func TestFrameAllocErrors(t *testing.T) {
	ft := newFrameTable(4 * FrameSize)
	mustAlloc(t, ft, 1, 3)
	for _, n := range []int{0, -1, -1 << 40} {
		_, err := ft.alloc(1, n)
		wantLocalErr(t, err, api.ErrInvalidArgument, fmt.Sprintf("allocate %d frames", n))
	}
	_, err := ft.alloc(2, 2)
	wantLocalErr(t, err, api.ErrOutOfMemory, "allocate 2 frames", "1 of 4 free")
	_, err = ft.alloc(2, 1<<31)
	wantLocalErr(t, err, api.ErrOutOfMemory)
	if total, free, _ := ft.usage(); total != 4 || free != 1 {
		t.Fatalf("failed allocations changed usage to %d, %d", total, free)
	}
	// An empty table refuses every allocation.
	_, err = newFrameTable(0).alloc(1, 1)
	wantLocalErr(t, err, api.ErrOutOfMemory)
}

func TestFrameCheckOwnedAndRelease(t *testing.T) {
	ft := newFrameTable(6 * FrameSize)
	a := mustAlloc(t, ft, 1, 2) // frames 0, 1
	b := mustAlloc(t, ft, 2, 2) // frames 2, 3
	for _, tc := range []struct {
		name     string
		o        owner
		addrs    []uint64
		sentinel error
		names    string
	}{
		{"own frames", 1, a, nil, ""},
		{"nothing", 1, nil, nil, ""},
		{"other owner's frame", 1, []uint64{a[0], b[1]}, api.ErrPermissionDenied, fmt.Sprintf("%#x", b[1])},
		{"free frame", 1, framesAt(5), api.ErrPermissionDenied, fmt.Sprintf("%#x", 5*FrameSize)},
		{"not aligned", 1, []uint64{a[0] + 4096}, api.ErrInvalidAddress, fmt.Sprintf("%#x", a[0]+4096)},
		{"beyond the device", 1, framesAt(6), api.ErrInvalidAddress, fmt.Sprintf("%#x", 6*FrameSize)},
		{"huge", 1, []uint64{^uint64(0) &^ (FrameSize - 1)}, api.ErrInvalidAddress, "0xffffffffffe00000"},
		{"named twice", 1, []uint64{a[0], a[1], a[0]}, api.ErrInvalidArgument, fmt.Sprintf("%#x named twice", a[0])},
	} {
		err := ft.checkOwned(tc.o, tc.addrs)
		if tc.sentinel == nil {
			if err != nil {
				t.Errorf("%s: checkOwned: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.sentinel) || !strings.Contains(fmt.Sprint(err), tc.names) {
			t.Errorf("%s: checkOwned = %v, want %v naming %s", tc.name, err, tc.sentinel, tc.names)
		}
	}
	// checkOwned changes nothing.
	if got := ft.ownedBy(1); !slices.Equal(got, a) {
		t.Fatalf("ownedBy(1) = %#x after checks, want %#x", got, a)
	}
	ft.release(a[:1])
	if got := ft.ownedBy(1); !slices.Equal(got, a[1:]) {
		t.Fatalf("ownedBy(1) after release = %#x, want %#x", got, a[1:])
	}
	if got := ft.ownedBy(0); !slices.Equal(got, framesAt(0, 4, 5)) {
		t.Fatalf("free frames = %#x, want 0, 4, 5", got)
	}
	if _, free, _ := ft.usage(); free != 3 {
		t.Fatalf("free = %d, want 3", free)
	}
	if err := ft.checkOwned(1, a[:1]); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("released frame still counts as owned: %v", err)
	}
	if got := ft.ownedBy(9); got != nil {
		t.Fatalf("ownedBy(stranger) = %#x", got)
	}
}

func TestFrameCheckAccess(t *testing.T) {
	ft := newFrameTable(4 * FrameSize)
	mustAlloc(t, ft, 1, 2) // frames 0, 1
	mustAlloc(t, ft, 2, 1) // frame 2; frame 3 free
	const limit = 4 * FrameSize
	for _, tc := range []struct {
		name     string
		xs       []api.Extent
		sentinel error
		names    string
	}{
		{"none", nil, nil, ""},
		{"one byte", []api.Extent{ext(0, 0, 1)}, nil, ""},
		{"whole frame", []api.Extent{ext(FrameSize, 0, FrameSize)}, nil, ""},
		{"across own frames", []api.Extent{ext(FrameSize-8, 0, 16)}, nil, ""},
		{"both own frames", []api.Extent{ext(0, 0, 2*FrameSize)}, nil, ""},
		{"zero length in other's frame", []api.Extent{ext(2*FrameSize, 0, 0)}, nil, ""},
		{"zero length beyond memory", []api.Extent{ext(limit+12345, 0, 0)}, nil, ""},
		{"into other's frame", []api.Extent{ext(2*FrameSize-8, 0, 16)}, api.ErrPermissionDenied, fmt.Sprintf("%#x", 2*FrameSize)},
		{"other's frame", []api.Extent{ext(0, 0, 8), ext(2*FrameSize+64, 0, 8)}, api.ErrPermissionDenied, fmt.Sprintf("frame %#x", 2*FrameSize)},
		{"free frame", []api.Extent{ext(3*FrameSize, 0, 1)}, api.ErrPermissionDenied, fmt.Sprintf("frame %#x", 3*FrameSize)},
		{"at the end", []api.Extent{ext(limit, 0, 1)}, api.ErrInvalidAddress, fmt.Sprintf("%#x", limit)},
		{"past the end", []api.Extent{ext(limit-4, 0, 8)}, api.ErrInvalidAddress, fmt.Sprintf("%#x", limit-4)},
		{"length overflows", []api.Extent{ext(8, 0, ^uint64(0)-4)}, api.ErrInvalidAddress, "0x8"},
		{"address overflows", []api.Extent{ext(^uint64(0), 0, 1)}, api.ErrInvalidAddress, "0xffffffffffffffff"},
	} {
		err := ft.checkAccess(1, tc.xs)
		if tc.sentinel == nil {
			if err != nil {
				t.Errorf("%s: checkAccess(%v): %v", tc.name, tc.xs, err)
			}
			continue
		}
		if !errors.Is(err, tc.sentinel) || !strings.Contains(fmt.Sprint(err), tc.names) {
			t.Errorf("%s: checkAccess(%v) = %v, want %v naming %s", tc.name, tc.xs, err, tc.sentinel, tc.names)
		}
	}
	if err := ft.checkAccess(2, []api.Extent{ext(2*FrameSize, 0, FrameSize)}); err != nil {
		t.Errorf("owner 2 on its frame: %v", err)
	}
}

// TestFrameSeal: a sealed frame passes checkAccess but not checkWrite, and
// unseal reports which of the frames it is given were sealed.
func TestFrameSeal(t *testing.T) {
	ft := newFrameTable(4 * FrameSize)
	f := mustAlloc(t, ft, 1, 3)
	ft.seal(f[1])
	if !ft.isSealed(f[1]) || ft.isSealed(f[0]) {
		t.Fatal("sealed the wrong frame")
	}
	across := []api.Extent{ext(f[1]-8, 0, 16)}
	if err := ft.checkAccess(1, across); err != nil {
		t.Fatalf("reading a sealed frame: %v", err)
	}
	if err := ft.checkWrite(1, []api.Extent{ext(f[0], 0, 8), ext(f[2], 0, 8)}); err != nil {
		t.Fatalf("writing frames that are not sealed: %v", err)
	}
	err := ft.checkWrite(1, across)
	if !errors.Is(err, api.ErrPermissionDenied) || !strings.Contains(fmt.Sprint(err), fmt.Sprintf("sealed frame %#x", f[1])) {
		t.Fatalf("writing into a sealed frame: %v", err)
	}
	if got := ft.unseal(f); len(got) != 1 || got[0] != f[1] {
		t.Fatalf("unseal(%#x) = %#x, want only %#x", f, got, f[1])
	}
	if err := ft.checkWrite(1, across); err != nil || ft.isSealed(f[1]) {
		t.Fatalf("after unseal: %v", err)
	}
}

// frameModel is the property test's picture of a frame table: the owner of
// each frame, 0 for free.
type frameModel []owner

func (m frameModel) free() int {
	n := 0
	for _, o := range m {
		if o == 0 {
			n++
		}
	}
	return n
}

// hasRun reports whether n free frames lie in a row.
func (m frameModel) hasRun(n int) bool {
	run := 0
	for _, o := range m {
		if o != 0 {
			run = 0
		} else if run++; run >= n {
			return true
		}
	}
	return false
}

func (m frameModel) ownedBy(o owner) []uint64 {
	var out []uint64
	for i, w := range m {
		if w == o {
			out = append(out, uint64(i)*FrameSize)
		}
	}
	return out
}

// canAccess is what checkAccess must answer for x.
func (m frameModel) canAccess(o owner, x api.Extent) error {
	limit := uint64(len(m)) * FrameSize
	if x.Len == 0 {
		return nil
	}
	if x.Addr >= limit || x.Addr+x.Len > limit || x.Addr+x.Len < x.Addr {
		return api.ErrInvalidAddress
	}
	for f := x.Addr / FrameSize; f*FrameSize < x.Addr+x.Len; f++ {
		if m[f] != o {
			return api.ErrPermissionDenied
		}
	}
	return nil
}

// TestFrameTableProperty: random allocations and releases by several owners
// keep the table in step with a simple model: no frame has two owners, the
// free count is the number of frames without one, allocation is contiguous
// whenever a run is free, and checkAccess admits exactly the extents that
// lie in the caller's frames.
func TestFrameTableProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nframes := rapid.IntRange(1, 24).Draw(t, "frames")
		ft := newFrameTable(uint64(nframes) * FrameSize)
		model := make(frameModel, nframes)
		owners := rapid.IntRange(1, 4).Draw(t, "owners")
		drawOwner := func() owner { return owner(rapid.IntRange(1, owners).Draw(t, "owner")) }

		t.Repeat(map[string]func(*rapid.T){
			"alloc": func(t *rapid.T) {
				o := drawOwner()
				n := rapid.IntRange(-1, nframes+1).Draw(t, "n")
				contiguous := n > 0 && model.hasRun(n)
				got, err := ft.alloc(o, n)
				switch {
				case n <= 0:
					if !errors.Is(err, api.ErrInvalidArgument) {
						t.Fatalf("alloc(%d) = %v, want invalid argument", n, err)
					}
					return
				case n > model.free():
					if !errors.Is(err, api.ErrOutOfMemory) {
						t.Fatalf("alloc(%d) with %d free = %v, want out of memory", n, model.free(), err)
					}
					return
				case err != nil:
					t.Fatalf("alloc(%d) with %d free: %v", n, model.free(), err)
				}
				if len(got) != n {
					t.Fatalf("alloc(%d) granted %d frames", n, len(got))
				}
				for i, a := range got {
					if a%FrameSize != 0 || a/FrameSize >= uint64(nframes) {
						t.Fatalf("alloc granted bad frame address %#x", a)
					}
					if w := model[a/FrameSize]; w != 0 {
						t.Fatalf("alloc granted frame %#x to %d, already held by %d", a, o, w)
					}
					model[a/FrameSize] = o
					if contiguous && i > 0 && a != got[i-1]+FrameSize {
						t.Fatalf("alloc(%d) = %#x is scattered though a free run existed", n, got)
					}
				}
			},
			"release": func(t *rapid.T) {
				o := drawOwner()
				held := model.ownedBy(o)
				if len(held) == 0 {
					t.Skip("owner holds nothing")
				}
				sub := rapid.SliceOfNDistinct(rapid.SampledFrom(held), 1, len(held), rapid.ID[uint64]).Draw(t, "frames")
				if err := ft.checkOwned(o, sub); err != nil {
					t.Fatalf("checkOwned(%d, %#x) of held frames: %v", o, sub, err)
				}
				ft.release(sub)
				for _, a := range sub {
					model[a/FrameSize] = 0
				}
			},
			"checkOwned foreign": func(t *rapid.T) {
				o := drawOwner()
				f := rapid.IntRange(0, nframes-1).Draw(t, "frame")
				err := ft.checkOwned(o, framesAt(f))
				if (err == nil) != (model[f] == o) || err != nil && !errors.Is(err, api.ErrPermissionDenied) {
					t.Fatalf("checkOwned(%d, frame %d held by %d) = %v", o, f, model[f], err)
				}
			},
			"checkAccess": func(t *rapid.T) {
				o := drawOwner()
				limit := uint64(nframes) * FrameSize
				x := api.Extent{
					Addr: rapid.Uint64Range(0, limit+FrameSize).Draw(t, "addr"),
					Len:  rapid.OneOf(rapid.Uint64Range(0, 3*FrameSize), rapid.Uint64()).Draw(t, "len"),
				}
				err, want := ft.checkAccess(o, []api.Extent{x}), model.canAccess(o, x)
				if want == nil && err != nil || want != nil && !errors.Is(err, want) {
					t.Fatalf("checkAccess(%d, %+v) = %v, want %v", o, x, err, want)
				}
			},
			"": func(t *rapid.T) {
				total, free, _ := ft.usage()
				if total != nframes || free != model.free() {
					t.Fatalf("usage = %d, %d; model has %d, %d", total, free, nframes, model.free())
				}
				for o := owner(0); o <= owner(owners); o++ {
					if got, want := ft.ownedBy(o), model.ownedBy(o); !slices.Equal(got, want) {
						t.Fatalf("ownedBy(%d) = %#x, model %#x", o, got, want)
					}
				}
			},
		})
	})
}
