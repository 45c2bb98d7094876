package mediator_test

import (
	"testing"

	"github.com/vgpu/vgpu/mediator"
)

// A session with no journal (a mediator with no state directory) keeps
// every byte across a drop of its node connection, as a journaled one
// does: its connection attached all the same, so the node parked its
// frames, and the session reclaimed them once it redialled.
func TestNodeDropReclaimsUnjournaledMemory(t *testing.T) {
	var cut *cutter
	sys := startWith(t, 64<<20, func(c *mediator.Config) {
		c.StateDir = ""
		cut = newCutter(t, c.Nodes[0])
		c.Nodes[0] = cut.addr
	})
	c := sys.dial(t, "a", 1)
	ps, data := writeBuffers(t, c, 4<<20, 4096, 3<<20+17)

	if n := cut.cut(); n != 1 {
		t.Fatalf("%d attached connections cut, want the session's 1", n)
	}
	st := c.Stream()
	for i, p := range ps {
		if err := readBack(t, st, p, data[i]); err != nil {
			t.Fatalf("buffer %d after the drop: %v", i, err)
		}
	}
	if n := mediator.NodeReclaims(sys.med, c.Session()); n != 1 {
		t.Fatalf("%d node connections reclaimed, want 1", n)
	}
	// The reclaimed connection goes on attached: a buffer made after the
	// reclaim survives a second drop too.
	fresh, fdata := writeBuffers(t, c, 2<<20)
	if n := cut.cut(); n != 1 {
		t.Fatalf("%d attached connections cut the second time, want the reclaimed 1", n)
	}
	for i, p := range append(ps, fresh...) {
		if err := readBack(t, st, p, append(data, fdata...)[i]); err != nil {
			t.Fatalf("buffer %d after the second drop: %v", i, err)
		}
	}
	if n := mediator.NodeReclaims(sys.med, c.Session()); n != 2 {
		t.Fatalf("%d node connections reclaimed, want 2", n)
	}
}
