package accelerator

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator/sim"
	"github.com/vgpu/vgpu/api"
)

// keptFrames lists the frames the node retains, least recently used first.
func keptFrames(tn *testNode) []uint64 {
	x := tn.node.content
	x.mu.Lock()
	defer x.mu.Unlock()
	refs := slices.SortedFunc(maps.Keys(x.kept), func(a, b frameRef) int { return int(x.kept[a]) - int(x.kept[b]) })
	out := make([]uint64, len(refs))
	for i, r := range refs {
		out[i] = r.addr
	}
	return out
}

// TestNodeRetention: a sealed frame whose holder's connection ends stays on
// the node, held by nobody: no connection may use it, the device counts it
// free, and a dedup of its contents (a tenant loading the same weights
// again) finds it, without credit for storing it once. An allocation that
// needs its memory reclaims it: the alias gets a copy, and the new holder
// finds zeros. Frames that were not sealed are scrubbed at once.
func TestNodeRetention(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alice")
	f := a.alloc(0, 2)
	want := frameWith(0x11, 4096, pattern(5, 8192))
	a.writeFrame(0, f[0], want)
	a.writeFrame(0, f[1], want)
	if err := a.seal(0, f[0]); err != nil {
		t.Fatal(err)
	}
	hash := sha256.Sum256(want)
	a.rpc.Close()
	tn.waitUsed(t, [testDevices]uint64{})
	wantOnlyRetained(t, tn, 1)
	if k := keptFrames(tn); !slices.Equal(k, f[:1]) {
		t.Fatalf("retained frames %#x, want %#x", k, f[:1])
	}
	if st := tn.node.Status().Devices[0]; st.Free != testFrames || st.Retained != 1 || st.Used != 0 {
		t.Fatalf("device status %+v: want every frame free, one retained", st)
	}

	b := tn.connect(t, "bob")
	mine := []api.Extent{ext(b.alloc(0, 1)[0], 0, 4)}
	for _, tc := range []badCase{
		{"read it", func() error { _, err := b.read(0, ext(f[0], 0, 4096)); return err }, api.ErrPermissionDenied, []string{hex(f[0])}},
		{"free it", func() error { return b.free(0, f[0]) }, api.ErrPermissionDenied, []string{hex(f[0])}},
		{"seal it", func() error { return b.seal(0, f[0]) }, api.ErrPermissionDenied, []string{hex(f[0])}},
		{"copy from it", func() error { return b.copy(0, mine, []api.Extent{ext(f[0], 0, 4)}) }, api.ErrPermissionDenied, []string{hex(f[0])}},
	} {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.run(), tc.sentinel, tc.names...) })
	}

	// Alice again, after a restart: her weights are on the node already.
	a2 := tn.connect(t, "alice")
	g := a2.alloc(0, 1)[0]
	if hit, err := a2.dedup(0, []uint64{g}, hash); err != nil || !hit[0] {
		t.Fatalf("dedup of a retained frame's contents: %v, %v", hit, err)
	}
	if !bytes.Equal(a2.readFrame(0, g), want) {
		t.Fatal("the dedup from a retained frame read otherwise")
	}
	tn.wantAliased(t, 1)
	if once := a2.sealReport(0, g); once[0] {
		t.Fatal("a frame aliased to a retained frame is reported stored once with another tenant")
	}

	// Bob takes every other frame of the device: the retained one is
	// reclaimed, scrubbed, and Alice's alias keeps its bytes.
	all := b.alloc(0, testFrames-2) // b holds one already
	if !slices.Contains(all, f[0]) || !slices.Contains(all, f[1]) {
		t.Fatalf("frames %#x lack the retained %#x or the scrubbed %#x", all, f[0], f[1])
	}
	for _, fr := range []uint64{f[0], f[1]} {
		if !bytes.Equal(b.readFrame(0, fr), make([]byte, FrameSize)) {
			t.Fatalf("frame %#x was not scrubbed before it changed hands", fr)
		}
	}
	tn.wantAliased(t, 0)
	if !bytes.Equal(a2.readFrame(0, g), want) {
		t.Fatal("the alias of a reclaimed frame lost its bytes")
	}
	if st := tn.node.ContentStats(); st.Retained != 0 || st.Sealed != 1 {
		t.Fatalf("after the reclaim: %+v, want only Alice's sealed frame", st)
	}
	if _, err := b.tryAlloc(0, 1); !errors.Is(err, api.ErrOutOfMemory) {
		t.Fatalf("allocation beyond the device: %v, want out of memory", err)
	}
}

