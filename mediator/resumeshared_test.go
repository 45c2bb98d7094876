package mediator

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// sibling is another host in front of h's node, as a second machine's
// mediator would be, with a directory (state, sockets) of its own.
func (h *host) sibling() *host {
	h.t.Helper()
	tmp, err := os.MkdirTemp("", "vgpu")
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { os.RemoveAll(tmp) })
	o := &host{t: h.t, node: h.node, sim: h.sim, dir: tmp, quota: filepath.Join(tmp, "q.toml"), log: &lockedBuffer{}}
	o.setQuota(restoreQuota)
	return o
}

// twoHosts starts two hosts in front of one node, as two machines'
// mediators (the first configured by setA, if not nil), and dials the
// tenant through each.
func twoHosts(t *testing.T, setA func(*Config)) (ha, hb *host, a, b *client.Client) {
	t.Helper()
	ha = newHost(t)
	hb = ha.sibling()
	if setA == nil {
		setA = func(*Config) {}
	}
	ha.startWith(setA)
	hb.start()
	return ha, hb, ha.dial(ha.serveHost()), hb.dial(hb.serveHost())
}

// readAll reads n bytes at p through c.
func readAll(c *client.Client, p client.Ptr, n int) ([]byte, error) {
	b := make([]byte, n)
	s := c.Stream()
	s.CopyFromDevice(b, p)
	return b, s.Synchronize()
}

// writeAt writes b at p through c and waits for it.
func writeAt(c *client.Client, p client.Ptr, b []byte) error {
	s := c.Stream()
	s.CopyToDevice(p, b)
	return s.Synchronize()
}

// A shared buffer's exporter and importer, in two mediators, each go on
// across their mediator's crash: the exporter's restarted mediator serves
// the same object (which the importer used meanwhile), the importer's
// imports it again at the same address, and every acknowledged write of
// either, before, during and after each crash, reads back through both.
// So do they across a handover of each. A grant revoked while the
// importer's mediator is down ends its restored import, typed; and a freed
// import and export stay freed across a crash.
func TestSharedBuffersSurviveCrashes(t *testing.T) {
	ha, hb, a, b := twoHosts(t, nil)
	const n = 300 << 10 // five coherence pages, the last one short
	p, q, data, _ := sharedBetween(t, a, b, n)
	patch := func(c *client.Client, at client.Ptr, off int, seed byte, k int) {
		t.Helper()
		b := pattern(seed, k)
		if err := writeAt(c, at.Add(uint64(off)), b); err != nil {
			t.Fatalf("write %d at %d: %v", seed, off, err)
		}
		copy(data[off:], b)
	}
	check := func(c *client.Client, at client.Ptr, who string) {
		t.Helper()
		got, err := readAll(c, at, n)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s reads the shared buffer: %v, equal %v", who, err, bytes.Equal(got, data))
		}
	}
	check(b, q, "the importer") // its mediator caches every page
	patch(b, q, 5, 2, 100<<10)
	check(a, p, "the exporter")

	// The exporter's mediator dies: the object lives on with the parked
	// frames, and the importer writes on.
	ha.crash()
	patch(b, q, 70<<10, 3, 200<<10)
	check(b, q, "the importer, the exporter's mediator down")
	if out := ha.start(); !strings.Contains(out, "session restored") {
		t.Fatalf("the exporter's session is not restored:\n%s", out)
	}
	ha.serveHost()
	check(a, p, "the exporter after its mediator's restart")
	patch(a, p, 64<<10, 4, 10) // across a page boundary; the importer's copies are invalidated
	check(b, q, "the importer after the exporter's write")

	// The importer's mediator dies, its cached copies with it: the
	// exporter's write waits out their leases, and the restarted
	// mediator imports again and reads from the node.
	hb.crash()
	patch(a, p, 250<<10, 5, 50<<10)
	out := hb.start()
	if !strings.Contains(out, "session restored") {
		t.Fatalf("the importer's session is not restored:\n%s", out)
	}
	hb.serveHost()
	before, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	check(b, q, "the importer after its mediator's restart")
	if after, _ := b.Stats(); after.SharedMisses-before.SharedMisses != 5 {
		t.Fatalf("the restored importer read %d pages from the node, want all 5 (its cache starts empty)", after.SharedMisses-before.SharedMisses)
	}
	patch(b, q, 0, 6, n)
	check(a, p, "the exporter after the restored importer's write")

	// A handover (an upgrade) of either is the same path as a crash.
	for _, h := range []*host{ha, hb} {
		if err := h.med.Handover(); err != nil {
			t.Fatal(err)
		}
		h.med = nil
		if out := h.start(); !strings.Contains(out, "session restored") {
			t.Fatalf("a session is not restored after a handover:\n%s", out)
		}
		h.serveHost()
	}
	patch(a, p, 1000, 7, 3000)
	check(b, q, "the importer after both handed over")
	patch(b, q, 3000, 8, 1000)
	check(a, p, "the exporter after both handed over")

	// A grant revoked while the importer's mediator is down: the restored
	// import fails as the revoked one would have.
	hb.crash()
	if err := a.Revoke(p, "shared"); err != nil {
		t.Fatal(err)
	}
	hb.start()
	hb.serveHost()
	if _, err := readAll(b, q, n); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("the importer reads after its grant was revoked while its mediator was down: %v, want permission denied", err)
	}
	check(a, p, "the exporter after the revocation")
	// Their ends are journaled: freed, they stay freed across a crash, and
	// the exporter's allocation is its own again.
	if err := b.Free(q); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(p); err != nil {
		t.Fatal(err)
	}
	ha.crash()
	hb.crash()
	ha.start()
	hb.start()
	ha.serveHost()
	hb.serveHost()
	for _, c := range []*client.Client{a, b} { // a read, sent again: it resumes the session
		if _, err := c.Stats(); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Free(q); !errors.Is(err, api.ErrInvalidAddress) {
		t.Fatalf("free of an import freed before the crash: %v, want invalid address", err)
	}
	if err := a.Free(p); !errors.Is(err, api.ErrInvalidAddress) {
		t.Fatalf("free of an export freed before the crash: %v, want invalid address", err)
	}
}

