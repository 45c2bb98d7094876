package mediator

import (
	"errors"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// A session restored by a mediator that no longer has the node its
// import came from keeps that import ended, naming the node; its journal
// compacts to a snapshot whose import record still names that node (a
// compaction must not look the node up among the mediator's), and a
// restore from the snapshot fails the range's use the same way.
func TestCompactionKeepsImportOfGoneNode(t *testing.T) {
	lowerJournalBounds(t, 2<<10, 32<<20)
	ha := newHost(t)
	hb := newHost(t) // a node of its own, which its sessions are placed on
	ha.start()
	both := func(c *Config) { c.Nodes = []string{hb.node, ha.node} }
	hb.startWith(both)
	b := hb.dial(hb.serveHost())
	a := ha.dial(ha.serveHost())
	const n = 64 << 10
	_, q, _, _ := sharedBetween(t, a, b, n)
	if _, err := readAll(b, q, n); err != nil {
		t.Fatal(err)
	}
	hb.crash()
	if out := hb.start(); !strings.Contains(out, "session restored") { // ha's node left out
		t.Fatalf("not restored without the import's node:\n%s", out)
	}
	hb.serveHost()
	gone := func(when string) {
		t.Helper()
		_, err := readAll(b, q, 1)
		if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), ha.node) {
			t.Fatalf("%s, the import from node %s: %v, want unavailable naming it", when, ha.node, err)
		}
	}
	gone("restored without its node")
	if x := compactedWith(t, hb, b, opImport); x.Node != ha.node || x.VA != uint64(q) || x.Size != n {
		t.Fatalf("the snapshot's import %+v, want %d bytes at %#x from node %s", x, n, uint64(q), ha.node)
	}
	hb.crash()
	if out := hb.start(); !strings.Contains(out, "session restored") {
		t.Fatalf("not restored from the snapshot:\n%s", out)
	}
	hb.serveHost()
	gone("restored from the snapshot")
}

// Imports go at ever higher addresses for as long as a session lives,
// restarts of its mediator included: a snapshot that names only the live
// imports still says where the next one goes, so a restored session never
// places an import where a freed one was, which the tenant may still
// point at.
func TestCompactionKeepsImportsAfterFreedOnes(t *testing.T) {
	lowerJournalBounds(t, 2<<10, 32<<20)
	_, hb, a, b := twoHosts(t, nil)
	const n = 64 << 10
	_, q, _, sh := sharedBetween(t, a, b, n)
	freed, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Free(freed); err != nil {
		t.Fatal(err)
	}
	if x := compactedWith(t, hb, b, opImport); x.VA != uint64(q) {
		t.Fatalf("the snapshot's import %+v, want the live one at %#x", x, uint64(q))
	}
	hb.crash()
	if out := hb.start(); !strings.Contains(out, "session restored") {
		t.Fatalf("not restored from the snapshot:\n%s", out)
	}
	hb.serveHost()
	if _, err := b.Stats(); err != nil { // the client resumes on a call it may retry
		t.Fatal(err)
	}
	again, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if again <= freed {
		t.Fatalf("an import after the restore at %#x, not past the freed one at %#x", uint64(again), uint64(freed))
	}
}
