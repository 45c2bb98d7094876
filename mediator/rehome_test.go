package mediator_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// readWhenBack reads n bytes at p, trying again while that fails with
// ErrUnavailable (the exporter's mediator has not restored the object
// yet), for up to 10 s.
func readWhenBack(t *testing.T, c *client.Client, p client.Ptr, n int) []byte {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := read(t, c, p, n)
		if err == nil {
			return got
		}
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("read of %#x after the node restarted: %v", p, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// copiedIn is what tenant c has copied to the device so far.
func copiedIn(t *testing.T, c *client.Client) uint64 {
	t.Helper()
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st.CopiedIn
}

// A versioned buffer's published version outlives a restart of its home
// node: the exporter's mediator keeps a copy (VersionCopies) and restores
// it there under the same id, with the grants as they stand; the importer
// reads on, the same bytes, while neither tenant sends a byte again. A
// tenant revoked before the restart gets no grant back. The exporter's
// draft is lost: its writes and publishes fail typed. A coherent buffer
// on the node is not restored: its importer gets ErrUnavailable naming
// the node and saying why. The importer is in another mediator, the
// revoked tenant in the exporter's.
func TestNodeRestartRestoresPublishedVersion(t *testing.T) {
	const n = 300 << 10 // five coherence pages, the last one short
	sys := startNodes(t, 1, 1, 64<<20, func(c *mediator.Config) { c.VersionCopies = true })
	a, c := sys.dial(t, "a", 1), sys.dial(t, "c", 1)
	m2 := sys.another(t, "m2")
	b := m2.dial(t, "b", 1)
	addr := a.Devices()[0].Node

	v1, v2 := randomBytes(7, n), randomBytes(8, n)
	p, err := a.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(a, p, v1); err != nil {
		t.Fatal(err)
	}
	sh, err := a.Export(p, api.ModeVersioned, api.Grant{Tenant: "b"}, api.Grant{Tenant: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if err := write(a, p, v2); err != nil { // the draft
		t.Fatal(err)
	}
	if v, err := a.Publish(p); err != nil || v != 2 {
		t.Fatalf("publish: version %d, %v; want 2", v, err)
	}
	if _, err := a.Pin(p); err != nil {
		t.Fatal(err)
	}
	pb, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := read(t, b, pb, n); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("importer before the restart: %v, equal %v", err, bytes.Equal(got, v2))
	}
	pc, _, err := c.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(p, "c"); err != nil {
		t.Fatal(err)
	}

	// A coherent buffer on the same node, which nothing restores.
	q, err := a.Malloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	shq, err := a.Export(q, api.ModeCoherent, api.Grant{Tenant: "b"})
	if err != nil {
		t.Fatal(err)
	}
	qb, _, err := b.Import(shq)
	if err != nil {
		t.Fatal(err)
	}
	inA, inB := copiedIn(t, a), copiedIn(t, b)

	node := sys.restartNode(t, 0, addr)
	// The importer's session has installed its new connection, so it knows
	// its old one ended: a read before that may be served by the cache's
	// copies, never asking the node (TestNodeRestartVersionPublishedElsewhere
	// says what else it may meet).
	mallocWhenBack(t, b, 0)

	// The importer reads the published version on, from the new home.
	if got := readWhenBack(t, b, pb, n); !bytes.Equal(got, v2) {
		t.Fatal("the importer reads other bytes than the published version after the restart")
	}
	// The importer may read as soon as the node has the object, before
	// the exporter's session counts it.
	for deadline := time.Now().Add(5 * time.Second); mediator.VersionRehomes(sys.med, a.Session()) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if k := mediator.VersionRehomes(sys.med, a.Session()); k != 1 {
		t.Fatalf("%d objects restored by the exporter's session, want 1 (the versioned one)", k)
	}
	if k := mediator.Reimports(m2.med, b.Session()); k != 1 {
		t.Fatalf("%d imports made again by the importer's session, want 1", k)
	}
	if st := node.Status().Coherence; st.Objects != 1 || st.VersionBytes != n {
		t.Fatalf("the restarted node holds %d objects, %d bytes of versions: want 1, %d", st.Objects, st.VersionBytes, n)
	}

	// The exporter reads the version it pinned; its draft is gone.
	if got, err := read(t, a, p, n); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("exporter after the restart: %v, equal %v", err, bytes.Equal(got, v2))
	}
	if ka, kb := copiedIn(t, a)-inA, copiedIn(t, b)-inB; ka != 0 || kb != 0 {
		t.Fatalf("the exporter copied %d bytes in after the restart, the importer %d: want none", ka, kb)
	}
	wantErr(t, write(a, p, v1), api.ErrUnavailable, "restored after its node restarted", "no writes")
	_, err = a.Publish(p)
	wantErr(t, err, api.ErrUnavailable, "restored after its node restarted", "no publish")

	// The revoked tenant gets nothing back, through its old range or anew.
	if _, err := read(t, c, pc, n); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("revoked importer's read after the restart: %v, want %v", err, api.ErrPermissionDenied)
	}
	mallocWhenBack(t, c, 0) // its session's connection to the node is back
	_, _, err = c.Import(sh)
	wantErr(t, err, api.ErrPermissionDenied, `"c" has no grant`)

	// The coherent buffer is lost, typed, naming the node.
	_, err = read(t, b, qb, 4096)
	wantErr(t, err, api.ErrUnavailable, "node "+addr+", restarted (boot ", "not restored", "coherent")

	// Freeing the export ends the restored object, and its importer hears.
	if err := a.Free(p); err != nil {
		t.Fatal(err)
	}
	_, err = read(t, b, pb, n)
	wantErr(t, err, api.ErrInvalidArgument, "freed")
}

// Without a held copy, a versioned buffer's published version is lost
// with its home like any other: the importer and the exporter get
// ErrUnavailable naming the node and why it was not restored.
func TestNodeRestartVersionNotHeld(t *testing.T) {
	const n = 128 << 10
	sys := startNodes(t, 1, 1, 64<<20, nil)
	a, b := sys.dial(t, "a", 1), sys.dial(t, "b", 1)
	addr := a.Devices()[0].Node
	p, err := a.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(a, p, randomBytes(9, n)); err != nil {
		t.Fatal(err)
	}
	sh, err := a.Export(p, api.ModeVersioned, api.Grant{Tenant: "b"})
	if err != nil {
		t.Fatal(err)
	}
	pb, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := read(t, b, pb, n); err != nil {
		t.Fatal(err)
	}
	sys.restartNode(t, 0, addr)
	// Both sessions have installed their new connections, so each knows
	// its old one ended (TestNodeRestartVersionPublishedElsewhere says why).
	mallocWhenBack(t, a, 0)
	mallocWhenBack(t, b, 0)

	_, err = read(t, b, pb, n)
	wantErr(t, err, api.ErrUnavailable, "node "+addr+", restarted (boot ", "not restored")
	_, err = read(t, a, p, n)
	wantErr(t, err, api.ErrUnavailable, "node "+addr+", restarted (boot ", "not restored", "holds no copy of its published version")
	if k := mediator.VersionRehomes(sys.med, a.Session()); k != 0 {
		t.Fatalf("%d objects restored without a copy", k)
	}
}

// A version the exporter's mediator does not hold — one an importer with
// a write grant published — is not restored: the importer that pinned it
// fails its reads with ErrUnavailable naming the node and both versions,
// until it Pins, and then reads the version that was restored.
func TestNodeRestartVersionPublishedElsewhere(t *testing.T) {
	const n = 192 << 10
	sys := startNodes(t, 1, 1, 64<<20, func(c *mediator.Config) { c.VersionCopies = true })
	a := sys.dial(t, "a", 1)
	m2 := sys.another(t, "m2")
	b := m2.dial(t, "b", 1)
	addr := a.Devices()[0].Node
	v1, v2 := randomBytes(10, n), randomBytes(11, n)
	p, err := a.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(a, p, v1); err != nil {
		t.Fatal(err)
	}
	sh, err := a.Export(p, api.ModeVersioned, api.Grant{Tenant: "b", Write: true})
	if err != nil {
		t.Fatal(err)
	}
	pb, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(b, pb, v2); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Publish(pb); err != nil || v != 2 {
		t.Fatalf("the importer's publish: version %d, %v; want 2", v, err)
	}
	if v, err := b.Pin(pb); err != nil || v != 2 {
		t.Fatalf("the importer's pin: version %d, %v; want 2", v, err)
	}
	sys.restartNode(t, 0, addr)
	// A read sent before the importer's mediator has seen its connection
	// to the old node end goes down that connection and fails with the
	// connection's ErrUnavailable ("broken pipe", "lost: EOF"), as any use
	// in flight at a node's death does; the range is made again only at
	// its next use. Once the session's watcher has a new connection, the
	// old one is known closed, and the first read finds the range moved.
	mallocWhenBack(t, b, 0)

	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = read(t, b, pb, n)
		if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "does not exist") || time.Now().After(deadline) {
			break // restored, or failing otherwise
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantErr(t, err, api.ErrUnavailable, "version 2, which this range read, is not restored", "node "+addr+" restarted (boot ", "version 1, which a Pin reads")
	if v, err := b.Pin(pb); err != nil || v != 1 {
		t.Fatalf("the importer's pin after the restart: version %d, %v; want 1", v, err)
	}
	if got, err := read(t, b, pb, n); err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("the importer after its pin: %v, equal %v (want version 1's bytes)", err, bytes.Equal(got, v1))
	}
}

// BenchmarkPublish publishes a 1 MiB versioned buffer, without and with
// VersionCopies, which reads each published version back into the
// exporter's mediator: the cost of keeping it restorable.
func BenchmarkPublish(b *testing.B) {
	for _, copies := range []bool{false, true} {
		b.Run(map[bool]string{false: "copies=off", true: "copies=on"}[copies], func(b *testing.B) {
			const n = 1 << 20
			sys := startNodes(b, 1, 1, 64<<20, func(c *mediator.Config) { c.VersionCopies = copies })
			a := sys.dial(b, "a", 1)
			p, err := a.Malloc(0, n)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := a.Export(p, api.ModeVersioned, api.Grant{Tenant: "b"}); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(n)
			b.ResetTimer()
			for range b.N {
				if _, err := a.Publish(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
