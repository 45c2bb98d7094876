package accelerator

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"maps"
	"runtime"
	"slices"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// keptFrames lists the frames the node retains, oldest first.
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
// where it holds its contents alone on its device and maps memory of its
// own, and nothing with retention off; it reclaims the oldest retained
// frames first, those with aliases last, and no more than it needs.
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
	if k := keptFrames(tn); !slices.Equal(k, []uint64{x, y, z}) {
		t.Fatalf("retained %#x after an alias was freed, want %#x", k, []uint64{x, y, z})
	}

	// Every free frame, and one more: x goes (oldest, no alias); one more
	// again: z, as y has an alias.
	_, free, _ := tn.node.devs[0].frames.usage()
	b.alloc(0, uint32(free+1))
	if k := keptFrames(tn); !slices.Equal(k, []uint64{y, z}) {
		t.Fatalf("retained %#x after reclaiming one, want %#x", k, []uint64{y, z})
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
// retained. Run with -race.
func TestNodeReclaimRaces(t *testing.T) {
	tn := startSim(t, 2, 6*FrameSize)
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
	reclaims, hits := 0, 0
	reclaim := func() error {
		_, free, retained := tn.node.devs[0].frames.usage()
		if retained == 0 {
			runtime.Gosched()
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
	t.Logf("%d dedup hits, %d allocations that reclaimed, over %d seal-free rounds", hits, reclaims, rounds)
	wantOnlyRetained(t, tn, 1)
}
