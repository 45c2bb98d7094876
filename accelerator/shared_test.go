package accelerator

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// importer is a mediator connection that imported an object and keeps the
// revocations and invalidations the node pushes, for the test to
// acknowledge when it likes (invalidations past the first 16 are dropped).
type importer struct {
	*client
	revoked chan api.NodeRevoke
	invals  chan api.NodeInval
}

// importAs connects as tenant with a push handler and imports object id.
func (tn *testNode) importAs(t *testing.T, tenant string, id uint64) *importer {
	t.Helper()
	im := &importer{revoked: make(chan api.NodeRevoke, 16), invals: make(chan api.NodeInval, 16)}
	conn := tn.dialRaw(t)
	rpc := wire.NewRPCPush(conn, "node "+tn.addr, func(_ *wire.RPC, op wire.Op, body []byte) {
		var m api.NodeRevoke
		var inval api.NodeInval
		switch {
		case op == api.OpNodeRevoked && api.Decode(body, &m) == nil:
			im.revoked <- m
		case op == api.OpNodeInval && api.Decode(body, &inval) == nil:
			select {
			case im.invals <- inval:
			default:
			}
		}
	})
	t.Cleanup(func() { rpc.Close() })
	im.client = &client{t: t, conn: conn, rpc: rpc}
	if _, err := im.call(api.OpHello, mediatorHello(tenant)); err != nil {
		t.Fatalf("hello as %q: %v", tenant, err)
	}
	if _, err := im.call(api.OpNodeImport, &api.NodeObject{Object: id}); err != nil {
		t.Fatalf("%s imports object %d: %v", tenant, id, err)
	}
	return im
}

// next returns the next revocation pushed to im.
func (im *importer) next() api.NodeRevoke {
	im.t.Helper()
	select {
	case m := <-im.revoked:
		return m
	case <-time.After(5 * time.Second):
		im.t.Fatal("no revocation pushed within 5s")
		return api.NodeRevoke{}
	}
}

func (im *importer) ack(m api.NodeRevoke) {
	im.t.Helper()
	if _, err := im.call(api.OpNodeRevokedAck, &m); err != nil {
		im.t.Fatalf("acknowledge %+v: %v", m, err)
	}
}

// exportFrame exports a fresh frame of c's as an object granted to grants.
func exportFrame(t *testing.T, c *client, mode api.Mode, grants ...api.Grant) uint64 {
	t.Helper()
	f := c.alloc(0, 1)[0]
	return exportTo(t, c, mode, []api.Extent{ext(f, 0, FrameSize)}, grants...)
}

// Two revocations pushed to one importer at once (a revocation of its
// grant and the end of the object) each wait for their own
// acknowledgement: the one acknowledged ends at once, the other waits out
// the lease.
func TestNodeOverlappingRevocationsWaitForTheirOwnAcks(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	id := exportFrame(t, a, api.ModeCoherent, api.Grant{Tenant: "beta"})
	b := tn.importAs(t, "beta", id)
	o := tn.objectByID(id)

	start := time.Now()
	byBeta, byAll := tellAsync(o, "beta"), tellAsync(o, "")
	for range 2 {
		if m := b.next(); m.Tenant == "" {
			b.ack(m)
		}
	}
	endAll, endBeta := <-byAll, <-byBeta
	if endBeta.Sub(start) < ReadLease {
		t.Fatalf("the revocation of beta's grant ended after %v, on the acknowledgement of another; want a lease (%v)", endBeta.Sub(start), ReadLease)
	}
	if !endAll.Before(endBeta) {
		t.Fatalf("the acknowledged revocation ended after %v, no sooner than the unacknowledged one", endAll.Sub(start))
	}
}

func (tn *testNode) objectByID(id uint64) *object {
	tn.node.objects.mu.Lock()
	defer tn.node.objects.mu.Unlock()
	return tn.node.objects.byID[id]
}

// tellAsync pushes a revocation of tenant's grant to o's importers and
// waits for them in the background; the channel says when the wait ended.
func tellAsync(o *object, tenant string) <-chan time.Time {
	done := make(chan time.Time, 1)
	go func() {
		o.mu.Lock()
		o.tell(tenant)
		o.mu.Unlock()
		done <- time.Now()
	}()
	return done
}

