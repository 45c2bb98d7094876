package mediator_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// another starts one more mediator in front of sys's nodes, as a second
// host would have, and returns a system value for dialling it. edit, if
// set, changes its configuration. Its state directory is its own: a
// mediator's registration store is its alone.
func (s *system) another(t testing.TB, name string, edit ...func(*mediator.Config)) *system {
	t.Helper()
	cfg := mediator.Config{ContainerDir: filepath.Join(s.dir, name+"-c"), StateDir: filepath.Join(s.dir, name+"-state"), Log: quietLog()}
	for _, n := range s.med.Status().Nodes {
		cfg.Nodes = append(cfg.Nodes, n.Addr)
	}
	for _, e := range edit {
		e(&cfg)
	}
	m, err := mediator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := &system{socket: filepath.Join(s.dir, name+".sock"), dir: s.dir, med: m, nodes: s.nodes}
	l, err := net.Listen("unix", o.socket)
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(l)
	t.Cleanup(func() { m.Close() })
	return o
}

func read(t *testing.T, c *client.Client, p client.Ptr, n int) ([]byte, error) {
	t.Helper()
	b := make([]byte, n)
	s := c.Stream()
	s.CopyFromDevice(b, p)
	return b, s.Synchronize()
}

func write(c *client.Client, p client.Ptr, b []byte) error {
	s := c.Stream()
	s.CopyToDevice(p, b)
	return s.Synchronize()
}

func TestSharedCoherentBufferAcrossMediators(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	m2 := sys.another(t, "m2")
	a := sys.dial(t, "alpha", 1)
	const n = 300 << 10 // five pages, the last one short
	p, data, sh := exportRandom(t, a, n, 3, api.ModeCoherent, api.Grant{Tenant: "beta", Write: true}, api.Grant{Tenant: "gamma"})
	b := m2.dial(t, "beta", 1)
	q, info, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != n || info.Mode != api.ModeCoherent || !info.Write {
		t.Fatalf("import: %+v", info)
	}
	for range 2 { // the second time from the cache
		got, err := read(t, b, q, n)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("beta reads the shared buffer: %v", err)
		}
	}
	if st, _ := b.Stats(); st.SharedMisses != 5 || st.SharedHits != 5 {
		t.Fatalf("beta's reads: %d from the node, %d from the cache; want 5 and 5", st.SharedMisses, st.SharedHits)
	}
	// A write through one mediator is seen through the other at once: the
	// cached copies were invalidated before the write was acknowledged.
	patch := bytes.Repeat([]byte{0xab}, 70<<10)
	if err := write(a, p.Add(60<<10), patch); err != nil {
		t.Fatal(err)
	}
	copy(data[60<<10:], patch)
	if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("beta after alpha's write: %v", err)
	}
	if err := write(b, q.Add(5), []byte("beta was here")); err != nil {
		t.Fatal(err)
	}
	copy(data[5:], "beta was here")
	if got, err := read(t, a, p, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("alpha after beta's write: %v", err)
	}
	// Kernels on the node see the latest acknowledged data.
	s := a.Stream()
	dst, err := a.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	s.CopyDevice(dst, p, n)
	if got, err := read(t, a, dst, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("device copy of the shared buffer: %v", err)
	}
	// The exporter writes only through the object.
	s.Memset(p, 0, 16)
	wantErr(t, s.Synchronize(), api.ErrPermissionDenied, "shared object")

	// A reader may not write; a revoked reader may not read, even what its
	// mediator cached.
	g := sys.dial(t, "gamma", 1)
	r, info, err := g.Import(sh)
	if err != nil || info.Write {
		t.Fatalf("gamma imports: %+v %v", info, err)
	}
	if got, err := read(t, g, r, 4096); err != nil || !bytes.Equal(got, data[:4096]) {
		t.Fatalf("gamma reads: %v", err)
	}
	wantErr(t, write(g, r, []byte{1}), api.ErrPermissionDenied)
	if err := a.Revoke(p, "gamma"); err != nil {
		t.Fatal(err)
	}
	_, err = read(t, g, r, 4096)
	wantErr(t, err, api.ErrPermissionDenied, "revoked")
	// Strangers and bad names.
	_, _, err = sys.dial(t, "delta", 1).Import(sh)
	wantErr(t, err, api.ErrPermissionDenied, "delta")
	_, _, err = b.Import(api.Shared{Node: sh.Node, Object: sh.Object + 100})
	wantErr(t, err, api.ErrInvalidArgument, "does not exist")
	_, _, err = b.Import(api.Shared{Node: "nowhere:1", Object: sh.Object})
	wantErr(t, err, api.ErrInvalidArgument, "nowhere")
	// Freeing the exported buffer ends the object.
	if err := a.Free(p); err != nil {
		t.Fatal(err)
	}
	_, err = read(t, b, q, 16)
	wantErr(t, err, api.ErrInvalidArgument, "freed")
	if err := b.Free(q); err != nil {
		t.Fatal(err)
	}
}

