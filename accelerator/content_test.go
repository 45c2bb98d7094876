package accelerator

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// readFrame reads the whole frame f of dev, a chunk at a time.
func (c *client) readFrame(dev uint32, f uint64) []byte {
	c.t.Helper()
	return append(c.mustRead(dev, ext(f, 0, FrameSize/2)), c.mustRead(dev, ext(f, FrameSize/2, FrameSize/2))...)
}

// frameWith returns the contents of a frame filled with v and then p at off.
func frameWith(v byte, off int, p []byte) []byte {
	b := bytes.Repeat([]byte{v}, FrameSize)
	copy(b[off:], p)
	return b
}

// TestNodeSeal: a sealed frame refuses every write, on every path, with a
// permission error naming it; it can still be read, copied from and read
// by kernels. Only a frame's holder may seal it; sealing twice is a no-op;
// freeing unseals it and takes it out of the index.
func TestNodeSeal(t *testing.T) {
	tn := startNode(t)
	c := tn.connect(t, "acme")
	f := c.alloc(0, 2)
	if f[1] != f[0]+FrameSize {
		t.Fatalf("fresh node granted scattered frames %#x", f)
	}
	o := tn.connect(t, "rival")
	theirs := o.alloc(0, 1)[0]
	p := pattern(3, 4096)
	c.mustWrite(0, []api.Extent{ext(f[0], 0, 4096)}, p)
	for range 2 {
		if err := c.seal(0, f[0]); err != nil {
			t.Fatal(err)
		}
		if st := tn.node.ContentStats(); st.Sealed != 1 {
			t.Fatalf("after sealing one frame: %+v", st)
		}
	}

	sealed := []api.Extent{ext(f[0], 100, 16)}
	spanning := []api.Extent{ext(f[0], FrameSize-8, 16)} // into f[1], which is not sealed
	mine := []api.Extent{ext(f[1], 64, 16)}
	f32s := func(v float32) []byte { return f32Bytes(v, v, v, v) }
	denied := []string{hex(f[0]), "sealed"}
	for _, tc := range []badCase{
		{"write", func() error { return c.write(0, sealed, make([]byte, 16)) }, api.ErrPermissionDenied, denied},
		{"write into the next frame too", func() error { return c.write(0, spanning, make([]byte, 16)) }, api.ErrPermissionDenied, denied},
		{"write behind a launch", func() error {
			l := c.rpc.Go(api.OpNodeLaunch, nil, api.Encode(&api.NodeLaunch{Kernel: "fill_f32", Args: []api.NodeArg{bufArg(ext(f[1], 0, FrameSize)), i64Arg(FrameSize / 4), f32Arg(0)}}))
			w := c.rpc.Go(api.OpNodeWrite, nil, api.Encode(&api.NodeAccess{Extents: sealed, Payload: f32s(1)}))
			return errors.Join(l.Wait(), w.Wait())
		}, api.ErrPermissionDenied, denied},
		{"fill", func() error { return c.fill(0, 1, sealed...) }, api.ErrPermissionDenied, denied},
		{"copy into", func() error { return c.copy(0, sealed, mine) }, api.ErrPermissionDenied, append([]string{"copy destination"}, denied...)},
		{"launch writing it", func() error { return c.launch(0, "fill_f32", bufArg(sealed...), i64Arg(4), f32Arg(1)) }, api.ErrPermissionDenied, append([]string{"argument 0 (x)"}, denied...)},
		{"launch reading and writing it", func() error {
			return c.launch(0, "saxpy", i64Arg(4), f32Arg(1), bufArg(mine...), bufArg(spanning...))
		}, api.ErrPermissionDenied, append([]string{"argument 3 (y)"}, denied...)},
		{"batched write", func() error {
			return c.batch(cmd(api.OpNodeFill, &api.NodeAccess{Extents: mine}), cmd(api.OpNodeWrite, &api.NodeAccess{Extents: sealed, Payload: f32s(1)}))
		}, api.ErrPermissionDenied, append([]string{"command 1 (node-write)"}, denied...)},
		{"dedup into it", func() error { _, err := c.dedup(0, f[:1], sha256.Sum256(nil)); return err }, api.ErrPermissionDenied, denied},
		{"seal another's frame", func() error { return c.seal(0, theirs) }, api.ErrPermissionDenied, []string{hex(theirs)}},
		{"seal a free frame", func() error { return c.seal(0, 20*FrameSize) }, api.ErrPermissionDenied, []string{hex(20 * FrameSize)}},
		{"seal on the wrong device", func() error { return c.seal(1, f[1]) }, api.ErrPermissionDenied, []string{"sim1", hex(f[1])}},
		{"seal unaligned", func() error { return c.seal(0, f[1]+4096) }, api.ErrInvalidAddress, []string{hex(f[1] + 4096)}},
		{"seal named twice", func() error { return c.seal(0, f[1], f[1]) }, api.ErrInvalidArgument, []string{"named twice"}},
		{"seal on no device", func() error { return c.seal(9, f[1]) }, api.ErrInvalidArgument, []string{"device 9"}},
		{"seal truncated", func() error { _, err := c.rpc.Call(api.OpNodeSeal, nil, []byte{0, 0}); return err }, api.ErrProtocol, []string{"node-seal"}},
	} {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.run(), tc.sentinel, tc.names...) })
		c.roundTrip(0, f[1])
	}

	// Reading is allowed, by requests and kernels.
	if got := c.mustRead(0, ext(f[0], 0, 4096)); !bytes.Equal(got, p) {
		t.Fatal("sealed frame reads back otherwise")
	}
	if err := c.copy(0, mine, sealed); err != nil {
		t.Fatalf("copy from a sealed frame: %v", err)
	}
	if err := c.launch(0, "saxpy", i64Arg(4), f32Arg(1), bufArg(sealed...), bufArg(mine...)); err != nil {
		t.Fatalf("launch reading a sealed frame: %v", err)
	}
	if got := c.readFrame(0, f[0]); !bytes.Equal(got, frameWith(0, 0, p)) {
		t.Fatal("the sealed frame changed")
	}
	if st := tn.node.ContentStats(); st.Sealed != 1 {
		t.Fatalf("after refused seals: %+v", st)
	}

	// Freed, the node retains it; an allocation that needs it reclaims it,
	// and it is writable for its next holder.
	if err := c.free(0, f[0]); err != nil {
		t.Fatal(err)
	}
	wantOnlyRetained(t, tn, 1)
	next := o.alloc(0, testFrames-2) // every free frame, f[0] among them
	wantOnlyRetained(t, tn, 0)
	if !slices.Contains(next, f[0]) {
		t.Fatalf("frames %#x lack %#x", next, f[0])
	}
	if got := o.mustRead(0, ext(f[0], 0, 4096)); !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("a freed sealed frame was not scrubbed")
	}
	o.roundTrip(0, f[0])
}