// An immutable export stays sealed and cached whole across both
// mediators' crash, and a versioned one keeps its published version: the
// restored importer reads the latest published version, and a publish
// after the restart reaches it at its next pin.
func TestSharedImmutableAndVersionedSurviveCrashes(t *testing.T) {
	ha, hb, a, b := twoHosts(t, nil)
	const n = 130 << 10
	export := func(mode api.Mode, seed byte) (client.Ptr, client.Ptr, []byte) {
		t.Helper()
		p, err := a.Malloc(0, n)
		if err != nil {
			t.Fatal(err)
		}
		data := pattern(seed, n)
		if err := writeAt(a, p, data); err != nil {
			t.Fatal(err)
		}
		sh, err := a.Export(p, mode, api.Grant{Tenant: "shared"})
		if err != nil {
			t.Fatal(err)
		}
		q, _, err := b.Import(sh)
		if err != nil {
			t.Fatal(err)
		}
		return p, q, data
	}
	pi, qi, fixed := export(api.ModeImmutable, 1)
	pv, qv, draft := export(api.ModeVersioned, 2)
	if _, err := a.Publish(pv); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pin(qv); err != nil {
		t.Fatal(err)
	}
	published := bytes.Clone(draft)
	ha.crash()
	hb.crash()
	ha.start()
	hb.start()
	ha.serveHost()
	hb.serveHost()
	for _, c := range []*client.Client{a, b} {
		if _, err := c.Stats(); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := readAll(b, qi, n); err != nil || !bytes.Equal(got, fixed) {
		t.Fatalf("the importer reads the immutable buffer after the crashes: %v", err)
	}
	if err := writeAt(a, pi, []byte("x")); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("a write of the immutable export after the crashes: %v, want permission denied", err)
	}
	if got, err := readAll(b, qv, n); err != nil || !bytes.Equal(got, published) {
		t.Fatalf("the importer reads the published version after the crashes: %v", err)
	}
	copy(draft, "after the crashes")
	if err := writeAt(a, pv, draft[:32]); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(b, qv, n); err != nil || !bytes.Equal(got, published) {
		t.Fatalf("the importer reads its pinned version while the draft changes: %v", err)
	}
	if _, err := a.Publish(pv); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pin(qv); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(b, qv, n); err != nil || !bytes.Equal(got, draft) {
		t.Fatalf("the importer reads the version published after the crashes: %v", err)
	}
}