// A late acknowledgement of a revocation of a grant does not end the wait
// of a later revocation of the same grant: acknowledgements name the push.
func TestNodeLateAckOfTheSameGrantDoesNotEndTheNext(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	id := exportFrame(t, a, api.ModeCoherent, api.Grant{Tenant: "beta"})
	b := tn.importAs(t, "beta", id)
	o := tn.objectByID(id)

	first := tellAsync(o, "beta")
	late := b.next()
	<-first // unacknowledged: it waited out the lease
	start := time.Now()
	second := tellAsync(o, "beta")
	next := b.next()
	b.ack(late)
	select {
	case end := <-second:
		t.Fatalf("the second revocation ended %v after it began, on the first one's late acknowledgement", end.Sub(start))
	// The late acknowledgement was taken when its call returned: a wait it
	// ended would have ended by now. A short look leaves the rest of the
	// lease for the acknowledgement below, on a slow machine.
	case <-time.After(ReadLease / 4):
	}
	b.ack(next)
	if end := <-second; end.Sub(start) >= ReadLease {
		t.Fatalf("the second revocation ended %v after it began, not on its acknowledgement", end.Sub(start))
	}
}

// An acknowledgement that comes after its revocation stopped waiting for
// it does not count for the next one: an object's end still waits for the
// importer's word that it forgot the object.
func TestNodeLateRevocationAckDoesNotEndTheNext(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	id := exportFrame(t, a, api.ModeCoherent, api.Grant{Tenant: "beta"})
	b := tn.importAs(t, "beta", id)

	// Beta does not answer in time: the revocation waits out the lease.
	if _, err := a.call(api.OpNodeRevoke, &api.NodeRevoke{Object: id, Tenant: "beta"}); err != nil {
		t.Fatal(err)
	}
	late := b.next()
	end := a.rpc.Go(api.OpNodeUnexport, nil, api.Encode(&api.NodeObject{Object: id}))
	freed := b.next()
	if late.Tenant != "beta" || freed.Tenant != "" {
		t.Fatalf("pushed %+v, then %+v", late, freed)
	}
	told := time.Now()
	b.ack(late)
	select {
	case <-end.Done():
		if since := time.Since(told); since < ReadLease {
			t.Fatalf("the object ended %v after the late acknowledgement of the revocation, without beta's acknowledgement of its end", since)
		}
	// The late acknowledgement was taken when its call returned: a wait it
	// ended would have ended by now. A short look leaves the rest of the
	// lease for the acknowledgement below, on a slow machine.
	case <-time.After(ReadLease / 4):
	}
	b.ack(freed)
	if err := end.Wait(); err != nil {
		t.Fatal(err)
	}
}

// A connection's pins of a versioned object are counted: two pins of one
// version need two unpins before the connection may no longer read it and
// the node frees it; pins are bounded per connection; a revoked importer
// may still unpin; a connection's end drops the pins it holds.
// pinned pins the published version of object id as c and returns it.
func pinned(t *testing.T, c *client, id uint64) uint64 {
	t.Helper()
	body, err := c.call(api.OpNodePin, &api.NodeObject{Object: id})
	var v api.BufVersion
	if err == nil {
		err = api.Decode(body, &v)
	}
	if err != nil {
		t.Fatalf("pin: %v", err)
	}
	return v.Version
}

