package accelerator

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/accelerator/sim"
	"github.com/vgpu/vgpu/api"
)

// share returns tenant's share of device dev as c's node reports it.
func (c *client) share(dev uint32, tenant string) api.DeviceTenant {
	c.t.Helper()
	for _, s := range c.status().Shares {
		if s.Device == dev && s.Tenant == tenant {
			return s
		}
	}
	c.t.Fatalf("no share of device %d for tenant %q", dev, tenant)
	return api.DeviceTenant{}
}

// moveFor fills c's frames, all of them, with a byte other than zero, and
// copies their first half onto their second half, in a loop for d, and
// returns the bytes it moved and how long it took.
func moveFor(t *testing.T, c *client, frames []uint64, d time.Duration) (uint64, time.Duration) {
	t.Helper()
	var all, lo, hi []api.Extent
	for i, f := range frames {
		all = append(all, ext(f, 0, FrameSize))
		if i < len(frames)/2 {
			lo = append(lo, ext(f, 0, FrameSize))
		} else {
			hi = append(hi, ext(f, 0, FrameSize))
		}
	}
	var moved uint64
	start := time.Now()
	for time.Since(start) < d {
		if err := c.fill(0, 0x5a, all...); err != nil {
			t.Fatalf("fill: %v", err)
		}
		if err := c.copy(0, hi, lo); err != nil {
			t.Fatalf("copy: %v", err)
		}
		moved += api.ExtentsLen(all) + api.ExtentsLen(hi)
	}
	return moved, time.Since(start)
}

// TestFillCopyCharged: fills and copies are device work of the tenant that
// asks for them, run in slices on the device's scheduler: their time counts
// in the tenant's device time, and a tenant capped by compute_max fills and
// copies no faster than its cap lets it, however idle the device.
func TestFillCopyCharged(t *testing.T) {
	tn := startNode(t)
	const frames = 8 // 16 MiB: a fill takes milliseconds on the sim backend

	free := tn.connectShare(t, "free", 1, 0)
	freeMoved, freeWall := moveFor(t, free, free.alloc(0, frames), 300*time.Millisecond)
	s := free.share(0, "free")
	t.Logf("uncapped: %d MiB in %v, %v charged in %d slices", freeMoved>>20, freeWall, s.DeviceTime, s.Slices)
	if s.DeviceTime < freeWall/2 {
		t.Errorf("uncapped: filled and copied for %v, %v of it charged: want at least half", freeWall, s.DeviceTime)
	}
	if requests := 2 * freeMoved / ((frames + frames/2) * FrameSize); s.Slices <= requests || s.Launches != 0 {
		t.Errorf("uncapped: %d requests of megabytes ran in %d slices, counting %d launches: want more slices than requests, no launches",
			requests, s.Slices, s.Launches)
	}

	const cap = 0.1
	capped := tn.connectShare(t, "capped", 1, cap)
	cappedMoved, cappedWall := moveFor(t, capped, capped.alloc(0, frames), 500*time.Millisecond)
	s = capped.share(0, "capped")
	t.Logf("capped at %.1f: %d MiB in %v, %v charged", cap, cappedMoved>>20, cappedWall, s.DeviceTime)
	// The cap's share of the time, its first bucket, and a step past the
	// bucket's end, with room for a noisy host.
	if limit := time.Duration(cap*float64(cappedWall+capWindow)) + cappedWall/10; s.DeviceTime > limit {
		t.Errorf("capped at %.1f: charged %v in %v, want at most %v", cap, s.DeviceTime, cappedWall, limit)
	}
	if s.DeviceTime < cappedWall/20 {
		t.Errorf("capped at %.1f: charged %v in %v, want its fills and copies charged", cap, s.DeviceTime, cappedWall)
	}
	// What the cap lets through, measured in bytes moved rather than in
	// the scheduler's own accounting, within 3 times.
	freeRate := float64(freeMoved) / freeWall.Seconds()
	cappedRate := float64(cappedMoved) / cappedWall.Seconds()
	allowed := cap * (cappedWall + capWindow).Seconds() / cappedWall.Seconds()
	if cappedRate > 3*allowed*freeRate {
		t.Errorf("capped at %.1f: moved %.0f MiB/s, uncapped %.0f MiB/s: want at most %.2f of it", cap, cappedRate/(1<<20), freeRate/(1<<20), 3*allowed)
	}
}