func TestSharedImmutableBufferIsCachedForever(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	m2 := sys.another(t, "m2")
	a := sys.dial(t, "alpha", 1)
	const n = 256 << 10
	p, data, sh := exportRandom(t, a, n, 4, api.ModeImmutable, api.Grant{Tenant: "beta", Write: true})
	wantErr(t, write(a, p, []byte{1}), api.ErrPermissionDenied)
	b := m2.dial(t, "beta", 1)
	q, info, err := b.Import(sh)
	if err != nil || info.Mode != api.ModeImmutable {
		t.Fatalf("import: %+v %v", info, err)
	}
	for range 3 {
		if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("beta reads: %v", err)
		}
	}
	if st, _ := b.Stats(); st.SharedMisses != 4 || st.SharedHits != 8 {
		t.Fatalf("reads of a sealed buffer: %d from the node, %d cached; want 4 and 8", st.SharedMisses, st.SharedHits)
	}
	wantErr(t, write(b, q, []byte{1}), api.ErrPermissionDenied, "sealed")
}

func TestSharedVersionedBufferReadersPinAVersion(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	m2 := sys.another(t, "m2")
	a := sys.dial(t, "alpha", 1)
	const n = 200 << 10
	p, v1, sh := exportRandom(t, a, n, 5, api.ModeVersioned, api.Grant{Tenant: "beta"})
	b := m2.dial(t, "beta", 1)
	q, info, err := b.Import(sh)
	if err != nil || info.Mode != api.ModeVersioned || info.Write {
		t.Fatalf("import: %+v %v", info, err)
	}
	if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("beta reads version 1: %v", err)
	}
	// The writer's draft changes; beta's pinned version does not.
	v2 := randomBytes(6, n)
	if err := write(a, p, v2); err != nil {
		t.Fatal(err)
	}
	if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("beta's pinned version changed under a write: %v", err)
	}
	ver, err := a.Publish(p)
	if err != nil || ver != 2 {
		t.Fatalf("publish: version %d, %v", ver, err)
	}
	if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("beta's pinned version changed at a publish: %v", err)
	}
	if ver, err := b.Pin(q); err != nil || ver != 2 {
		t.Fatalf("pin: version %d, %v", ver, err)
	}
	if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("beta after pinning version 2: %v", err)
	}
	wantErr(t, write(b, q, []byte{1}), api.ErrPermissionDenied)
	_, err = b.Publish(q)
	wantErr(t, err, api.ErrPermissionDenied)
	// No invalidation ever: versioned copies never go stale.
	if st := sys.nodes[0].Status().Coherence; st.Invals != 0 {
		t.Fatalf("%d invalidations for a versioned buffer", st.Invals)
	}
	_, err = b.Pin(client.Ptr(0x1234))
	wantErr(t, err, api.ErrInvalidArgument, "versioned")
}

// proxy forwards connections to the node at addr, frame by frame, and
// returns its address. intercept sees each frame a mediator sends, with
// both sides of its connection (the mediator's, the node's); when it
// returns true it has answered the frame itself and the node never sees it.
func proxy(t *testing.T, addr string, intercept func(med *wire.Conn, mc, nc net.Conn, h wire.Header, body []byte) bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		open []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		open = append(open, c)
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			c.Close()
		}
	})
	// copyFrames copies frames from one side to the other until either
	// fails; answer, if it returns true, has answered the frame itself.
	copyFrames := func(from, to *wire.Conn, answer func(wire.Header, []byte) bool) {
		defer from.Close()
		defer to.Close()
		for {
			h, err := from.ReadHeader()
			if err != nil {
				return
			}
			body := make([]byte, h.Len)
			if from.ReadBody(body) != nil {
				return
			}
			if answer(h, body) {
				continue
			}
			if to.WriteFrame(h.Op, h.Flags, h.ID, body) != nil {
				return
			}
		}
	}
	go func() {
		for {
			mc, err := ln.Accept()
			if err != nil {
				return
			}
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				mc.Close()
				return
			}
			track(mc)
			track(nc)
			med, node := wire.NewConn(mc), wire.NewConn(nc)
			go copyFrames(node, med, func(wire.Header, []byte) bool { return false })
			go copyFrames(med, node, func(h wire.Header, body []byte) bool { return intercept(med, mc, nc, h, body) })
		}
	}()
	return ln.Addr().String()
}