func TestNodeVersionPinsAreCounted(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	id := exportFrame(t, a, api.ModeVersioned, api.Grant{Tenant: "beta"})
	b := tn.importAs(t, "beta", id)
	pin := func(c *client) uint64 { return pinned(t, c, id) }
	unpin := func(c *client, v uint64) error {
		_, err := c.call(api.OpNodeUnpin, &api.NodeVersion{Object: id, Version: v})
		return err
	}
	read := func(c *client, v uint64) error {
		_, err := c.call(api.OpNodeObjRead, &api.NodeObjAccess{Object: id, Version: v, Len: 16})
		return err
	}
	versions := func() int { return a.status().Coherence.Versions }

	if v1, v2 := pin(b.client), pin(b.client); v1 != 1 || v2 != 1 {
		t.Fatalf("pins of version %d and %d, want 1 and 1", v1, v2)
	}
	if _, err := a.call(api.OpNodePublish, &api.NodeObject{Object: id}); err != nil {
		t.Fatal(err)
	}
	if err := unpin(b.client, 1); err != nil {
		t.Fatal(err)
	}
	if err := read(b.client, 1); err != nil {
		t.Fatalf("read of version 1, pinned twice and unpinned once: %v", err)
	}
	if got := versions(); got != 2 {
		t.Fatalf("the node keeps %d versions, want 2", got)
	}
	if err := unpin(b.client, 1); err != nil {
		t.Fatal(err)
	}
	wantErr(t, read(b.client, 1), api.ErrInvalidArgument, "version 1", "has not pinned it")
	wantErr(t, unpin(b.client, 1), api.ErrInvalidArgument, "version 1", fmt.Sprint(id))
	if got := versions(); got != 1 {
		t.Fatalf("the node keeps %d versions once nobody pins version 1, want 1", got)
	}

	for range MaxPins {
		pin(b.client)
	}
	_, err := b.call(api.OpNodePin, &api.NodeObject{Object: id})
	wantErr(t, err, api.ErrInvalidArgument, fmt.Sprint(MaxPins), "the limit")
	if _, err := a.call(api.OpNodePublish, &api.NodeObject{Object: id}); err != nil {
		t.Fatal(err)
	}
	if got := versions(); got != 2 {
		t.Fatalf("the node keeps %d versions, want 2 (the published one and beta's)", got)
	}
	// An importer whose grant was revoked may still unpin: the revocation
	// dropped its pins, and the unpin that crosses it succeeds.
	revoke := a.rpc.Go(api.OpNodeRevoke, nil, api.Encode(&api.NodeRevoke{Object: id, Tenant: "beta"}))
	b.ack(b.next())
	if err := revoke.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := unpin(b.client, 2); err != nil {
		t.Fatalf("unpin after the grant was revoked: %v", err)
	}
	b.rpc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for versions() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the node keeps %d versions after the pinning connection ended, want 1", versions())
		}
		time.Sleep(time.Millisecond)
	}
}

// pinnedVersions exports a versioned object of alpha's, imported by beta,
// which pins MaxPinnedVersions versions, each then replaced by a publish;
// publish publishes the object again.
func pinnedVersions(t *testing.T) (a *client, b *importer, id uint64, publish func() error) {
	t.Helper()
	tn := startNode(t)
	a = tn.connect(t, "alpha")
	id = exportFrame(t, a, api.ModeVersioned, api.Grant{Tenant: "beta"})
	b = tn.importAs(t, "beta", id)
	publish = func() error {
		_, err := a.call(api.OpNodePublish, &api.NodeObject{Object: id})
		return err
	}
	for i := range MaxPinnedVersions {
		if _, err := b.call(api.OpNodePin, &api.NodeObject{Object: id}); err != nil {
			t.Fatalf("pin %d: %v", i+1, err)
		}
		if err := publish(); err != nil {
			t.Fatalf("publish with %d versions pinned: %v", i+1, err)
		}
	}
	return a, b, id, publish
}

// Readers cannot make the node keep versions without end: once they pin
// MaxPinnedVersions distinct versions, publishing fails with quota-exceeded
// and keeps nothing more; an unpin lets the exporter publish again.
func TestNodePinnedVersionsAreBounded(t *testing.T) {
	a, b, id, publish := pinnedVersions(t)
	versions := func() int { return a.status().Coherence.Versions }
	if got := versions(); got != MaxPinnedVersions+1 {
		t.Fatalf("the node keeps %d versions, want %d pinned and the published one", got, MaxPinnedVersions)
	}
	// The published version may still be pinned, by any number of pins.
	for range 3 {
		if _, err := b.call(api.OpNodePin, &api.NodeObject{Object: id}); err != nil {
			t.Fatalf("pin of the published version with %d pinned: %v", MaxPinnedVersions, err)
		}
	}
	wantErr(t, publish(), api.ErrQuotaExceeded, fmt.Sprint(id), fmt.Sprint(MaxPinnedVersions+1), "unpin")
	if got := versions(); got != MaxPinnedVersions+1 {
		t.Fatalf("a refused publish left %d versions, want %d", got, MaxPinnedVersions+1)
	}
	if _, err := b.call(api.OpNodeUnpin, &api.NodeVersion{Object: id, Version: 1}); err != nil {
		t.Fatal(err)
	}
	if err := publish(); err != nil {
		t.Fatalf("publish once a version was unpinned: %v", err)
	}
	if got := versions(); got != MaxPinnedVersions+1 {
		t.Fatalf("the node keeps %d versions, want %d", got, MaxPinnedVersions+1)
	}
}

