package accelerator

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// oneByteRuns returns n one-byte extents of frame f, a byte apart.
func oneByteRuns(f uint64, first, n int) []api.Extent {
	xs := make([]api.Extent, n)
	for i := range xs {
		xs[i] = ext(f, uint64(2*(first+i)), 1)
	}
	return xs
}

// An export that would put more than MaxSharedRuns runs of shared objects
// on one frame is refused, naming the counts, the bound and the frame, and
// promptly: a connection that sends export after export of as many tiny
// extents as the wire allows in one frame does not hold up another
// tenant's allocations on the device while it does.
func TestNodeSharedRunsPerFrameAreBounded(t *testing.T) {
	tn := startNode(t)
	a, b := tn.connect(t, "alpha"), tn.connect(t, "beta")
	f := a.alloc(0, 1)[0]

	// Another tenant allocates and frees on the device meanwhile.
	var slowest atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			fs, err := b.tryAlloc(0, 1)
			if err == nil {
				err = b.free(0, fs...)
			}
			if d := int64(time.Since(start)); d > slowest.Load() {
				slowest.Store(d)
			}
			if err != nil {
				t.Errorf("beta's alloc and free: %v", err)
				return
			}
		}
	}()
	for i := range 3 {
		// Each export names other bytes: none overlaps an earlier one.
		many := make([]api.Extent, wire.MaxList)
		for k := range many {
			many[k] = ext(f, uint64(3*k+i), 1)
		}
		start := time.Now()
		_, err := a.export(api.ModeImmutable, many...)
		if err == nil {
			close(stop)
			wg.Wait()
			t.Fatalf("export %d of %d one-byte runs of one frame: accepted (in %v), want it refused", i, len(many), time.Since(start))
		}
		wantErr(t, err, api.ErrInvalidArgument, strconv.Itoa(wire.MaxList), strconv.Itoa(MaxSharedRuns), hex(f))
	}
	close(stop)
	wg.Wait()
	if d := time.Duration(slowest.Load()); d > 2*time.Second {
		t.Errorf("beta's slowest alloc and free took %v while alpha exported", d)
	}

	// Exactly the bound is fine; one run more on the frame, in another
	// object, is refused; other frames are not affected; ending the object
	// makes room again.
	g, h := a.alloc(0, 1)[0], a.alloc(0, 1)[0]
	id, err := a.export(api.ModeCoherent, oneByteRuns(g, 0, MaxSharedRuns)...)
	if err != nil {
		t.Fatalf("export of %d runs of one frame: %v", MaxSharedRuns, err)
	}
	_, err = a.export(api.ModeCoherent, oneByteRuns(g, MaxSharedRuns, 1)...)
	wantErr(t, err, api.ErrInvalidArgument, strconv.Itoa(MaxSharedRuns), hex(g))
	if _, err := a.export(api.ModeCoherent, ext(h, 0, 1)); err != nil {
		t.Fatalf("export in another frame: %v", err)
	}
	if _, err := a.call(api.OpNodeUnexport, &api.NodeObject{Object: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.export(api.ModeCoherent, oneByteRuns(g, MaxSharedRuns, 1)...); err != nil {
		t.Fatalf("export after the full frame's object ended: %v", err)
	}
	if _, err := b.tryAlloc(0, 1); err != nil {
		t.Fatalf("beta's alloc after all: %v", err)
	}
}

// What a mediator exports fits: every 4 KiB page of a frame a run of its
// own, in objects of its own, and whole frames.
func TestNodeExportOfEveryPageOfAFrame(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	f := a.alloc(0, 1)[0]
	const page = 4096
	var odd, even []api.Extent
	for p := uint64(0); p < FrameSize/page; p++ {
		if p%2 == 0 {
			even = append(even, ext(f, p*page, page))
		} else {
			odd = append(odd, ext(f, p*page, page))
		}
	}
	if _, err := a.export(api.ModeImmutable, even...); err != nil {
		t.Fatalf("export of the even pages: %v", err)
	}
	for i := range odd {
		if _, err := a.export(api.ModeImmutable, odd[i]); err != nil {
			t.Fatalf("export of odd page %d: %v", i, err)
		}
	}
	fs := a.alloc(0, 4)
	xs := make([]api.Extent, len(fs))
	for i, g := range fs {
		xs[i] = ext(g, 0, FrameSize)
	}
	if _, err := a.export(api.ModeCoherent, xs...); err != nil {
		t.Fatalf("export of whole frames: %v", err)
	}
}

// The extents of a connection's live objects, which the node keeps in
// host memory for their lives, are bounded: an export past the bound is
// refused with quota-exceeded, naming the counts; another connection has
// its own; ending an object gives its extents back.
func TestNodeExportedExtentsPerConnectionAreBounded(t *testing.T) {
	tn := startNode(t)
	tn.node.objects.maxExtents = 1000
	a := tn.connect(t, "alpha")
	fs := a.alloc(0, 4)
	first, err := a.export(api.ModeCoherent, append(oneByteRuns(fs[0], 0, 300), oneByteRuns(fs[1], 0, 300)...)...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.export(api.ModeImmutable, oneByteRuns(fs[2], 0, 400)...); err != nil {
		t.Fatal(err)
	}
	_, err = a.export(api.ModeCoherent, oneByteRuns(fs[3], 0, 1)...)
	wantErr(t, err, api.ErrQuotaExceeded, "1000", "1 extent")
	other := tn.connect(t, "alpha")
	if _, err := other.export(api.ModeCoherent, oneByteRuns(other.alloc(0, 1)[0], 0, 500)...); err != nil {
		t.Fatalf("another connection's export: %v", err)
	}
	if _, err := a.call(api.OpNodeUnexport, &api.NodeObject{Object: first}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.export(api.ModeCoherent, append(oneByteRuns(fs[3], 0, 300), oneByteRuns(fs[0], 0, 300)...)...); err != nil {
		t.Fatalf("export after an object ended: %v", err)
	}
	// A failed export takes nothing.
	_, err = a.export(api.ModeCoherent, oneByteRuns(fs[0], 0, 1)...)
	wantErr(t, err, api.ErrQuotaExceeded)
	if err := a.free(0, fs...); err != nil {
		t.Fatal(err)
	}
	g := a.alloc(0, 2)
	if _, err := a.export(api.ModeCoherent, append(oneByteRuns(g[0], 0, 500), oneByteRuns(g[1], 0, 500)...)...); err != nil {
		t.Fatalf("export after the frames were freed: %v", err)
	}
}

// The frame table's runs of shared objects answer as a plain list would:
// share, unshare, isShared and checkWrite against a model, for random
// runs, and the table's lists stay sorted, disjoint and within the bound.
func TestFrameSharedRunsMatchAModel(t *testing.T) {
	const frames = 3
	ft := newFrameTable(frames * FrameSize)
	mustAlloc(t, ft, 1, frames)
	rng := rand.New(rand.NewPCG(1, 2))
	var model [][]api.Extent // each shared object's runs
	overlaps := func(x api.Extent) bool {
		for _, o := range model {
			for _, s := range o {
				if s.Len > 0 && x.Len > 0 && s.Addr < x.Addr+x.Len && x.Addr < s.Addr+s.Len {
					return true
				}
			}
		}
		return false
	}
	randExtent := func() api.Extent {
		a := rng.Uint64N(frames*FrameSize - 1)
		n := 1 + rng.Uint64N(min(frames*FrameSize-a, 1+rng.Uint64N(3)*rng.Uint64N(FrameSize/8)))
		return api.Extent{Addr: a, Len: n}
	}
	for step := range 3000 {
		switch r := rng.IntN(10); {
		case r < 5: // share some disjoint runs
			var xs []api.Extent
			for range 1 + rng.IntN(8) {
				x := randExtent()
				if !overlaps(x) && !api.ExtentsOverlap(xs, []api.Extent{x}) {
					xs = append(xs, x)
				}
			}
			err := ft.share(xs)
			if err != nil {
				wantLocalErr(t, err, api.ErrInvalidArgument, strconv.Itoa(MaxSharedRuns))
				continue
			}
			model = append(model, xs)
		case r < 7 && len(model) > 0: // unshare an object
			i := rng.IntN(len(model))
			ft.unshare(model[i])
			model = append(model[:i], model[i+1:]...)
		default: // ask
			x := randExtent()
			want := overlaps(x)
			if got := ft.isShared([]api.Extent{x}); got != want {
				t.Fatalf("step %d: isShared(%v) = %v, want %v", step, x, got, want)
			}
			if err := ft.checkWrite(1, []api.Extent{x}); (err != nil) != want {
				t.Fatalf("step %d: checkWrite(%v) = %v, want overlap %v", step, x, err, want)
			}
			if err := ft.shareable([]api.Extent{x}); (err != nil) != want {
				t.Fatalf("step %d: shareable(%v) = %v, want overlap %v", step, x, err, want)
			}
		}
		for f, runs := range ft.shared {
			if len(runs) == 0 || len(runs) > MaxSharedRuns {
				t.Fatalf("step %d: frame %d holds %d runs", step, f, len(runs))
			}
			for i, s := range runs {
				if s.Len == 0 || s.Addr/FrameSize != uint64(f) || (s.Addr+s.Len-1)/FrameSize != uint64(f) {
					t.Fatalf("step %d: frame %d holds run %v", step, f, s)
				}
				if i > 0 && runs[i-1].Addr+runs[i-1].Len > s.Addr {
					t.Fatalf("step %d: frame %d: runs %v and %v are out of order or overlap", step, f, runs[i-1], s)
				}
			}
		}
	}
	for _, o := range model {
		ft.unshare(o)
	}
	if len(ft.shared) != 0 {
		t.Fatalf("after unsharing everything, %d frames hold runs", len(ft.shared))
	}
}

// More runs on a frame than the bound are refused by the frame table
// itself, naming the frame and the counts, and change nothing.
func TestFrameShareRefusesRunsPastTheBound(t *testing.T) {
	ft := newFrameTable(2 * FrameSize)
	mustAlloc(t, ft, 1, 2)
	if err := ft.share(oneByteRuns(0, 0, MaxSharedRuns-1)); err != nil {
		t.Fatal(err)
	}
	more := append(oneByteRuns(0, MaxSharedRuns, 2), ext(FrameSize, 0, 1))
	for _, try := range []func([]api.Extent) error{ft.shareable, ft.share} {
		wantLocalErr(t, try(more), api.ErrInvalidArgument, fmt.Sprintf("frame %#x", 0), strconv.Itoa(MaxSharedRuns-1), strconv.Itoa(MaxSharedRuns))
	}
	if ft.isShared([]api.Extent{ext(FrameSize, 0, 1)}) || len(ft.shared[0]) != MaxSharedRuns-1 {
		t.Fatalf("a refused share changed the table: %d runs on frame 0, frame 1 shared %v", len(ft.shared[0]), ft.isShared([]api.Extent{ext(FrameSize, 0, 1)}))
	}
	if err := ft.share(more[1:]); err != nil {
		t.Fatalf("share up to the bound: %v", err)
	}
}
