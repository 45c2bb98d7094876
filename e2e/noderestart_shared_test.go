package e2e

import (
	"bytes"
	"crypto/rand"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// A versioned buffer's published version outlives a SIGKILL of its home
// vgpu-node: the exporter's vgpu-mediator (--version-copies) restores it on
// the node started again at the address (another boot id), and the
// importer, through a second vgpu-mediator, reads it byte for byte while
// neither tenant sends a byte again. A coherent buffer of the same node
// fails unavailable naming the node and saying why it was not restored.
func TestVersionedBufferOutlivesItsNodeKilled(t *testing.T) {
	addr := freePort(t)
	node := startNodeAt(t, addr, "--devices", "1", "--memory", "256MiB")
	exp := &killable{t: t, node: addr, dir: t.TempDir(), flags: []string{"--version-copies"}}
	imp := &killable{t: t, node: addr, dir: t.TempDir()}
	for _, k := range []*killable{exp, imp} {
		k.socket = filepath.Join(k.dir, "m.sock")
		k.start()
	}
	dial := func(k *killable, tenant string) *client.Client {
		c, err := client.Dial(client.Options{Socket: k.socket, Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := dial(exp, "a"), dial(imp, "b")
	xfer := func(c *client.Client, p client.Ptr, to, from []byte) error {
		s := c.Stream()
		if from != nil {
			s.CopyToDevice(p, from)
		} else {
			s.CopyFromDevice(to, p)
		}
		return s.Synchronize()
	}
	const n = 1 << 20
	v1, v2 := make([]byte, n), make([]byte, n)
	rand.Read(v1)
	rand.Read(v2)
	p, err := a.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := xfer(a, p, nil, v1); err != nil {
		t.Fatal(err)
	}
	sh, err := a.Export(p, api.ModeVersioned, api.Grant{Tenant: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := xfer(a, p, nil, v2); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Publish(p); err != nil {
		t.Fatal(err)
	}
	q, err := a.Malloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	shq, err := a.Export(q, api.ModeCoherent, api.Grant{Tenant: "b"})
	if err != nil {
		t.Fatal(err)
	}
	pb, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	qb, _, err := b.Import(shq)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := xfer(b, pb, got, nil); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("importer before the kill: %v, equal %v", err, bytes.Equal(got, v2))
	}
	statsA, err := a.Stats()
	if err != nil {
		t.Fatal(err)
	}
	statsB, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	boot := nodeStatusAt(t, addr).Boot

	if err := node.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	node.cmd.Wait()
	startNodeAt(t, addr, "--devices", "1", "--memory", "256MiB")
	if now := nodeStatusAt(t, addr).Boot; now == "" || now == boot {
		t.Fatalf("the node started again has boot id %q, before %q: want another", now, boot)
	}

	deadline := time.Now().Add(15 * time.Second)
	for {
		err := xfer(b, pb, got, nil)
		if err == nil {
			break
		}
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("importer after the node's restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !bytes.Equal(got, v2) {
		t.Fatal("the importer reads other bytes than the published version after the node's restart")
	}
	if st := nodeStatusAt(t, addr).Coherence; st.Objects != 1 || st.VersionBytes != n {
		t.Fatalf("the node started again holds %d objects, %d bytes of versions: want 1, %d", st.Objects, st.VersionBytes, n)
	}
	err = xfer(b, qb, got[:4096], nil)
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "node "+addr+", restarted (boot ") || !strings.Contains(err.Error(), "not restored") {
		t.Fatalf("the coherent buffer after the node's restart: %v, want unavailable naming %s and why", err, addr)
	}
	for _, c := range []struct {
		c      *client.Client
		before uint64
	}{{a, statsA.CopiedIn}, {b, statsB.CopiedIn}} {
		st, err := c.c.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.CopiedIn != c.before {
			t.Fatalf("a tenant copied %d bytes in after the node's restart, want none", st.CopiedIn-c.before)
		}
	}
}