// export is an export of xs by c, as the test gives it.
func (c *client) export(mode api.Mode, xs ...api.Extent) (uint64, error) {
	body, err := c.call(api.OpNodeExport, &api.NodeExport{Extents: xs, Mode: mode})
	var obj api.NodeObject
	if err == nil {
		err = api.Decode(body, &obj)
	}
	return obj.Object, err
}

// An export's extents are checked whole: an empty extent anywhere (which
// names a frame without touching it) or extents that overlap are refused,
// naming them, and seal nothing; the node serves on.
func TestNodeExportRefusesEmptyAndOverlappingExtents(t *testing.T) {
	tn := startNode(t)
	a, b := tn.connect(t, "alpha"), tn.connect(t, "beta")
	af, bf := a.alloc(0, 1)[0], b.alloc(0, 1)[0]
	beyond := uint64(testMemory) * 4
	for _, mode := range []api.Mode{api.ModeImmutable, api.ModeCoherent} {
		_, err := a.export(mode, ext(beyond, 1, 0), ext(af, 0, 4096))
		wantErr(t, err, api.ErrInvalidArgument, hex(beyond+1), "empty")
		_, err = a.export(mode, ext(bf, 1, 0), ext(af, 0, 4096))
		wantErr(t, err, api.ErrInvalidArgument, hex(bf+1), "empty")
		_, err = a.export(mode, ext(af, 0, 4096), ext(af, 2048, 4096))
		wantErr(t, err, api.ErrInvalidArgument, "overlap", hex(af), hex(af+2048))
		_, err = a.export(mode, slices.Repeat([]api.Extent{ext(af, 0, 4096)}, 16)...)
		wantErr(t, err, api.ErrInvalidArgument, "overlap")
	}
	// Nothing was sealed: beta still writes its frame, alpha its own.
	b.mustWrite(0, []api.Extent{ext(bf, 0, 4)}, []byte{1, 2, 3, 4})
	a.mustWrite(0, []api.Extent{ext(af, 0, 4)}, []byte{1, 2, 3, 4})
	if _, err := a.export(api.ModeImmutable, ext(af, 0, 4096)); err != nil {
		t.Fatalf("a good export after bad ones: %v", err)
	}
}