// TestNodeDedup: a dedup fills frames with the contents of frames sealed by
// any connection on any device, byte for byte, and leaves the others; on a
// node that retains no frames, a sealed frame that is freed, or whose
// connection ends, is found no more.
func TestNodeDedup(t *testing.T) {
	tn := startNode(t)
	tn.node.SetRetention(false)
	a := tn.connect(t, "alice")
	src := a.alloc(0, 1)[0]
	if err := a.fill(0, 0x11, ext(src, 0, FrameSize)); err != nil {
		t.Fatal(err)
	}
	a.mustWrite(0, []api.Extent{ext(src, 12345, 4096)}, pattern(7, 4096))
	want := frameWith(0x11, 12345, pattern(7, 4096))
	if err := a.seal(0, src); err != nil {
		t.Fatal(err)
	}
	hash := sha256.Sum256(want)
	miss := sha256.Sum256([]byte("nobody sealed this"))

	b := tn.connect(t, "bob")
	b1 := b.alloc(1, 1)[0]
	b0 := b.alloc(0, 2)
	if err := b.fill(0, 0x22, ext(b0[1], 0, FrameSize)); err != nil {
		t.Fatal(err)
	}
	if hit, err := b.dedup(1, []uint64{b1}, hash); err != nil || !slices.Equal(hit, []bool{true}) {
		t.Fatalf("dedup across devices: %v, %v", hit, err)
	}
	if hit, err := b.dedup(0, b0, hash, miss); err != nil || !slices.Equal(hit, []bool{true, false}) {
		t.Fatalf("dedup hit and miss: %v, %v", hit, err)
	}
	if !bytes.Equal(b.readFrame(1, b1), want) || !bytes.Equal(b.readFrame(0, b0[0]), want) {
		t.Fatal("a dedup hit did not copy the sealed frame exactly")
	}
	if !bytes.Equal(b.readFrame(0, b0[1]), bytes.Repeat([]byte{0x22}, FrameSize)) {
		t.Fatal("a dedup miss changed its frame")
	}
	if st := tn.node.ContentStats(); st != (ContentStats{Sealed: 1, Lookups: 3, Hits: 2, Aliased: 1, Saved: FrameSize}) {
		t.Fatalf("stats %+v", st)
	}
	// The copies are the holder's own: writable until sealed.
	b.roundTrip(0, b0[0])

	raw := func(m *api.NodeDedup) func() error {
		return func() error { _, err := b.call(api.OpNodeDedup, m); return err }
	}
	whole := func(f uint64) api.Extent { return ext(f, 0, FrameSize) }
	for _, tc := range []badCase{
		{"more hashes than frames", raw(&api.NodeDedup{Dst: []api.Extent{whole(b0[1])}, Hashes: [][32]byte{hash, miss}}), api.ErrInvalidArgument, []string{"1 extents", "2 hashes"}},
		{"part of a frame", raw(&api.NodeDedup{Dst: []api.Extent{ext(b0[1], 0, FrameSize-1)}, Hashes: [][32]byte{hash}}), api.ErrInvalidArgument, []string{"extent 0", hex(b0[1])}},
		{"unaligned", raw(&api.NodeDedup{Dst: []api.Extent{whole(b0[1]), ext(b0[1], 4096, FrameSize)}, Hashes: [][32]byte{miss, hash}}), api.ErrInvalidArgument, []string{"extent 1", hex(b0[1] + 4096)}},
		{"another's frame", raw(&api.NodeDedup{Dst: []api.Extent{whole(b0[1]), whole(src)}, Hashes: [][32]byte{miss, hash}}), api.ErrPermissionDenied, []string{hex(src)}},
		{"no such device", raw(&api.NodeDedup{Device: 4, Dst: []api.Extent{whole(b0[1])}, Hashes: [][32]byte{hash}}), api.ErrInvalidArgument, []string{"device 4"}},
		{"truncated", func() error { _, err := b.rpc.Call(api.OpNodeDedup, nil, []byte{0, 0, 0, 0, 1}); return err }, api.ErrProtocol, []string{"node-dedup"}},
	} {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.run(), tc.sentinel, tc.names...) })
		if !bytes.Equal(b.readFrame(0, b0[1]), bytes.Repeat([]byte{0x22}, FrameSize)) {
			t.Fatalf("after %q: the frame changed", tc.name)
		}
	}

	// Two sealed frames of one content: freeing one leaves the other.
	if err := b.seal(1, b1); err != nil {
		t.Fatal(err)
	}
	if err := a.free(0, src); err != nil {
		t.Fatal(err)
	}
	if hit, err := b.dedup(0, b0[1:], hash); err != nil || !hit[0] {
		t.Fatalf("dedup with one of two sealed copies freed: %v, %v", hit, err)
	}
	// A connection that ends takes its sealed frames out of the index.
	b.rpc.Close()
	tn.waitUsed(t, [testDevices]uint64{})
	if st := tn.node.ContentStats(); st.Sealed != 0 {
		t.Fatalf("after every holder left: %+v", st)
	}
	if hit, err := a.dedup(0, a.alloc(0, 1), hash); err != nil || hit[0] {
		t.Fatalf("dedup after every sealed copy left: %v, %v", hit, err)
	}
}