// relay is a proxy to the node at addr that answers the first request of
// op itself with an error.
func relay(t *testing.T, addr string, op wire.Op) string {
	t.Helper()
	var failed atomic.Bool
	return proxy(t, addr, func(med *wire.Conn, _, _ net.Conn, h wire.Header, _ []byte) bool {
		if h.Op != op || !failed.CompareAndSwap(false, true) {
			return false
		}
		_ = med.ReplyError(h, fmt.Errorf("relay refuses %v: %w", op, api.ErrUnavailable))
		return true
	})
}

// An export whose pin fails leaves nothing behind on the node: the buffer
// is written as before and exported again.
func TestSharedExportFailingPinEndsTheObject(t *testing.T) {
	sys := startWith(t, 64<<20, func(c *mediator.Config) { c.Nodes[0] = relay(t, c.Nodes[0], api.OpNodePin) })
	a := sys.dial(t, "alpha", 1)
	const n = 100 << 10
	p, err := a.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Export(p, api.ModeVersioned, api.Grant{Tenant: "beta"})
	wantErr(t, err, api.ErrUnavailable, "relay refuses", "export")
	if st := sys.nodes[0].Status().Coherence; st.Objects != 0 {
		t.Fatalf("%d shared objects left on the node after a failed export", st.Objects)
	}
	data := randomBytes(7, n)
	if err := write(a, p, data); err != nil {
		t.Fatalf("write to a buffer whose export failed: %v", err)
	}
	if _, err := a.Export(p, api.ModeVersioned, api.Grant{Tenant: "beta"}); err != nil {
		t.Fatalf("export again: %v", err)
	}
	if got, err := read(t, a, p, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the exporter reads its versioned buffer: %v", err)
	}
}

// Each import of a versioned buffer holds a pin of its own, though a
// session's imports share its node connection: moving one to a newer
// version leaves the other reading the old one, from the node too, and
// the node drops a version once no import (nor the exporter) pins it.
func TestSharedVersionedImportsPinTheirOwnVersions(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	a := sys.dial(t, "alpha", 1)
	const n = 200 << 10 // four pages
	p, v1, sh := exportRandom(t, a, n, 8, api.ModeVersioned, api.Grant{Tenant: "beta"})
	b := sys.dial(t, "beta", 1)
	var q [2]client.Ptr
	for i := range q {
		var err error
		if q[i], _, err = b.Import(sh); err != nil {
			t.Fatal(err)
		}
	}
	v2 := randomBytes(9, n)
	if err := write(a, p, v2); err != nil {
		t.Fatal(err)
	}
	if ver, err := a.Publish(p); err != nil || ver != 2 {
		t.Fatalf("publish: version %d, %v", ver, err)
	}
	if ver, err := b.Pin(q[0]); err != nil || ver != 2 {
		t.Fatalf("pin of the first import: version %d, %v", ver, err)
	}
	// Page 0 of version 1 was never read: it comes from the node.
	const page = 64 << 10
	if got, err := read(t, b, q[1], page); err != nil || !bytes.Equal(got, v1[:page]) {
		t.Fatalf("the second import after the first moved to version 2: %v", err)
	}
	if got, err := read(t, b, q[0], n); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("the first import after pinning version 2: %v", err)
	}
	versions := func() int { return sys.nodes[0].Status().Coherence.Versions }
	if got := versions(); got != 2 {
		t.Fatalf("the node keeps %d versions, want 2", got)
	}
	if err := b.Free(q[0]); err != nil {
		t.Fatal(err)
	}
	if got, err := read(t, b, q[1], n); err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("the second import after the first was freed: %v", err)
	}
	// Once the exporter moves on too, only the second import keeps
	// version 1, until it is freed.
	if ver, err := a.Pin(p); err != nil || ver != 2 {
		t.Fatalf("the exporter's pin: version %d, %v", ver, err)
	}
	if got := versions(); got != 2 {
		t.Fatalf("the node keeps %d versions while an import pins version 1, want 2", got)
	}
	if err := b.Free(q[1]); err != nil {
		t.Fatal(err)
	}
	if st := sys.nodes[0].Status().Coherence; st.Versions != 1 || st.VersionBytes != n {
		t.Fatalf("the node keeps %d versions (%d bytes) once nobody pins version 1, want 1 (%d bytes)", st.Versions, st.VersionBytes, n)
	}
}