// A sealed frame, which the content index may have aliased to another
// tenant's frames, never becomes writable through an object: it is not
// exported as a coherent or versioned object, and a frame of such an
// object is not sealed. So a tenant whose frame was deduplicated against
// another's sealed weights reads those weights, whatever the sealer does.
func TestNodeSealedFramesAreNotWrittenThroughObjects(t *testing.T) {
	tn := startNode(t)
	a, b := tn.connect(t, "alpha"), tn.connect(t, "beta")
	af, bf := a.alloc(0, 1)[0], b.alloc(0, 1)[0]
	weights := bytes.Repeat([]byte{0x5a}, FrameSize)
	a.writeFrame(0, af, weights)
	if err := a.seal(0, af); err != nil {
		t.Fatal(err)
	}
	if hit, err := b.dedup(0, []uint64{bf}, sha256.Sum256(weights)); err != nil || !hit[0] {
		t.Fatalf("dedup of the sealed weights: %v, %v", hit, err)
	}
	for _, mode := range []api.Mode{api.ModeCoherent, api.ModeVersioned} {
		_, err := a.export(mode, ext(af, 0, FrameSize))
		wantErr(t, err, api.ErrPermissionDenied, hex(af), "sealed")
	}
	if !bytes.Equal(b.mustRead(0, ext(bf, 0, 64)), weights[:64]) {
		t.Fatal("the deduplicated frame no longer reads the sealed weights")
	}

	// The other order: a frame in a coherent object is not sealed.
	g := a.alloc(0, 1)[0]
	if _, err := a.export(api.ModeCoherent, ext(g, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	wantErr(t, a.seal(0, g), api.ErrPermissionDenied, hex(g), "shared object")
	// An immutable object's frames are sealed already; sealing them again
	// is allowed and changes nothing.
	h := a.alloc(0, 1)[0]
	if _, err := a.export(api.ModeImmutable, ext(h, 0, FrameSize)); err != nil {
		t.Fatal(err)
	}
	if err := a.seal(0, h); err != nil {
		t.Fatalf("seal a frame of an immutable object: %v", err)
	}
}

// A connection holds at most MaxObjects objects it exported; one more is
// refused with quota-exceeded, and ending one makes room.
func TestNodeObjectsPerConnectionAreBounded(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	// A frame holds MaxSharedRuns runs of objects: they take frames apart.
	fs := a.alloc(0, MaxObjects/MaxSharedRuns+1)
	for i := range uint64(MaxObjects) {
		if _, err := a.export(api.ModeCoherent, ext(fs[i/MaxSharedRuns], i%MaxSharedRuns, 1)); err != nil {
			t.Fatalf("export %d: %v", i, err)
		}
	}
	_, err := a.export(api.ModeCoherent, ext(fs[len(fs)-1], 0, 1))
	wantErr(t, err, api.ErrQuotaExceeded, strconv.Itoa(MaxObjects))
	// Another connection has its own count.
	other := tn.connect(t, "alpha")
	if _, err := other.export(api.ModeCoherent, ext(other.alloc(0, 1)[0], 0, 1)); err != nil {
		t.Fatalf("another connection's export: %v", err)
	}
	// Freeing the frames ends their objects.
	if err := a.free(0, fs...); err != nil {
		t.Fatal(err)
	}
	g := a.alloc(0, 1)[0]
	if _, err := a.export(api.ModeCoherent, ext(g, 0, 1)); err != nil {
		t.Fatalf("export after the objects ended: %v", err)
	}
}

// Extents that name the connection's bytes more than once, adding up to
// more than it holds, do not turn into more work or memory than it holds:
// a fill of them is refused, naming the count.
func TestNodeRepeatedExtentsAreBoundedByHeldMemory(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	f := a.alloc(0, 1)[0]
	xs := slices.Repeat([]api.Extent{ext(f, 0, FrameSize)}, 2)
	wantErr(t, a.fill(0, 7, xs...), api.ErrInvalidArgument, "2 extents", strconv.Itoa(FrameSize))
	if err := a.fill(0, 7, ext(f, 0, FrameSize/2), ext(f, FrameSize/2, FrameSize/2)); err != nil {
		t.Fatalf("a fill of the whole frame in two extents: %v", err)
	}
}

// A write by a tenant whose grant is revoked while the write waits (for
// another reader's acknowledgement) is not applied once the revocation has
// returned: it fails with permission-denied, naming the tenant, and the
// object's next write goes ahead.
func TestNodeWriteOfARevokedWriterIsNotApplied(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	id := exportFrame(t, a, api.ModeCoherent, api.Grant{Tenant: "beta", Write: true}, api.Grant{Tenant: "gamma"})
	b := tn.importAs(t, "beta", id)
	g := tn.importAs(t, "gamma", id) // holds a lease and never acknowledges
	page := func(c *client) []byte {
		t.Helper()
		body, err := c.call(api.OpNodeObjRead, &api.NodeObjAccess{Object: id, Len: 16})
		if err != nil {
			t.Fatal(err)
		}
		return body[len(body)-16:]
	}
	before := page(g.client)
	write := b.rpc.Go(api.OpNodeObjWrite, nil, api.Encode(&api.NodeObjAccess{Object: id, Payload: bytes.Repeat([]byte{0xbe}, 16)}))
	o := tn.objectByID(id)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		o.mu.Lock()
		began := o.home.Stats().Writes == 1
		o.mu.Unlock()
		if began {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("beta's write did not reach the directory within 5s")
		}
	}
	revoke := a.rpc.Go(api.OpNodeRevoke, nil, api.Encode(&api.NodeRevoke{Object: id, Tenant: "beta"}))
	b.ack(b.next())
	if err := revoke.Wait(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, write.Wait(), api.ErrPermissionDenied, fmt.Sprint(id), `"beta"`)
	if got := page(a); !bytes.Equal(got, before) {
		t.Fatalf("after the revocation of beta's grant its write landed: %x, was %x", got, before)
	}
	body, err := a.call(api.OpNodeObjWrite, &api.NodeObjAccess{Object: id, Payload: []byte("alpha")})
	var grant api.NodeGrant
	if err == nil {
		err = api.Decode(body, &grant)
	}
	if err != nil || grant.Version != 2 {
		t.Fatalf("the exporter's write after the refused one: version %d, %v; want version 2", grant.Version, err)
	}
}

// Revoking a tenant's grant drops its pins of a versioned object, so a
// reader that pinned the most versions the node keeps no longer holds up
// the exporter's publishes once revoked.
func TestNodeRevocationDropsTheRevokedPins(t *testing.T) {
	a, b, id, publish := pinnedVersions(t)
	if _, err := b.call(api.OpNodePin, &api.NodeObject{Object: id}); err != nil {
		t.Fatalf("pin of the published version: %v", err)
	}
	wantErr(t, publish(), api.ErrQuotaExceeded, fmt.Sprint(id))
	revoke := a.rpc.Go(api.OpNodeRevoke, nil, api.Encode(&api.NodeRevoke{Object: id, Tenant: "beta"}))
	b.ack(b.next())
	if err := revoke.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := a.status().Coherence.Versions; got != 1 {
		t.Fatalf("the node keeps %d versions after the only reader was revoked, want 1", got)
	}
	if err := publish(); err != nil {
		t.Fatalf("publish after the revocation of the reader that pinned versions: %v", err)
	}
}

// A reader revoked while it holds a lease still acknowledges the
// invalidation of the page, and the write goes ahead on that
// acknowledgement rather than wait out the lease.
func TestNodeRevokedReaderAcknowledgesInvalidations(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	id := exportFrame(t, a, api.ModeCoherent, api.Grant{Tenant: "gamma"})
	g := tn.importAs(t, "gamma", id)
	if _, err := g.call(api.OpNodeObjRead, &api.NodeObjAccess{Object: id, Len: 16}); err != nil {
		t.Fatal(err)
	}
	revoke := a.rpc.Go(api.OpNodeRevoke, nil, api.Encode(&api.NodeRevoke{Object: id, Tenant: "gamma"}))
	g.ack(g.next())
	if err := revoke.Wait(); err != nil {
		t.Fatal(err)
	}
	write := a.rpc.Go(api.OpNodeObjWrite, nil, api.Encode(&api.NodeObjAccess{Object: id, Payload: []byte("alpha")}))
	var inval api.NodeInval
	select {
	case inval = <-g.invals:
	case <-time.After(5 * time.Second):
		t.Fatal("no invalidation pushed to the revoked reader within 5s")
	}
	if _, err := g.call(api.OpNodeInvalAck, &inval); err != nil {
		t.Fatalf("the revoked reader's acknowledgement: %v", err)
	}
	if err := write.Wait(); err != nil {
		t.Fatal(err)
	}
	if st := a.status().Coherence; st.Expired != 0 {
		t.Fatalf("the write waited out %d leases, although the reader acknowledged", st.Expired)
	}
}

// stuckReader connects as tenant, imports object id and reads its first
// page over and over, reading no reply, until the node can send it nothing
// more: the node's writes to it block, and it holds a lease on the page,
// fresh from the last read the node served, that it will never give up by
// acknowledging an invalidation.
func (tn *testNode) stuckReader(t *testing.T, tenant string, id uint64) {
	t.Helper()
	conn := tn.dialRaw(t)
	send := func(op wire.Op, m api.Message) error {
		return conn.WriteFrame(op, 0, 1, api.Encode(m))
	}
	if err := send(api.OpHello, mediatorHello(tenant)); err != nil {
		t.Fatal(err)
	}
	if err := send(api.OpNodeImport, &api.NodeObject{Object: id}); err != nil {
		t.Fatal(err)
	}
	// The reads back up in the node's socket once it blocks on a reply;
	// the sender stops when the connection closes.
	go func() {
		for send(api.OpNodeObjRead, &api.NodeObjAccess{Object: id, Len: PageSize}) == nil {
		}
	}()
	// The node serves no more reads: the last one's lease is fresh.
	o := tn.objectByID(id)
	reads := func() uint64 {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.home.Stats().Reads
	}
	for last, still, deadline := reads(), 0, time.Now().Add(10*time.Second); still < 5; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node still serves reads to a connection that reads no reply after 10s")
		}
		n := reads()
		if n == last && n > 0 {
			still++
		} else {
			last, still = n, 0
		}
	}
}

