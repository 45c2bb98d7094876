package accelerator

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/vgpu/vgpu/accelerator/sim"
	"github.com/vgpu/vgpu/api"
)

// resident is the RAM device dev of tn's node holds now.
func (tn *testNode) resident(t *testing.T, dev int) uint64 {
	t.Helper()
	n, err := tn.node.devs[dev].Device.(*sim.Device).Resident()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// wantAliased checks the node's count of aliased frames.
func (tn *testNode) wantAliased(t *testing.T, n int) {
	t.Helper()
	if st := tn.node.ContentStats(); st.Aliased != n || st.Saved != uint64(n)*FrameSize {
		t.Fatalf("%d frames aliased, want %d: %+v", st.Aliased, n, st)
	}
	var sum int64
	for _, d := range tn.node.devs {
		sum += d.aliased.Load()
	}
	if sum != int64(n) {
		t.Fatalf("devices count %d aliased frames, the index %d", sum, n)
	}
}

// TestNodeDedupAliases: a dedup hit on the sealed frame's device stores the
// contents once: the tenant's frame maps the sealed frame's memory. Both
// read the same bytes; every write path gives the alias a copy of its own
// first, so no write reaches the source; freeing the source leaves its
// aliases their bytes, freeing an alias leaves the source.
func TestNodeDedupAliases(t *testing.T) {
	tn := startNode(t)
	tn.node.SetRetention(false) // a freed source retained: TestNodeRetainedSourceKeepsAliases
	a := tn.connect(t, "alice")
	src := a.alloc(0, 1)[0]
	want := frameWith(0x11, 4096, pattern(3, 8192))
	a.mustWrite(0, []api.Extent{ext(src, 0, FrameSize/2)}, want[:FrameSize/2])
	a.mustWrite(0, []api.Extent{ext(src, FrameSize/2, FrameSize/2)}, want[FrameSize/2:])
	if err := a.seal(0, src); err != nil {
		t.Fatal(err)
	}
	hash := sha256.Sum256(want)

	// 12 frames of four tenants (the test devices hold 32 frames).
	const per = 3
	tenants := map[string]*client{}
	frames := map[string][]uint64{}
	before := tn.resident(t, 0)
	for _, name := range []string{"bob", "carol", "dave", "erin"} {
		c := tn.connect(t, name)
		tenants[name] = c
		frames[name] = c.alloc(0, per)
		hit, err := c.dedup(0, frames[name], hash, hash, hash)
		if err != nil || hit[0] != true || hit[per-1] != true {
			t.Fatalf("%s: dedup: %v, %v", name, hit, err)
		}
	}
	after := tn.resident(t, 0)
	t.Logf("%d tenant frames deduplicated from one sealed frame: device RAM %d KiB before, %d KiB after (%+v)",
		4*per, before>>10, after>>10, tn.node.ContentStats())
	if after > before+64<<10 {
		t.Fatalf("aliasing %d frames grew the device's RAM from %d to %d bytes", 4*per, before, after)
	}
	tn.wantAliased(t, 4*per)
	for name, c := range tenants {
		for _, f := range frames[name] {
			if !bytes.Equal(c.readFrame(0, f), want) {
				t.Fatalf("%s: aliased frame %#x does not read the sealed bytes", name, f)
			}
		}
	}
	// The source is sealed: no write reaches it from its holder.
	wantErr(t, a.write(0, []api.Extent{ext(src, 0, 4)}, []byte{1, 2, 3, 4}), api.ErrPermissionDenied, hex(src))

	// Every write path to an alias writes a copy of its own.
	b, bf := tenants["bob"], frames["bob"]
	c, cf := tenants["carol"], frames["carol"]
	seven := bytes.Repeat([]byte{7}, 4096)
	writes := []struct {
		name  string
		c     *client
		frame uint64
		run   func() error
		at    uint64 // the bytes written
		p     []byte
	}{
		{"write", b, bf[0], func() error { return b.write(0, []api.Extent{ext(bf[0], 100, 4096)}, seven) }, 100, seven},
		{"fill", b, bf[1], func() error { return b.fill(0, 7, ext(bf[1], 100, 4096)) }, 100, seven},
		{"copy destination", b, bf[2], func() error {
			return b.copy(0, []api.Extent{ext(bf[2], 100, 4096)}, []api.Extent{ext(bf[0], 100, 4096)})
		}, 100, seven},
		{"launch", c, cf[0], func() error {
			return c.launch(0, "fill_f32", bufArg(ext(cf[0], 100, 4096)), i64Arg(1024), f32Arg(0))
		}, 100, make([]byte, 4096)},
		{"batched write", c, cf[1], func() error {
			return c.batch(cmd(api.OpNodeWrite, &api.NodeAccess{Extents: []api.Extent{ext(cf[1], FrameSize-4096, 4096)}, Payload: seven}))
		}, FrameSize - 4096, seven},
	}
	aliased := 4 * per
	for _, w := range writes {
		if err := w.run(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		aliased--
		tn.wantAliased(t, aliased)
		mine := bytes.Clone(want)
		copy(mine[w.at:], w.p)
		if !bytes.Equal(w.c.readFrame(0, w.frame), mine) {
			t.Fatalf("%s into an alias: the frame does not hold the source's bytes and the write", w.name)
		}
		if !bytes.Equal(a.readFrame(0, src), want) {
			t.Fatalf("%s into an alias reached the source", w.name)
		}
		for _, f := range frames["dave"] {
			if !bytes.Equal(tenants["dave"].readFrame(0, f), want) {
				t.Fatalf("%s into an alias reached another alias", w.name)
			}
		}
	}
	// A launch that only reads an alias leaves it aliased.
	if err := c.launch(0, "saxpy", i64Arg(4), f32Arg(1), bufArg(ext(cf[2], 0, 16)), bufArg(ext(cf[0], 0, 16))); err != nil {
		t.Fatal(err)
	}
	tn.wantAliased(t, aliased)

	// A dedup into an alias, a hit again: aliased again; a miss leaves it.
	if hit, err := b.dedup(0, bf[:1], hash); err != nil || !hit[0] {
		t.Fatalf("dedup again: %v, %v", hit, err)
	}
	aliased++
	if hit, err := b.dedup(0, bf[:1], sha256.Sum256(nil)); err != nil || hit[0] {
		t.Fatalf("dedup miss: %v, %v", hit, err)
	}
	tn.wantAliased(t, aliased)
	if !bytes.Equal(b.readFrame(0, bf[0]), want) {
		t.Fatal("a frame deduplicated again does not read the sealed bytes")
	}

	// Sealing an alias keeps it aliased; it is indexed, and dedups from
	// it alias to its source.
	d, df := tenants["dave"], frames["dave"]
	if err := d.seal(0, df[0]); err != nil {
		t.Fatal(err)
	}
	tn.wantAliased(t, aliased)
	if st := tn.node.ContentStats(); st.Sealed != 2 {
		t.Fatalf("after sealing an alias: %+v", st)
	}
	wantErr(t, d.write(0, []api.Extent{ext(df[0], 0, 4)}, []byte{1, 2, 3, 4}), api.ErrPermissionDenied, hex(df[0]))

	// Exporting an alias as a writable object gives it its own copy
	// first: the object's writes bypass the write paths.
	body, err := d.call(api.OpNodeExport, &api.NodeExport{Extents: []api.Extent{ext(df[1], 0, FrameSize)}, Mode: api.ModeCoherent})
	if err != nil {
		t.Fatalf("export an alias: %v", err)
	}
	aliased--
	tn.wantAliased(t, aliased)
	var obj api.NodeObject
	if err := api.Decode(body, &obj); err != nil {
		t.Fatal(err)
	}
	if _, err := d.call(api.OpNodeObjWrite, &api.NodeObjAccess{Object: obj.Object, Off: 0, Len: 4, Payload: []byte{9, 9, 9, 9}}); err != nil {
		t.Fatalf("write the object: %v", err)
	}
	if got := d.mustRead(0, ext(df[1], 0, 8)); !bytes.Equal(got, []byte{9, 9, 9, 9, 0x11, 0x11, 0x11, 0x11}) {
		t.Fatalf("the object reads %x after a write", got)
	}
	if !bytes.Equal(a.readFrame(0, src), want) {
		t.Fatal("a write to an exported alias reached the source")
	}

	// Freeing an alias leaves the source and the other aliases.
	e, ef := tenants["erin"], frames["erin"]
	if err := e.free(0, ef[0]); err != nil {
		t.Fatal(err)
	}
	aliased--
	tn.wantAliased(t, aliased)
	if !bytes.Equal(a.readFrame(0, src), want) || !bytes.Equal(e.readFrame(0, ef[1]), want) {
		t.Fatal("freeing an alias changed its source or another alias")
	}
	g := e.alloc(0, 1)[0]
	if !bytes.Equal(e.readFrame(0, g), make([]byte, FrameSize)) {
		t.Fatal("a freed alias was not scrubbed")
	}

	// Freeing the source gives every alias its bytes; the sealed alias
	// stays in the index as a frame of its own.
	if err := a.free(0, src); err != nil {
		t.Fatal(err)
	}
	tn.wantAliased(t, 0)
	for name, c := range tenants {
		for _, f := range frames[name] {
			if name == "erin" && f == ef[0] || name == "bob" && f != bf[0] || name == "carol" && f != cf[2] || name == "dave" && f == df[1] {
				continue
			}
			if !bytes.Equal(c.readFrame(0, f), want) {
				t.Fatalf("%s: frame %#x lost its bytes when the source was freed", name, f)
			}
		}
	}
	if st := tn.node.ContentStats(); st.Sealed != 1 {
		t.Fatalf("after freeing the source: %+v", st)
	}
	if hit, err := e.dedup(0, []uint64{g}, hash); err != nil || !hit[0] {
		t.Fatalf("dedup from the sealed former alias: %v, %v", hit, err)
	}
	tn.wantAliased(t, 1)
	// A connection that ends unaliases what it held and gives its aliases
	// copies; the node retains the sealed frame once it has no alias.
	d.rpc.Close()
	e.rpc.Close()
	b.rpc.Close()
	c.rpc.Close()
	tn.waitUsed(t, [testDevices]uint64{})
	tn.wantAliased(t, 0)
	wantOnlyRetained(t, tn, 1)
}

// TestNodeAliasRaces: dedups aliasing a frame that its holder seals and
// frees over and over, and writes to the alias, see the source's whole
// contents or miss, and never change the source, whether the node retains
// freed sealed frames or not. Run with -race. The race must happen: some
// frees take a frame that aliases of it map, before their holder writes
// them (every other chance, the dedup waits, before it aliases the frame,
// for a free of it to begin).
func TestNodeAliasRaces(t *testing.T) {
	withRetention(t, func(t *testing.T, tn *testNode) {
		var frees raceCount // dedups that aliased a frame while a free of it was under way
		freedAliased := 0   // frees that took a frame with live aliases
		w := watchRaces(t, tn, func(w *raceWatch) {
			w.onCopy = func(src frameRef) {
				if tn.node.content.sealer[src] == "" {
					return // retained: nobody frees it
				}
				w.meet(&frees, func() bool { return w.freeBegun(src) })
			}
			w.onFree = func(r frameRef) {
				if len(tn.node.content.aliases[r]) > 0 {
					w.note(&freedAliased)
				}
			}
		})
		a := tn.connect(t, "alice")
		b := tn.connect(t, "bob")
		dst := b.alloc(0, 2)
		want := bytes.Repeat([]byte{0x5a}, FrameSize)
		const rounds = 40
		hits := 0
		race(t, func() error {
			return churnSealed(a, rounds, func(f uint64) error {
				got, err := a.read(0, ext(f, 0, FrameSize/2))
				if err == nil && !bytes.Equal(got, want[:FrameSize/2]) {
					err = fmt.Errorf("a write to an alias reached its source")
				}
				return err
			})
		}, dedupRound(b, 0, dst, want, &hits)) // writes to both aliases, by two paths
		c, n := w.count(&frees), w.read(&freedAliased)
		t.Logf("%d dedup hits over %d seal-free rounds; %d frees took a frame with aliases; an alias and a free of its source %v", hits, rounds, n, c)
		if n == 0 {
			t.Errorf("the race never happened: no free took a frame while aliases of it were live (an alias and a free %v)", c)
		}
		tn.wantAliased(t, 0)
		wantOnlyRetained(t, tn, 1)
	})
}

// sealReport seals frames and returns the node's answer: which of them it
// stores once with another tenant's frame.
func (c *client) sealReport(dev uint32, frames ...uint64) []bool {
	c.t.Helper()
	body, err := c.call(api.OpNodeSeal, &api.NodeFrames{Device: dev, Frames: frames})
	if err != nil {
		c.t.Fatalf("seal %v: %v", frames, err)
	}
	var r api.NodeSealReply
	if err := api.Decode(body, &r); err != nil {
		c.t.Fatalf("seal %v: reply: %v", frames, err)
	}
	if len(r.StoredOnce) != len(frames) {
		c.t.Fatalf("seal of %d frames: %d answers", len(frames), len(r.StoredOnce))
	}
	return r.StoredOnce
}

// writeFrame fills frame f of dev with p, FrameSize bytes, in two writes.
func (c *client) writeFrame(dev uint32, f uint64, p []byte) {
	c.t.Helper()
	c.mustWrite(dev, []api.Extent{ext(f, 0, FrameSize/2)}, p[:FrameSize/2])
	c.mustWrite(dev, []api.Extent{ext(f, FrameSize/2, FrameSize/2)}, p[FrameSize/2:])
}

// TestNodeSealReportsStoredOnce: the seal's reply names exactly the frames
// that are aliased, when sealed, to a frame of another tenant: not frames
// with memory of their own, not a tenant's aliases of its own frames, not
// copies across devices, not aliases a write ended. The answer is how the
// frame is stored now, so a frame whose source was freed is no longer
// reported.
func TestNodeSealReportsStoredOnce(t *testing.T) {
	tn := startNode(t)
	tn.node.SetRetention(false) // retained frames: TestNodeDedupSourceRank
	x, y, z := frameWith(0x11, 100, pattern(1, 4096)), frameWith(0x22, 200, pattern(2, 4096)), frameWith(0x33, 300, pattern(3, 4096))
	hx, hy := sha256.Sum256(x), sha256.Sum256(y)
	want := func(who string, got []bool, want ...bool) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: stored once %v, want %v", who, got, want)
		}
	}

	// alice's frames have memory of their own.
	alice := tn.connect(t, "alice")
	src := alice.alloc(0, 2)
	alice.writeFrame(0, src[0], x)
	alice.writeFrame(0, src[1], y)
	want("alice's originals", alice.sealReport(0, src...), false, false)

	// bob's copies of alice's frames are aliases; his own content is not.
	bob := tn.connect(t, "bob")
	fb := bob.alloc(0, 3)
	if hit, err := bob.dedup(0, fb[:2], hx, hy); err != nil || !hit[0] || !hit[1] {
		t.Fatalf("bob: dedup: %v, %v", hit, err)
	}
	bob.writeFrame(0, fb[2], z)
	want("bob's aliases of alice's frames", bob.sealReport(0, fb...), true, true, false)
	want("bob's frames sealed again", bob.sealReport(0, fb...), true, true, false)

	// alice's aliases of her own frames, from this connection or another,
	// are not credit: only content another tenant sealed is.
	alice2 := tn.connect(t, "alice")
	for i, c := range []*client{alice, alice2} {
		f := c.alloc(0, 1)
		if hit, err := c.dedup(0, f, hx); err != nil || !hit[0] {
			t.Fatalf("alice %d: dedup: %v, %v", i, hit, err)
		}
		want(fmt.Sprintf("alice's connection %d, aliasing her own frame", i), c.sealReport(0, f...), false)
	}

	// A copy to another device is stored twice; so is an alias written
	// before its seal.
	carol := tn.connect(t, "carol")
	f1 := carol.alloc(1, 1)
	f0 := carol.alloc(0, 1)
	if hit, err := carol.dedup(1, f1, hx); err != nil || !hit[0] {
		t.Fatalf("carol: dedup on device 1: %v, %v", hit, err)
	}
	if hit, err := carol.dedup(0, f0, hy); err != nil || !hit[0] {
		t.Fatalf("carol: dedup on device 0: %v, %v", hit, err)
	}
	carol.mustWrite(0, []api.Extent{ext(f0[0], 0, 1)}, y[:1]) // the same byte: still a write
	want("carol's copy on device 1", carol.sealReport(1, f1...), false)
	want("carol's alias written before its seal", carol.sealReport(0, f0...), false)

	// Once alice frees her frames, bob's get copies of their bytes and are
	// no longer stored once; they stay sealed and indexed, so a dedup now
	// aliases to bob's: erin's copy is credit, bob's own one is not.
	if err := alice.free(0, src...); err != nil {
		t.Fatal(err)
	}
	want("bob's frames after their source went", bob.sealReport(0, fb...), false, false, false)
	erin := tn.connect(t, "erin")
	fe := erin.alloc(0, 1)
	fb2 := bob.alloc(0, 1)
	for _, d := range []struct {
		c *client
		f []uint64
	}{{erin, fe}, {bob, fb2}} {
		if hit, err := d.c.dedup(0, d.f, hx); err != nil || !hit[0] {
			t.Fatalf("dedup from bob's frame: %v, %v", hit, err)
		}
	}
	want("erin's alias of bob's frame", erin.sealReport(0, fe...), true)
	want("bob's alias of his own frame", bob.sealReport(0, fb2...), false)
	if !bytes.Equal(erin.readFrame(0, fe[0]), x) {
		t.Fatal("erin's frame does not read the sealed bytes")
	}
}