// TestNodeDedupRacesFree: dedups from a frame that its holder seals and
// frees over and over see its whole contents or miss, never a frame being
// scrubbed, whether the node retains freed sealed frames or not. The race
// must happen: some dedups copy a frame while a free of it is under way.
// The holder frees each frame once a dedup began to copy it, and every
// other such copy waits for the free to begin.
func TestNodeDedupRacesFree(t *testing.T) {
	withRetention(t, func(t *testing.T, tn *testNode) {
		var frees raceCount // dedups that copied a frame while a free of it was under way
		w := watchRaces(t, tn, func(w *raceWatch) {
			w.onCopy = func(src frameRef) {
				if tn.node.content.sealer[src] == "" {
					return // retained: nobody frees it
				}
				w.meet(&frees, func() bool { return w.freeBegun(src) })
			}
		})
		a := tn.connect(t, "alice")
		b := tn.connect(t, "bob")
		dst := b.alloc(1, 1)
		want := bytes.Repeat([]byte{0x5a}, FrameSize)
		const rounds = 30
		hits := 0
		copied := func(f uint64) error {
			w.await(func() bool { return w.copied(frameRef{tn.node.devs[0], f}) }, racePatience)
			return nil
		}
		race(t, func() error { return churnSealed(a, rounds, copied) }, dedupRound(b, 1, dst, want, &hits))
		c := w.count(&frees)
		t.Logf("%d dedup hits over %d seal-free rounds; a copy and a free of its source %v", hits, rounds, c)
		if c.met == 0 {
			t.Errorf("the race never happened: no dedup copied a frame while a free of it was under way (%v)", c)
		}
		wantOnlyRetained(t, tn, 1)
	})
}

// churnSealed has c allocate a frame of device 0, fill it with 0x5a, seal
// it, check it (if check is set) and free it, rounds times.
func churnSealed(c *client, rounds int, check func(frame uint64) error) error {
	for i := range rounds {
		f, err := c.tryAlloc(0, 1)
		if err == nil {
			err = c.fill(0, 0x5a, ext(f[0], 0, FrameSize))
		}
		if err == nil {
			err = c.seal(0, f[0])
		}
		if err == nil && check != nil {
			err = check(f[0])
		}
		if err == nil {
			err = c.free(0, f[0])
		}
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
	}
	return nil
}

// holdsFrame checks, in two reads of half a frame each, that frame of
// device dev holds want (FrameSize bytes).
func holdsFrame(c *client, dev uint32, frame uint64, want []byte) error {
	for _, half := range []uint64{0, FrameSize / 2} {
		got, err := c.read(dev, ext(frame, half, FrameSize/2))
		if err != nil {
			return err
		}
		if !bytes.Equal(got, want[half:half+FrameSize/2]) {
			return fmt.Errorf("frame %#x holds other bytes at offset %d", frame, half)
		}
	}
	return nil
}