// A buffer freed with its stream ends the object it was exported as, as a
// free does: its importers lose it, and its bytes (a small buffer shares
// its chunk) are the exporter's to reuse.
func TestSharedBufferFreedWithItsStreamEndsItsObject(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	a := sys.dial(t, "alpha", 1)
	st, err := a.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.MallocWith(0, 8<<10, client.AllocOptions{FreeWith: st})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := a.Export(p, api.ModeCoherent, api.Grant{Tenant: "beta", Write: true})
	if err != nil {
		t.Fatal(err)
	}
	b := sys.dial(t, "beta", 1)
	q, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := write(b, q, []byte("after the free")); err == nil {
		t.Fatal("the importer wrote a buffer freed with its stream")
	}
	// The freed bytes are the exporter's again: a new buffer there is
	// written normally, not refused as part of an object.
	r, err := a.Malloc(0, 8<<10)
	if err != nil {
		t.Fatalf("malloc after the stream's free: %v", err)
	}
	if err := write(a, r, []byte("mine")); err != nil {
		t.Fatalf("write a new buffer: %v", err)
	}
}

// Only a whole allocation is exported: one exported from inside would not
// end with the allocation's free.
func TestSharedExportOfAnInteriorAddressIsRefused(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	a := sys.dial(t, "alpha", 1)
	p, err := a.Malloc(0, 8<<10)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Export(p.Add(4096), api.ModeCoherent, api.Grant{Tenant: "beta"})
	wantErr(t, err, api.ErrInvalidAddress, "not the start of an allocation")
}

// A copy of more uncached pages of a shared buffer than a copy keeps in
// flight (16 MiB) waits for the first ones' replies partway; their
// callbacks take the page cache's lock, so the copy must not hold it while
// it waits.
func TestSharedReadOfManyUncachedPagesCompletes(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	a := sys.dial(t, "alpha", 1)
	const n = 17 << 20 // 272 pages
	p, err := a.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(11, n)
	if err := write(a, p, data); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Export(p, api.ModeCoherent); err != nil {
		t.Fatal(err)
	}
	dst, err := a.HostAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		s := a.Stream()
		s.CopyFromDevice(dst, p)
		done <- s.Synchronize()
	}()
	select {
	case err := <-done:
		if err != nil || !bytes.Equal(dst, data) {
			t.Fatalf("copy of %d bytes of a shared buffer into host memory: %v", n, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a copy of %d bytes of a shared buffer into host memory is stuck after 10s", n)
	}
}

// tenantRelay is a proxy to the node at addr. It returns its address and
// cut, which closes the connections whose hello named tenant, as a network
// fault or the node dropping them would.
func tenantRelay(t *testing.T, addr string) (string, func(tenant string)) {
	t.Helper()
	var mu sync.Mutex
	byTenant := map[string][]net.Conn{}
	a := proxy(t, addr, func(_ *wire.Conn, mc, nc net.Conn, h wire.Header, body []byte) bool {
		var hello api.Hello
		if h.Op == api.OpHello && api.Decode(body, &hello) == nil {
			mu.Lock()
			byTenant[hello.Tenant] = append(byTenant[hello.Tenant], mc, nc)
			mu.Unlock()
		}
		return false
	})
	return a, func(tenant string) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range byTenant[tenant] {
			c.Close()
		}
	}
}

