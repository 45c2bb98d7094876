package accelerator

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

var testToken = strings.Repeat("7f", 16)

// attach attaches the connection with token and returns its owner id.
func (c *client) attach(token string) uint64 {
	c.t.Helper()
	body, err := c.call(api.OpNodeAttach, &api.NodeAttach{Token: token})
	if err != nil {
		c.t.Fatalf("attach: %v", err)
	}
	var r api.NodeAttached
	if err := api.Decode(body, &r); err != nil || r.Owner == 0 {
		c.t.Fatalf("attach reply %+v, %v", r, err)
	}
	return r.Owner
}

func (c *client) reclaim(o uint64, token string) (*api.NodeAttached, error) {
	body, err := c.call(api.OpNodeAttach, &api.NodeAttach{Owner: o, Token: token})
	if err != nil {
		return nil, err
	}
	var r api.NodeAttached
	return &r, api.Decode(body, &r)
}

// A dropped connection's frames, with their bytes and seals, wait for a
// reclaim that presents its token; a wrong token, another tenant, or a
// connection that holds frames already is refused and takes nothing.
func TestReattachReclaim(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "acme")
	o := a.attach(testToken)
	fs := a.alloc(0, 2)
	a.mustWrite(0, []api.Extent{ext(fs[0], 100, 1000)}, pattern(3, 1000))
	if err := a.seal(0, fs[1]); err != nil {
		t.Fatal(err)
	}
	a.rpc.Close()
	want := [testDevices]uint64{2 * FrameSize}
	// The frames stay held while the connection is gone.
	time.Sleep(50 * time.Millisecond)
	if tn.used() != want {
		t.Fatalf("used %v after the drop, want the frames kept: %v", tn.used(), want)
	}

	other := tn.connect(t, "other")
	_, err := other.reclaim(o, testToken)
	wantErr(t, err, api.ErrPermissionDenied, "tenant \"acme\"", "\"other\"")

	b := tn.connect(t, "acme")
	_, err = b.reclaim(o, strings.Repeat("00", 16))
	wantErr(t, err, api.ErrPermissionDenied, "token does not match")
	_, err = b.reclaim(o+1000, testToken)
	wantErr(t, err, api.ErrUnavailable, "keeps nothing")
	_, err = b.reclaim(o, "short")
	wantErr(t, err, api.ErrInvalidArgument, "token of 5 bytes")

	busy := tn.connect(t, "acme")
	busy.alloc(1, 1)
	_, err = busy.reclaim(o, testToken)
	wantErr(t, err, api.ErrInvalidArgument, "holds frames already")

	got, err := b.reclaim(o, testToken)
	if err != nil {
		t.Fatalf("reclaim with the right token: %v", err)
	}
	if got.Owner != o || len(got.Devices) != testDevices || !slices.Equal(got.Devices[0].Frames, fs) {
		t.Fatalf("reclaim reply %+v, want owner %d holding %#x on device 0", got, o, fs)
	}
	if r := b.mustRead(0, ext(fs[0], 100, 1000)); !bytes.Equal(r, pattern(3, 1000)) {
		t.Fatal("bytes written before the drop differ after the reclaim")
	}
	wantErr(t, b.fill(0, 1, ext(fs[1], 0, 8)), api.ErrPermissionDenied)
	if _, err := tn.connect(t, "acme").reclaim(o, testToken); err == nil {
		t.Fatal("a second reclaim of the same connection succeeded")
	}
	// The reclaimer owns them now: it frees them as its own.
	if err := b.free(0, fs...); err != nil {
		t.Fatal(err)
	}
	tn.waitUsed(t, [testDevices]uint64{0, FrameSize}) // busy's frame
	if tn.node.Expired() != 0 {
		t.Fatalf("%d expiries, want none", tn.node.Expired())
	}
}