// TestNodeRetentionChoices: the node retains a freed sealed frame only
// where it maps memory of its own and no other frame of its device but its
// aliases holds its contents, and nothing with retention off; it reclaims
// the least recently used retained frames first, those with aliases last,
// and no more than it needs.
func TestNodeRetentionChoices(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alice")
	contents := func(i byte) ([]byte, [32]byte) {
		p := bytes.Repeat([]byte{i}, FrameSize)
		return p, sha256.Sum256(p)
	}
	sealNew := func(c *client, i byte) uint64 {
		f := c.alloc(0, 1)[0]
		p, _ := contents(i)
		c.writeFrame(0, f, p)
		if err := c.seal(0, f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	x, y, z := sealNew(a, 1), sealNew(a, 2), sealNew(a, 3)
	dup := sealNew(a, 1) // the same bytes as x, on the same device
	for _, f := range []uint64{x, dup, y, z} {
		if err := a.free(0, f); err != nil {
			t.Fatal(err)
		}
	}
	// x is scrubbed, dup holding its bytes still; dup is retained.
	x = dup
	if k := keptFrames(tn); !slices.Equal(k, []uint64{x, y, z}) {
		t.Fatalf("retained %#x, want %#x: one copy of the same bytes", k, []uint64{x, y, z})
	}

	// An alias is not retained: its holder never had the memory.
	b := tn.connect(t, "bob")
	al := b.alloc(0, 1)
	_, hy := contents(2)
	if hit, err := b.dedup(0, al, hy); err != nil || !hit[0] {
		t.Fatalf("dedup of y: %v, %v", hit, err)
	}
	if err := b.seal(0, al[0]); err != nil {
		t.Fatal(err)
	}
	keep := b.alloc(0, 1) // aliases y until the end
	if hit, err := b.dedup(0, keep, hy); err != nil || !hit[0] {
		t.Fatalf("dedup of y: %v, %v", hit, err)
	}
	if err := b.free(0, al[0]); err != nil {
		t.Fatal(err)
	}
	if k := keptFrames(tn); !slices.Equal(k, []uint64{x, z, y}) { // y found last
		t.Fatalf("retained %#x after an alias was freed, want %#x", k, []uint64{x, z, y})
	}

	// A dedup that copies x to another device makes it the most recently
	// used: every free frame, and one more, takes z (the coldest without
	// an alias); one more again, x, as y has an alias.
	_, hx := contents(1)
	if hit, err := b.dedup(1, b.alloc(1, 1), hx); err != nil || !hit[0] {
		t.Fatalf("dedup of x: %v, %v", hit, err)
	}
	if k := keptFrames(tn); !slices.Equal(k, []uint64{z, y, x}) {
		t.Fatalf("retained %#x by last use, want %#x", k, []uint64{z, y, x})
	}
	_, free, _ := tn.node.devs[0].frames.usage()
	b.alloc(0, uint32(free+1))
	if k := keptFrames(tn); !slices.Equal(k, []uint64{y, x}) {
		t.Fatalf("retained %#x after reclaiming one, want %#x", k, []uint64{y, x})
	}
	b.alloc(0, 1)
	if k := keptFrames(tn); !slices.Equal(k, []uint64{y}) {
		t.Fatalf("retained %#x after reclaiming two, want %#x", k, []uint64{y})
	}
	_, err := b.tryAlloc(0, 2)
	wantErr(t, err, api.ErrOutOfMemory, "allocate 2 frames", "0 of 32 free, 1 more retained")
	if k := keptFrames(tn); !slices.Equal(k, []uint64{y}) {
		t.Fatalf("a refused allocation reclaimed frames: retained %#x", k)
	}
	b.alloc(0, 1)
	if k := keptFrames(tn); len(k) != 0 {
		t.Fatalf("retained %#x with the device full", k)
	}
	want, _ := contents(2)
	if !bytes.Equal(b.readFrame(0, keep[0]), want) {
		t.Fatal("the alias of a reclaimed frame lost its bytes")
	}

	// Off: nothing is retained.
	off := startNode(t)
	off.node.SetRetention(false)
	c := off.connect(t, "carol")
	if err := c.free(0, sealNew(c, 7)); err != nil {
		t.Fatal(err)
	}
	wantOnlyRetained(t, off, 0)
}

// TestNodeReclaimRaces: dedups of contents that their holder seals and
// frees over and over, on a device so small that another tenant's
// allocations keep reclaiming the retained frame, see the whole contents
// or miss; the reclaiming tenant finds only zeros. The dedups copy to
// another device, so that the frame has no alias when it is freed, and is
// retained. Run with -race. The race must happen: some reclaims take a
// frame that a dedup was copying when they began. The reclaiming tenant
// allocates once a dedup began to copy the retained frame, and every other
// such copy waits for a reclaim to begin.
func TestNodeReclaimRaces(t *testing.T) {
	tn := startSim(t, 2, 6*FrameSize)
	var met raceCount             // dedups that copied a retained frame while a reclaim of its device was under way
	copied := map[frameRef]bool{} // the frames they copied, until a reclaim takes them
	taken := 0                    // reclaims that took one
	keptCopies := 0               // dedups that began to copy a retained frame
	w := watchRaces(t, tn, func(w *raceWatch) {
		w.onCopy = func(src frameRef) {
			if _, ok := tn.node.content.kept[src]; !ok {
				return // held: the dedups race its free, not a reclaim
			}
			w.note(&keptCopies)
			if w.meet(&met, func() bool { return w.reclaimBegun(src.dev) }) {
				w.mu.Lock()
				copied[src] = true
				w.mu.Unlock()
			}
		}
		w.onReclaim = func(r frameRef) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if copied[r] {
				delete(copied, r)
				taken++
			}
		}
	})
	a := tn.connect(t, "alice")
	b := tn.connect(t, "bob")
	c := tn.connect(t, "carol")
	dst := b.alloc(1, 1)
	want := bytes.Repeat([]byte{0x5a}, FrameSize)
	const rounds = 40
	churn := func() error {
		for i := 0; i < rounds; {
			err := churnSealed(a, 1, nil)
			if errors.Is(err, api.ErrOutOfMemory) {
				continue // carol holds every frame for now
			}
			if err != nil {
				return err
			}
			i++
		}
		return nil
	}
	reclaims, hits, seen := 0, 0, 0
	reclaim := func() error {
		if _, _, retained := tn.node.devs[0].frames.usage(); retained == 0 {
			runtime.Gosched()
			return nil
		}
		// Once a dedup copies the retained frame, if one does soon.
		w.await(func() bool { return w.read(&keptCopies) > seen }, racePatience/5)
		seen = w.read(&keptCopies)
		_, free, retained := tn.node.devs[0].frames.usage()
		if retained == 0 {
			return nil
		}
		fs, err := c.tryAlloc(0, uint32(free+retained))
		if errors.Is(err, api.ErrOutOfMemory) {
			return nil // alice took a frame meanwhile
		}
		if err != nil {
			return err
		}
		reclaims++
		for _, f := range fs {
			if err := holdsFrame(c, 0, f, make([]byte, FrameSize)); err != nil {
				return err
			}
		}
		return c.free(0, fs...)
	}
	race(t, churn, reclaim, dedupRound(b, 1, dst, want, &hits))
	rc, n := w.count(&met), w.read(&taken)
	t.Logf("%d dedup hits, %d allocations that reclaimed, over %d seal-free rounds; %d reclaims took a frame a dedup copied as they began; a copy of a retained frame and a reclaim %v",
		hits, reclaims, rounds, n, rc)
	if n == 0 {
		t.Errorf("the race never happened: no reclaim took a retained frame that a dedup was copying as it began (a copy and a reclaim %v)", rc)
	}
	wantOnlyRetained(t, tn, 1)
}

// failingDevice is a sim device whose scrubs and unaliases fail while its
// switches say so, as a device reports an error.
type failingDevice struct {
	*sim.Device
	scrub, unalias *atomic.Bool
}

func (d failingDevice) Scrub(addr, n uint64) error {
	if d.scrub.Load() {
		return fmt.Errorf("%s: scrub failed: %w", d.Info().Name, api.ErrInternal)
	}
	return d.Device.Scrub(addr, n)
}

func (d failingDevice) Unalias(addr, n uint64, keep bool) error {
	if d.unalias.Load() {
		return fmt.Errorf("%s: unalias failed: %w", d.Info().Name, api.ErrInternal)
	}
	return d.Device.Unalias(addr, n, keep)
}

func startFailing(t *testing.T) (*testNode, failingDevice) {
	sd, err := sim.New(0, testMemory)
	if err != nil {
		t.Fatal(err)
	}
	d := failingDevice{sd, new(atomic.Bool), new(atomic.Bool)}
	return serveDevices(t, d), d
}

// sealedFrame has c allocate a frame of device 0, write p into it and seal it.
func sealedFrame(t *testing.T, c *client, p []byte) uint64 {
	t.Helper()
	f := c.alloc(0, 1)[0]
	c.writeFrame(0, f, p)
	if err := c.seal(0, f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestNodeReclaimScrubFails: a reclaim whose scrub fails answers with the
// error, gives the frame to nobody, and leaves it out of the index; the
// next reclaim scrubs it.
func TestNodeReclaimScrubFails(t *testing.T) {
	tn, dev := startFailing(t)
	a := tn.connect(t, "alice")
	want := bytes.Repeat([]byte{7}, FrameSize)
	f := sealedFrame(t, a, want)
	if err := a.free(0, f); err != nil {
		t.Fatal(err)
	}
	wantOnlyRetained(t, tn, 1)

	b := tn.connect(t, "bob")
	dev.scrub.Store(true)
	_, err := b.tryAlloc(0, testFrames)
	wantErr(t, err, api.ErrInternal, "scrub failed")
	if st := tn.node.ContentStats(); st.Sealed != 0 || st.Retained != 0 {
		t.Fatalf("after a failed reclaim: %+v, want the frame out of the index", st)
	}
	if hit, err := b.dedup(0, b.alloc(0, 1), sha256.Sum256(want)); err != nil || hit[0] {
		t.Fatalf("dedup from a frame whose reclaim failed: %v, %v", hit, err)
	}
	if st := tn.node.Status().Devices[0]; st.Retained != 1 || st.Free != testFrames-1 {
		t.Fatalf("device status %+v: want the frame counted retained", st)
	}
	dev.scrub.Store(false)
	got := b.alloc(0, testFrames-1)
	if !slices.Contains(got, f) {
		t.Fatalf("frames %#x lack the one a failed reclaim left", got)
	}
	if !bytes.Equal(b.readFrame(0, f), make([]byte, FrameSize)) {
		t.Fatal("a frame whose first scrub failed was handed out unscrubbed")
	}
}

// TestNodeFreeFailsRetainsNothing: a free that fails partway, or whose
// scrub fails, leaves every frame with its holder, those it retained first
// too, so that it can free them again.
func TestNodeFreeFailsRetainsNothing(t *testing.T) {
	tn, dev := startFailing(t)
	b := tn.connect(t, "bob")
	p := bytes.Repeat([]byte{2}, FrameSize)
	sealedFrame(t, b, p)
	a := tn.connect(t, "alice")
	alone := sealedFrame(t, a, bytes.Repeat([]byte{1}, FrameSize))
	al := a.alloc(0, 1)[0] // an alias of bob's frame: freeing it unaliases it
	if hit, err := a.dedup(0, []uint64{al}, sha256.Sum256(p)); err != nil || !hit[0] {
		t.Fatalf("dedup: %v, %v", hit, err)
	}
	dev.unalias.Store(true)
	wantErr(t, a.free(0, alone, al), api.ErrInternal, "unalias failed")
	if st := tn.node.ContentStats(); st.Retained != 0 || st.Sealed != 2 || st.Aliased != 1 {
		t.Fatalf("after a failed free: %+v, want both frames held as they were", st)
	}
	dev.unalias.Store(false)

	// So does one whose scrub fails, after it retained a frame.
	plain := a.alloc(0, 1)[0]
	dev.scrub.Store(true)
	wantErr(t, a.free(0, alone, plain), api.ErrInternal, "scrub failed")
	if st := tn.node.ContentStats(); st.Retained != 0 {
		t.Fatalf("after a free whose scrub failed: %+v, want nothing retained", st)
	}
	dev.scrub.Store(false)
	if err := a.free(0, alone, al, plain); err != nil {
		t.Fatalf("the free again: %v", err)
	}
	if k := keptFrames(tn); !slices.Equal(k, []uint64{alone}) {
		t.Fatalf("retained %#x, want %#x", k, alone)
	}
}

// TestNodeReclaimChargeHoldsNoOne: a tenant capped at the least cap pays
// for the reclaim its allocation needs with seconds of its turns, and
// another tenant's allocation, reclaiming too, does not wait for them.
func TestNodeReclaimChargeHoldsNoOne(t *testing.T) {
	tn := startSim(t, 1, testMemory)
	a := tn.connect(t, "alice")
	for i := range testFrames {
		f := sealedFrame(t, a, bytes.Repeat([]byte{byte(i + 1)}, FrameSize))
		if err := a.free(0, f); err != nil {
			t.Fatal(err)
		}
	}
	wantOnlyRetained(t, tn, testFrames)
	capped := tn.connectShare(t, "capped", 1, 0.001)
	done := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		if _, err := capped.tryAlloc(0, 8); err != nil {
			t.Error(err)
		}
		done <- time.Since(start)
	}()
	for _, _, retained := tn.node.devs[0].frames.usage(); retained > testFrames-8; _, _, retained = tn.node.devs[0].frames.usage() {
		time.Sleep(time.Millisecond)
	}
	c := tn.connect(t, "carol")
	t0 := time.Now()
	c.alloc(0, 5)
	took := time.Since(t0)
	cappedTook := <-done
	t.Logf("capped tenant's allocation of 8 retained frames: %v; another's of 5, beside it: %v", cappedTook, took)
	if took > cappedTook/2 {
		t.Errorf("an allocation beside a capped tenant's reclaim took %v, the capped one %v", took, cappedTook)
	}
}

// TestNodeDedupSourceRank: a dedup maps a frame of its own device rather
// than copy one of another, and of its device's, it maps one a tenant holds
// rather than one the node retains, which earns its holder's credit.
func TestNodeDedupSourceRank(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alice")
	p := bytes.Repeat([]byte{9}, FrameSize)
	hash := sha256.Sum256(p)
	other := a.alloc(1, 1)[0] // a held copy on device 1
	a.writeFrame(1, other, p)
	if err := a.seal(1, other); err != nil {
		t.Fatal(err)
	}
	if err := a.free(0, sealedFrame(t, a, p)); err != nil { // retained on device 0
		t.Fatal(err)
	}
	if k := keptFrames(tn); len(k) != 1 {
		t.Fatalf("retained %#x, want one frame", k)
	}
	b := tn.connect(t, "bob")
	first := b.alloc(0, 1)
	if hit, err := b.dedup(0, first, hash); err != nil || !hit[0] {
		t.Fatalf("dedup: %v, %v", hit, err)
	}
	tn.wantAliased(t, 1) // the retained frame, not a copy of device 1's
	if once := b.sealReport(0, first[0]); once[0] {
		t.Fatal("an alias of a retained frame is reported stored once with another tenant")
	}
	held := sealedFrame(t, a, p) // now alice holds a copy on device 0 too
	second := b.alloc(0, 1)
	if hit, err := b.dedup(0, second, hash); err != nil || !hit[0] {
		t.Fatalf("dedup: %v, %v", hit, err)
	}
	if once := b.sealReport(0, second[0]); !once[0] {
		t.Fatalf("an alias made with alice's frame %#x held on the device is not reported stored once", held)
	}
}

// TestNodeRetainedSourceKeepsAliases: when the tenant whose sealed frame
// others' frames map leaves, the node retains the frame and they keep
// mapping it, the bytes stored once still; without retention each gets a
// copy. A reclaim of the frame gives them their copies then.
func TestNodeRetainedSourceKeepsAliases(t *testing.T) {
	want := frameWith(0x3c, 777, pattern(4, 4096))
	hash := sha256.Sum256(want)
	const others = 3
	for _, retain := range []bool{true, false} {
		tn := startSim(t, 1, testMemory)
		tn.node.SetRetention(retain)
		a := tn.connect(t, "alice")
		sealedFrame(t, a, want)
		var frames []uint64
		var clients []*client
		for i := range others {
			c := tn.connect(t, fmt.Sprintf("tenant%d", i))
			f := c.alloc(0, 1)
			if hit, err := c.dedup(0, f, hash); err != nil || !hit[0] {
				t.Fatalf("dedup: %v, %v", hit, err)
			}
			frames, clients = append(frames, f[0]), append(clients, c)
		}
		before := tn.resident(t, 0)
		a.rpc.Close()
		tn.waitUsed(t, [testDevices]uint64{others * FrameSize})
		after := tn.resident(t, 0)
		t.Logf("retain %v: device RAM %d KiB before the first loader left, %d KiB after", retain, before>>10, after>>10)
		aliased, wantRAM := 0, before+(others-1)*FrameSize // copies in place of the one
		if retain {
			aliased, wantRAM = others, before
		}
		tn.wantAliased(t, aliased)
		if after != wantRAM {
			t.Errorf("retain %v: device RAM %d bytes after the first loader left, want %d", retain, after, wantRAM)
		}
		for i, c := range clients {
			if !bytes.Equal(c.readFrame(0, frames[i]), want) {
				t.Fatalf("retain %v: tenant %d's frame lost its bytes", retain, i)
			}
		}
		if !retain {
			continue
		}
		e := tn.connect(t, "erin")
		e.alloc(0, testFrames-others) // every frame left, the retained one too
		tn.wantAliased(t, 0)
		for i, c := range clients {
			if !bytes.Equal(c.readFrame(0, frames[i]), want) {
				t.Fatalf("tenant %d's frame lost its bytes when the frame it mapped was reclaimed", i)
			}
		}
	}
}

// TestNodeReclaimChargesAliasHolders: the copies a reclaim gives the aliases
// of a retained frame are device time of the aliases' holders, whose memory
// they become, not of the tenant whose allocation reclaimed the frame.
func TestNodeReclaimChargesAliasHolders(t *testing.T) {
	tn := startSim(t, 1, testMemory)
	a := tn.connect(t, "alice")
	b := tn.connect(t, "bob")
	const sources, per = 4, 3
	for i := range sources {
		p := bytes.Repeat([]byte{byte(i + 1)}, FrameSize)
		sealedFrame(t, a, p)
		hits, err := b.dedup(0, b.alloc(0, per), slices.Repeat([][32]byte{sha256.Sum256(p)}, per)...)
		if err != nil || !slices.Equal(hits, slices.Repeat([]bool{true}, per)) {
			t.Fatalf("dedup: %v, %v", hits, err)
		}
	}
	a.rpc.Close()
	tn.waitUsed(t, [testDevices]uint64{sources * per * FrameSize})
	tn.wantAliased(t, sources*per)
	c := tn.connect(t, "carol")
	bob0 := b.share(0, "bob").DeviceTime
	c.alloc(0, testFrames-sources*per) // every frame left, the retained ones too
	tn.wantAliased(t, 0)
	bobPaid := b.share(0, "bob").DeviceTime - bob0
	carolPaid := c.share(0, "carol").DeviceTime
	t.Logf("reclaiming %d frames with %d aliases each: %v charged to their holder, %v to the allocation", sources, per, bobPaid, carolPaid)
	if bobPaid <= carolPaid {
		t.Errorf("the aliases' holder was charged %v for %d copies, the reclaiming allocation %v", bobPaid, sources*per, carolPaid)
	}
}

// TestNodeRetentionLimit: a node bounded to two retained frames a device
// gives up the least recently used when a free retains a third, scrubbed;
// the others stay found.
func TestNodeRetentionLimit(t *testing.T) {
	tn := startNode(t)
	tn.node.LimitRetention(2*FrameSize + FrameSize/2) // two frames
	a := tn.connect(t, "alice")
	var frames []uint64
	var hashes [][32]byte
	for i := range 3 {
		p := bytes.Repeat([]byte{byte(i + 1)}, FrameSize)
		f := sealedFrame(t, a, p)
		if err := a.free(0, f); err != nil {
			t.Fatal(err)
		}
		frames, hashes = append(frames, f), append(hashes, sha256.Sum256(p))
	}
	if k := keptFrames(tn); !slices.Equal(k, frames[1:]) {
		t.Fatalf("retained %#x, want the last two of %#x", k, frames)
	}
	if st := tn.node.Status().Devices[0]; st.Retained != 2 || st.Free != testFrames {
		t.Fatalf("device status %+v: want 2 retained, every frame free", st)
	}
	b := tn.connect(t, "bob")
	dst := b.alloc(1, 3) // another device: copies, which change nothing retained
	hits, err := b.dedup(1, dst, hashes...)
	if err != nil || !slices.Equal(hits, []bool{false, true, true}) {
		t.Fatalf("dedups of the three contents: %v, %v, want the first given up", hits, err)
	}
	all := b.alloc(0, testFrames-2) // every frame but the two retained
	if !slices.Contains(all, frames[0]) || !bytes.Equal(b.readFrame(0, frames[0]), make([]byte, FrameSize)) {
		t.Fatalf("the frame given up, %#x, is not free and scrubbed (granted %#x)", frames[0], all)
	}
}

// TestNodeRetentionLimitRaces: two frees that each retain a frame past the
// bound at once give up one frame between them, not one each.
func TestNodeRetentionLimitRaces(t *testing.T) {
	tn := startSim(t, 1, testMemory)
	tn.node.LimitRetention(2 * FrameSize)
	a, b := tn.connect(t, "alice"), tn.connect(t, "bob")
	for i := range 2 {
		if err := a.free(0, sealedFrame(t, a, bytes.Repeat([]byte{byte(i + 1)}, FrameSize))); err != nil {
			t.Fatal(err)
		}
	}
	fa, fb := sealedFrame(t, a, bytes.Repeat([]byte{3}, FrameSize)), sealedFrame(t, b, bytes.Repeat([]byte{4}, FrameSize))
	d := tn.node.devs[0]
	d.allocMu.Lock() // as an allocation would: both frees retain, then wait to trim
	ca := a.rpc.Go(api.OpNodeFree, nil, api.Encode(&api.NodeFrames{Frames: []uint64{fa}}))
	cb := b.rpc.Go(api.OpNodeFree, nil, api.Encode(&api.NodeFrames{Frames: []uint64{fb}}))
	for deadline := time.Now().Add(5 * time.Second); len(keptFrames(tn)) < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			d.allocMu.Unlock()
			t.Fatalf("retained %#x: the two frees did not retain their frames", keptFrames(tn))
		}
	}
	d.allocMu.Unlock()
	if err := errors.Join(ca.Wait(), cb.Wait()); err != nil {
		t.Fatal(err)
	}
	if k := keptFrames(tn); len(k) != 2 || !slices.Contains(k, fa) || !slices.Contains(k, fb) {
		t.Fatalf("retained %#x after two frees past a bound of 2, want %#x and %#x", k, fa, fb)
	}
}