// A reader whose mediator reads nothing holds up a write of a page it
// leased, and a revocation of its grant, one lease at most: the node's
// pushes to it do not wait for it to read. Other connections see the
// write.
func TestNodeReaderThatDoesNotReadHoldsUpAWriteOneLease(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	id := exportFrame(t, a, api.ModeCoherent, api.Grant{Tenant: "beta"}, api.Grant{Tenant: "gamma"})
	tn.stuckReader(t, "beta", id)

	bound := ReadLease + 300*time.Millisecond // a lease, and time for a loaded machine
	timed := func(what string, call *wire.Call) {
		t.Helper()
		start := time.Now()
		select {
		case <-call.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still waits for the reader that does not read after 5s; want one lease (%v)", what, ReadLease)
		}
		if err := call.Err; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		took := time.Since(start)
		if took > bound {
			t.Fatalf("%s took %v, want one lease (%v) and at most %v", what, took, ReadLease, bound)
		}
		t.Logf("%s took %v", what, took)
	}
	timed("the write", a.rpc.Go(api.OpNodeObjWrite, nil, api.Encode(&api.NodeObjAccess{Object: id, Payload: []byte("alpha")})))
	if st := a.status().Coherence; st.Expired != 1 {
		t.Fatalf("the write waited out %d leases, want the stuck reader's", st.Expired)
	}
	g := tn.connect(t, "gamma")
	body, err := g.call(api.OpNodeObjRead, &api.NodeObjAccess{Object: id, Len: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got := body[len(body)-5:]; string(got) != "alpha" {
		t.Fatalf("another reader reads %q after the write, want %q", got, "alpha")
	}
	timed("the revocation", a.rpc.Go(api.OpNodeRevoke, nil, api.Encode(&api.NodeRevoke{Object: id, Tenant: "beta"})))
}

// An object keeps at most api.MaxGrants grants, whatever its mediator sends:
// an export with more is refused, naming the count and the bound, and
// makes no object.
func TestNodeExportGrantsAreBounded(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	f := a.alloc(0, 1)[0]
	grants := make([]api.Grant, api.MaxGrants+1)
	for i := range grants {
		grants[i] = api.Grant{Tenant: fmt.Sprintf("t%d", i)}
	}
	export := func(grants []api.Grant) error {
		_, err := a.call(api.OpNodeExport, &api.NodeExport{Extents: []api.Extent{ext(f, 0, FrameSize)}, Mode: api.ModeCoherent, Grants: grants})
		return err
	}
	wantErr(t, export(grants), api.ErrInvalidArgument, strconv.Itoa(api.MaxGrants+1), strconv.Itoa(api.MaxGrants))
	if st := tn.node.Status().Coherence; st.Objects != 0 {
		t.Fatalf("a refused export left %d objects", st.Objects)
	}
	if err := export(grants[:api.MaxGrants]); err != nil {
		t.Fatalf("export with %d grants: %v", api.MaxGrants, err)
	}
}