// With no reclaim, the grace ends: the frames are scrubbed, freed, and
// the tenant leaves the node; a late reclaim is refused as unavailable.
func TestReattachGraceExpires(t *testing.T) {
	tn := startNode(t)
	tn.node.SetReattachGrace(200 * time.Millisecond)
	a := tn.connect(t, "acme")
	o := a.attach(testToken)
	fs := a.alloc(0, 3)
	a.mustWrite(0, []api.Extent{ext(fs[0], 0, 4096)}, pattern(9, 4096))
	a.rpc.Close()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for tn.node.Expired() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the grace never ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if held := time.Since(start); held < 150*time.Millisecond {
		t.Fatalf("frames released after %v, before the 200ms grace", held)
	}
	tn.waitUsed(t, [testDevices]uint64{})
	tn.node.mu.Lock()
	tenants := len(tn.node.tenants)
	tn.node.mu.Unlock()
	if tenants != 0 {
		t.Fatalf("%d tenants still counted after the expiry", tenants)
	}
	b := tn.connect(t, "acme")
	_, err := b.reclaim(o, testToken)
	wantErr(t, err, api.ErrUnavailable, "grace ended")
	// Scrubbed: whoever gets the memory next reads zeros.
	c := tn.connect(t, "next")
	got := c.alloc(0, 3)
	for _, f := range got {
		if r := c.mustRead(0, ext(f, 0, 4096)); !bytes.Equal(r, make([]byte, 4096)) {
			t.Fatalf("frame %#x holds bytes of the expired connection", f)
		}
	}
}

// A connection that never attached is freed at once, as before; so is an
// attached one on a node whose grace is 0.
func TestReattachOnlyAttached(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "acme")
	a.alloc(0, 1)
	a.rpc.Close()
	tn.waitUsed(t, [testDevices]uint64{})
	tn.node.SetReattachGrace(0)
	b := tn.connect(t, "acme")
	b.attach(testToken)
	b.alloc(0, 1)
	b.rpc.Close()
	tn.waitUsed(t, [testDevices]uint64{})
}

// A reclaim that reaches the node before the node has seen its
// predecessor drop (a mediator restarted at once after a crash) waits for
// the drop instead of finding nothing parked.
func TestReclaimWaitsForTheDrop(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "acme")
	o := a.attach(testToken)
	fs := a.alloc(0, 1)
	b := tn.connect(t, "acme")
	dropped := make(chan time.Time, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		dropped <- time.Now()
		a.rpc.Close()
	}()
	got, err := b.reclaim(o, testToken)
	if err != nil {
		t.Fatalf("reclaim of a connection still live when asked: %v", err)
	}
	// The race happened: the reclaim was asked while a was still live.
	select {
	case <-dropped:
	default:
		t.Fatal("the reclaim returned before its predecessor dropped")
	}
	if got.Owner != o || !slices.Equal(got.Devices[0].Frames, fs) {
		t.Fatalf("reclaim reply %+v, want owner %d holding %#x", got, o, fs)
	}
}

// waitParked waits until the node has parked owner o.
func (tn *testNode) waitParked(t *testing.T, o uint64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		tn.node.mu.Lock()
		p := tn.node.parked[owner(o)]
		tn.node.mu.Unlock()
		if p != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connection %d not parked within 5s", o)
		}
	}
}

// objWrite writes p at the start of object id through c, returning the
// version the node gave it.
func (c *client) objWrite(id uint64, p []byte) (uint64, error) {
	body, err := c.call(api.OpNodeObjWrite, &api.NodeObjAccess{Object: id, Payload: p})
	var g api.NodeGrant
	if err == nil {
		err = api.Decode(body, &g)
	}
	return g.Version, err
}

// objRead reads n bytes at the start of object id through c.
func (c *client) objRead(id uint64, n uint64) ([]byte, error) {
	body, err := c.call(api.OpNodeObjRead, &api.NodeObjAccess{Object: id, Len: n})
	if err != nil {
		return nil, err
	}
	return body[len(body)-int(n):], nil
}