// TestSealDedupCharged: hashing frames to seal them, and copying sealed
// frames for a dedup, which the node does on the connection's goroutine,
// count in the device time of the tenant that asked.
func TestSealDedupCharged(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "sealer")
	const n = 8
	frames := a.alloc(0, n)
	hashes := make([][32]byte, n)
	for i, f := range frames {
		if err := a.fill(0, byte(i+1), ext(f, 0, FrameSize)); err != nil {
			t.Fatal(err)
		}
		hashes[i] = sha256.Sum256(bytes.Repeat([]byte{byte(i + 1)}, FrameSize))
	}
	before := a.share(0, "sealer").DeviceTime
	start := time.Now()
	if err := a.seal(0, frames...); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	charged := a.share(0, "sealer").DeviceTime - before
	t.Logf("sealing %d frames took %v, %v charged", n, wall, charged)
	if charged < wall/2 {
		t.Errorf("sealing %d frames took %v, %v of it charged: want at least half", n, wall, charged)
	}

	// A dedup on the other device copies each frame.
	b := tn.connect(t, "copier")
	hit, err := b.dedup(1, b.alloc(1, n), hashes...)
	if err != nil || !slices.Equal(hit, slices.Repeat([]bool{true}, n)) {
		t.Fatalf("dedup of sealed frames on another device: %v, %v", hit, err)
	}
	if s := b.share(1, "copier"); s.DeviceTime <= 0 {
		t.Errorf("dedup copying %d frames: share %+v, want device time", n, s)
	}
}

