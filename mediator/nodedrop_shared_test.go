package mediator_test

import (
	"slices"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// cutOne closes, from the node's side, the i-th of the connections that
// attached since the last cut (in the order they attached), and forgets
// it; the others stay.
func (c *cutter) cutOne(t *testing.T, i, want int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.attach) != want {
		t.Fatalf("%d attached connections to cut from, want %d", len(c.attach), want)
	}
	c.attach[i].Close()
	c.attach = slices.Delete(c.attach, i, i+1)
}

// Sessions sharing buffers keep them across a drop of their node
// connection, the node staying up. The exporter's drop: the object lives
// on with the parked frames, the importer writes on through the cut, and
// the exporter's reclaimed connection serves the same object. The
// importer's drop: its imports are made again at the same addresses; the
// exporter writes meanwhile, and the importer reads it; a grant revoked
// during the cut ends only that import, typed, while the other goes on.
func TestNodeDropKeepsSharedBuffers(t *testing.T) {
	var cut *cutter
	sys := startWith(t, 64<<20, func(c *mediator.Config) {
		cut = newCutter(t, c.Nodes[0])
		c.Nodes[0] = cut.addr
	})
	a := sys.dial(t, "a", 1) // attaches first
	b := sys.dial(t, "b", 1)
	const n = 300 << 10 // five coherence pages, the last one short
	ps, data := writeBuffers(t, a, n, n)
	var shs []api.Shared
	for _, p := range ps {
		sh, err := a.Export(p, api.ModeCoherent, api.Grant{Tenant: "b", Write: true})
		if err != nil {
			t.Fatal(err)
		}
		shs = append(shs, sh)
	}
	var qs []client.Ptr
	for _, sh := range shs {
		q, info, err := b.Import(sh)
		if err != nil || info.Size != n {
			t.Fatalf("import: %+v, %v", info, err)
		}
		qs = append(qs, q)
	}
	sa, sb := a.Stream(), b.Stream()
	patch := func(st *client.Stream, at client.Ptr, i, off int, seed uint64, k int) {
		t.Helper()
		p := randomBytes(seed, k)
		st.CopyToDevice(at.Add(uint64(off)), p)
		if err := st.Synchronize(); err != nil {
			t.Fatalf("write %d at %d of buffer %d: %v", seed, off, i, err)
		}
		copy(data[i][off:], p)
	}
	for i, q := range qs {
		if err := readBack(t, sb, q, data[i]); err != nil { // its mediator caches every page
			t.Fatal(err)
		}
	}

	// The exporter's connection drops: the importer writes on, and the
	// exporter, once it reclaimed, reads that and writes back.
	cut.cutOne(t, 0, 2)
	patch(sb, qs[0], 0, 5, 1, 100<<10)
	for i, p := range ps {
		if err := readBack(t, sa, p, data[i]); err != nil {
			t.Fatalf("the exporter reads buffer %d after its drop: %v", i, err)
		}
	}
	if k := mediator.NodeReclaims(sys.med, a.Session()); k != 1 {
		t.Fatalf("the exporter reclaimed %d node connections, want 1", k)
	}
	patch(sa, ps[0], 0, 64<<10, 2, 10) // across a page boundary; the importer's copies are invalidated
	if err := readBack(t, sb, qs[0], data[0]); err != nil {
		t.Fatalf("the importer reads the exporter's write: %v", err)
	}

	// The importer's connection drops, and stays down while the exporter
	// writes and revokes its grant to the second buffer.
	cut.refuse.Store(true)
	cut.cutOne(t, 0, 2) // the importer's; the exporter's reclaimed one attached after it
	patch(sa, ps[0], 0, 250<<10, 3, 50<<10)
	if err := a.Revoke(ps[1], "b"); err != nil {
		t.Fatal(err)
	}
	cut.refuse.Store(false)
	if err := readBack(t, sb, qs[0], data[0]); err != nil {
		t.Fatalf("the importer reads after its drop: %v", err)
	}
	if k := mediator.NodeReclaims(sys.med, b.Session()); k != 1 {
		t.Fatalf("the importer reclaimed %d node connections, want 1", k)
	}
	got := make([]byte, n)
	sb.CopyFromDevice(got, qs[1])
	wantErr(t, sb.Synchronize(), api.ErrPermissionDenied, "after its node connection dropped", "has no grant")
	patch(sb, qs[0], 0, 1000, 4, 70<<10)
	if err := readBack(t, sa, ps[0], data[0]); err != nil {
		t.Fatalf("the exporter reads the importer's write after its drop: %v", err)
	}
	if err := readBack(t, sa, ps[1], data[1]); err != nil {
		t.Fatalf("the exporter's revoked buffer: %v", err)
	}
	for _, q := range qs {
		if err := b.Free(q); err != nil {
			t.Fatalf("free import %#x: %v", q, err)
		}
	}
	for _, p := range ps {
		if err := a.Free(p); err != nil {
			t.Fatalf("free %#x: %v", p, err)
		}
	}
}