// An object exported by an attached connection outlives its drop: the
// importer reads and writes it while the exporter is parked (a write waits
// out the lease the dead exporter's read took, at most), and the reclaimer
// is its exporter
// — it reads and writes it, and its unexport ends it, telling the
// importer.
func TestReattachKeepsExportedObjects(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "acme")
	o := a.attach(testToken)
	f := a.alloc(0, 1)[0]
	id := exportTo(t, a, api.ModeCoherent, []api.Extent{ext(f, 0, FrameSize)}, api.Grant{Tenant: "beta", Write: true})
	b := tn.importAs(t, "beta", id)
	if _, err := a.objWrite(id, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.objRead(id, 6); err != nil { // a lease held as it drops
		t.Fatal(err)
	}
	a.rpc.Close()
	tn.waitParked(t, o)
	if got, err := b.objRead(id, 6); err != nil || string(got) != "before" {
		t.Fatalf("importer read %q, %v while the exporter is parked; want \"before\"", got, err)
	}
	if _, err := b.objWrite(id, []byte("during")); err != nil {
		t.Fatalf("importer's write while the exporter is parked: %v", err)
	}

	a2 := tn.connect(t, "acme")
	got, err := a2.reclaim(o, testToken)
	if err != nil || !slices.Equal(got.Devices[0].Frames, []uint64{f}) {
		t.Fatalf("reclaim: %+v, %v; want frame %#x", got, err, f)
	}
	if got, err := a2.objRead(id, 6); err != nil || string(got) != "during" {
		t.Fatalf("reclaimer read %q, %v; want the importer's \"during\"", got, err)
	}
	if _, err := a2.objWrite(id, []byte("after!")); err != nil {
		t.Fatalf("reclaimer's write: %v", err)
	}
	if got, err := b.objRead(id, 6); err != nil || string(got) != "after!" {
		t.Fatalf("importer read %q, %v; want the reclaimer's \"after!\"", got, err)
	}
	// The raw frame is shared still: the reclaimer writes it only through
	// the object.
	wantErr(t, a2.write(0, []api.Extent{ext(f, 0, 4)}, []byte("raw!")), api.ErrPermissionDenied)

	end := a2.rpc.Go(api.OpNodeUnexport, nil, api.Encode(&api.NodeObject{Object: id}))
	if rv := b.next(); rv.Object != id || rv.Tenant != "" {
		t.Fatalf("importer told %+v, want the end of object %d", rv, id)
	} else {
		b.ack(rv)
	}
	if err := end.Wait(); err != nil {
		t.Fatalf("the reclaimer's unexport: %v", err)
	}
	_, err = b.objRead(id, 6)
	wantErr(t, err, api.ErrInvalidArgument, "freed")
	if err := a2.free(0, f); err != nil {
		t.Fatal(err)
	}
	tn.waitUsed(t, [testDevices]uint64{})
}

// A parked exporter whose grace ends with no reclaim ends its objects with
// its frames: the importer is told, and reads no more of them.
func TestReattachExpiryEndsExportedObjects(t *testing.T) {
	tn := startNode(t)
	tn.node.SetReattachGrace(100 * time.Millisecond)
	a := tn.connect(t, "acme")
	a.attach(testToken)
	id := exportFrame(t, a, api.ModeCoherent, api.Grant{Tenant: "beta"})
	b := tn.importAs(t, "beta", id)
	a.rpc.Close()
	if rv := b.next(); rv.Object != id || rv.Tenant != "" {
		t.Fatalf("importer told %+v, want the end of object %d", rv, id)
	} else {
		b.ack(rv)
	}
	for deadline := time.Now().Add(5 * time.Second); tn.node.Expired() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d expiries, want the object ended by the grace's end", tn.node.Expired())
		}
	}
	_, err := b.objRead(id, 6)
	wantErr(t, err, api.ErrInvalidArgument, "freed")
	tn.waitUsed(t, [testDevices]uint64{})
}