// TestFillCopySameBytes: fills and copies cut into pieces on the scheduler
// leave device memory exactly as one call of the sim device does, for
// extents that cross pieces at odd places, copies whose source and
// destination overlap, forwards, backwards and over several extents, and
// destinations that overlap each other; a copy whose lengths differ
// changes nothing.
func TestFillCopySameBytes(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 6)
	ref, err := sim.New(0, testMemory)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	rng := rand.NewChaCha8([32]byte{1})
	for _, fr := range f {
		for off := uint64(0); off < FrameSize; off += api.MaxChunk {
			p := make([]byte, api.MaxChunk)
			_, _ = rng.Read(p)
			xs := []api.Extent{ext(fr, off, api.MaxChunk)}
			c.mustWrite(0, xs, p)
			if err := ref.Write(xs, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	type op struct {
		name     string
		fill     bool
		v        byte
		dst, src []api.Extent
		fails    bool
	}
	ops := []op{
		{name: "fill over extents", fill: true, v: 0xa5, dst: []api.Extent{ext(f[0], 100, 300001), ext(f[1], 7, 1<<20+3), ext(f[2], 9, 0), ext(f[3], 1, 5)}},
		{name: "zero fill of a frame", fill: true, dst: []api.Extent{ext(f[2], 0, FrameSize)}},
		{name: "copy over extents", dst: []api.Extent{ext(f[3], 1, 700001), ext(f[4], 5, 500000)},
			src: []api.Extent{ext(f[0], 3, 200000), ext(f[5], 11, 1000001)}},
		{name: "overlapping copy forwards", dst: []api.Extent{ext(f[1], 0, FrameSize-1000)}, src: []api.Extent{ext(f[1], 1000, FrameSize-1000)}},
		{name: "overlapping copy backwards", dst: []api.Extent{ext(f[2], 999, FrameSize-999)}, src: []api.Extent{ext(f[2], 0, FrameSize-999)}},
		{name: "overlapping copy over extents", dst: []api.Extent{ext(f[3], 0, 400000), ext(f[4], 0, 400000)},
			src: []api.Extent{ext(f[4], 100000, 400000), ext(f[3], 50000, 400000)}},
		{name: "small overlapping copy", dst: []api.Extent{ext(f[5], 10, 5000), ext(f[5], 6000, 7)}, src: []api.Extent{ext(f[5], 0, 5007)}},
		{name: "destinations overlapping each other", dst: []api.Extent{ext(f[5], 0, 300000), ext(f[5], 100000, 300000)},
			src: []api.Extent{ext(f[0], 0, 600000)}},
		{name: "copy of lengths that differ", dst: []api.Extent{ext(f[0], 0, FrameSize)}, src: []api.Extent{ext(f[1], 0, FrameSize-1)}, fails: true},
	}
	for _, o := range ops {
		var got, want error
		if o.fill {
			got, want = c.fill(0, o.v, o.dst...), ref.Fill(o.dst, o.v)
		} else {
			got, want = c.copy(0, o.dst, o.src), ref.Copy(o.dst, o.src)
		}
		if (got != nil) != o.fails || (want != nil) != o.fails {
			t.Fatalf("%s: node %v, sim device %v; want an error: %v", o.name, got, want, o.fails)
		}
		for _, fr := range f {
			for off := uint64(0); off < FrameSize; off += api.MaxChunk {
				xs := []api.Extent{ext(fr, off, api.MaxChunk)}
				var w []byte
				_ = ref.Read(xs, func(parts ...[]byte) error { w = bytes.Clone(parts[0]); return nil })
				if g := c.mustRead(0, xs...); !bytes.Equal(g, w) {
					i := 0
					for g[i] == w[i] {
						i++
					}
					t.Fatalf("%s: byte %#x of frame %#x is %#x, want %#x", o.name, off+uint64(i), fr, g[i], w[i])
				}
			}
		}
	}
}

// TestExtentCursor: the pieces an extentCursor hands out, in order, are the
// bytes of its extents, each piece as long as asked for or all that is
// left, and every extent, empty ones too, is handed out.
func TestExtentCursor(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		xs := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) api.Extent {
			return api.Extent{Addr: rapid.Uint64Range(0, 1<<20).Draw(t, "addr"), Len: rapid.Uint64Range(0, 100).Draw(t, "len")}
		}), 0, 8).Draw(t, "extents")
		orig := slices.Clone(xs)
		bytesOf := func(xs []api.Extent) (out []uint64) {
			for _, x := range xs {
				for i := range x.Len {
					out = append(out, x.Addr+i)
				}
			}
			return out
		}
		c := newExtentCursor(xs)
		var got []uint64
		empties := 0
		for {
			left := c.left
			n := rapid.Uint64Range(1, 120).Draw(t, "n")
			piece := c.next(n)
			if l := api.ExtentsLen(piece); l != min(n, left) || c.left != left-l {
				t.Fatalf("next(%d) with %d left: %v, %d bytes, %d left", n, left, piece, l, c.left)
			}
			got = append(got, bytesOf(piece)...)
			for _, x := range piece {
				if x.Len == 0 {
					empties++
				}
			}
			if c.left == 0 {
				break
			}
		}
		if want := bytesOf(orig); !slices.Equal(got, want) {
			t.Fatalf("pieces of %v hold bytes %v, want %v", orig, got, want)
		}
		wantEmpties := 0
		for _, x := range orig {
			if x.Len == 0 {
				wantEmpties++
			}
		}
		if empties != wantEmpties {
			t.Fatalf("pieces of %v hold %d empty extents, want %d", orig, empties, wantEmpties)
		}
		if !slices.Equal(xs, orig) {
			t.Fatalf("the cursor changed its caller's extents: %v, were %v", xs, orig)
		}
	})
}