// An importer whose connection to the node is lost reads nothing more of
// the object, not even what its mediator cached, until its import is made
// again on the connection that reclaims its frames (the node forgot the
// lost one, so a revocation would reach nobody): a grant revoked by then
// ends the import, typed, and no read succeeds once the revocation is
// acknowledged.
func TestSharedImportEndsWithItsNodeConnection(t *testing.T) {
	var cut func(string)
	sys := startWith(t, 64<<20, func(c *mediator.Config) { c.Nodes[0], cut = tenantRelay(t, c.Nodes[0]) })
	m2 := sys.another(t, "m2")
	a := sys.dial(t, "alpha", 1)
	const n = 128 << 10
	p, data, sh := exportRandom(t, a, n, 9, api.ModeImmutable, api.Grant{Tenant: "beta"}, api.Grant{Tenant: "gamma"})
	b, g := m2.dial(t, "beta", 1), m2.dial(t, "gamma", 1)
	q, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := g.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("beta reads: %v", err)
	}
	cut("beta") // beta's session lives on
	if err := a.Revoke(p, "beta"); err != nil {
		t.Fatal(err)
	}
	// A revocation cannot reach a mediator cut off before it noticed the
	// cut, whose copies then live out their lease, as for any cut-off
	// reader (docs/coherence.md); past that, no read may succeed. Until
	// the watcher has made the import again, reads meet the lost
	// connection; then the node refuses the import, or its revocation
	// reached the import made again.
	time.Sleep(accelerator.ReadLease + 50*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = read(t, b, q, n)
		if err == nil {
			t.Fatal("beta read the object after its grant was revoked")
		}
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	wantErr(t, err, api.ErrPermissionDenied, fmt.Sprint(sh.Object))
	// Another tenant of the mediator, whose connection lives, reads on.
	if got, err := read(t, g, r, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("gamma reads: %v", err)
	}
}

// A session that imports from a node it has no device on does so over a
// connection of its own; once that connection is lost (the node staying
// up), the next use of an import made over it dials again and imports it
// again, the grant checked anew: one still granted reads on, one revoked
// meanwhile fails ErrPermissionDenied; a new import works too.
func TestSharedImportRedialsALostConnection(t *testing.T) {
	var cut func(string)
	sys := startNodes(t, 2, 1, 64<<20, func(c *mediator.Config) { c.Nodes[0], cut = tenantRelay(t, c.Nodes[0]) })
	a := sys.dial(t, "alpha", 1) // the least used device: node 0's
	b := sys.dial(t, "beta", 1)  // then node 1's
	if devs := b.Devices(); devs[0].Node == a.Devices()[0].Node {
		t.Fatalf("alpha and beta both on node %s", devs[0].Node)
	}
	const n = 64 << 10
	_, data, sh := exportRandom(t, a, n, 10, api.ModeImmutable, api.Grant{Tenant: "beta"})
	p2, _, sh2 := exportRandom(t, a, n, 11, api.ModeImmutable, api.Grant{Tenant: "beta"})
	q, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	q2, _, err := b.Import(sh2)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read before the cut: %v", err)
	}
	cut("beta")
	if err := a.Revoke(p2, "beta"); err != nil {
		t.Fatal(err)
	}
	if got, err := read(t, b, q, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after the cut: %v", err)
	}
	// Made again, not only lost: the revoked one says so.
	_, err = read(t, b, q2, n)
	wantErr(t, err, api.ErrPermissionDenied, "after its node connection dropped", "has no grant")
	r, _, err := b.Import(sh)
	if err != nil {
		t.Fatalf("import again after the connection was lost: %v", err)
	}
	if got, err := read(t, b, r, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read the new import: %v", err)
	}
}

// exportRandom writes n random bytes (of seed) to a new buffer of c on its
// first device and exports it in mode to grants; it returns the buffer, its
// bytes and the export.
func exportRandom(t *testing.T, c *client.Client, n int, seed uint64, mode api.Mode, grants ...api.Grant) (client.Ptr, []byte, api.Shared) {
	t.Helper()
	p, err := c.Malloc(0, uint64(n))
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(seed, n)
	if err := write(c, p, data); err != nil {
		t.Fatal(err)
	}
	sh, err := c.Export(p, mode, grants...)
	if err != nil {
		t.Fatal(err)
	}
	return p, data, sh
}

// An export grants at most api.MaxGrants tenants, which the node keeps for the
// object's life: one more is refused, naming the count and the bound, and
// exports nothing. The node holds the same bound against any mediator.
func TestSharedExportGrantsAreBounded(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	a := sys.dial(t, "alpha", 1)
	p, err := a.Malloc(0, 8<<10)
	if err != nil {
		t.Fatal(err)
	}
	grants := make([]api.Grant, api.MaxGrants+1)
	for i := range grants {
		grants[i] = api.Grant{Tenant: fmt.Sprintf("t%d", i)}
	}
	_, err = a.Export(p, api.ModeCoherent, grants...)
	wantErr(t, err, api.ErrInvalidArgument, fmt.Sprint(api.MaxGrants+1), fmt.Sprint(api.MaxGrants))
	if _, err := a.Export(p, api.ModeCoherent, grants[:api.MaxGrants]...); err != nil {
		t.Fatalf("export to %d tenants after a refused one: %v", api.MaxGrants, err)
	}
}