// TestNodeRetentionLimitSparesAliases: frames other tenants' frames map do
// not count toward the bound, and are not given up for it: that would copy
// their memory, not free it, at those tenants' cost.
func TestNodeRetentionLimitSparesAliases(t *testing.T) {
	tn := startSim(t, 1, testMemory)
	tn.node.LimitRetention(FrameSize)
	a, b := tn.connect(t, "alice"), tn.connect(t, "bob")
	var src []uint64
	for i := range 2 {
		p := bytes.Repeat([]byte{byte(i + 1)}, FrameSize)
		src = append(src, sealedFrame(t, a, p))
		hits, err := b.dedup(0, b.alloc(0, 2), sha256.Sum256(p), sha256.Sum256(p))
		if err != nil || !slices.Equal(hits, []bool{true, true}) {
			t.Fatalf("dedup: %v, %v", hits, err)
		}
	}
	before, bob := tn.resident(t, 0), b.share(0, "bob").DeviceTime
	if err := a.free(0, src...); err != nil {
		t.Fatal(err)
	}
	if k := keptFrames(tn); len(k) != 2 {
		t.Fatalf("retained %#x, want both frames, which bob's map", k)
	}
	tn.wantAliased(t, 4)
	if after := tn.resident(t, 0); after != before {
		t.Errorf("device RAM %d bytes after the free, %d before", after, before)
	}
	if paid := b.share(0, "bob").DeviceTime - bob; paid != 0 {
		t.Errorf("bob, who freed nothing, was charged %v", paid)
	}
}
