package accelerator

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// A restored object comes in pieces, in order, and exists once the last
// is in: published at the version named, granted as sent, the restorer
// its exporter, whose tenant an import names. It serves pins and reads of
// that version and refuses writes and publishes; pieces out of order, past
// the size, an id that is live, and more than MaxRestoreBytes are refused,
// typed, naming what is wrong; it ends with its exporter's connection.
func TestNodeRestoreMakesAVersionOnlyObject(t *testing.T) {
	tn := startNode(t)
	a := tn.connect(t, "alpha")
	const id, size = 77, PageSize + 100
	data := bytes.Repeat([]byte("restored"), size/8+1)[:size]
	piece := func(c *client, off, n uint64) error {
		_, err := c.call(api.OpNodeRestore, &api.NodeRestore{Object: id, Version: 5, Size: size,
			Grants: []api.Grant{{Tenant: "beta"}}, Off: off, Payload: data[off : off+n]})
		return err
	}
	if err := piece(a, 0, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := a.call(api.OpNodeImport, &api.NodeObject{Object: id}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("import of an object half restored: %v, want it not to exist yet", err)
	}
	wantErr(t, piece(a, 2000, 10), api.ErrInvalidArgument, "offset 2000", "not the next one")
	if err := piece(a, 0, 1000); err != nil { // begun anew
		t.Fatal(err)
	}
	if err := piece(a, 1000, size-1000); err != nil {
		t.Fatal(err)
	}

	b := tn.importAs(t, "beta", id)
	body, err := b.call(api.OpNodeImport, &api.NodeObject{Object: id})
	var ir api.NodeImportReply
	if err == nil {
		err = api.Decode(body, &ir)
	}
	if err != nil || ir.Mode != api.ModeVersioned || ir.Size != size || ir.Write || ir.Exporter != "alpha" {
		t.Fatalf("import of the restored object: %+v, %v; want versioned, %d bytes, read-only, exported by alpha", ir, err, size)
	}
	if v := pinned(t, b.client, id); v != 5 {
		t.Fatalf("pinned version %d, want the restored 5", v)
	}
	got := make([]byte, api.NodeGrantSize+100)
	if _, err := b.rpc.Call(api.OpNodeObjRead, got, api.Encode(&api.NodeObjAccess{Object: id, Version: 5, Off: PageSize, Len: 100})); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[api.NodeGrantSize:], data[PageSize:]) {
		t.Fatal("the restored version's second page reads other bytes than were sent")
	}
	_, err = a.rpc.Call(api.OpNodeObjWrite, nil, api.Encode(&api.NodeObjAccess{Object: id}), []byte("x"))
	wantErr(t, err, api.ErrUnavailable, "restored after its node restarted", "no writes")
	_, err = a.call(api.OpNodePublish, &api.NodeObject{Object: id})
	wantErr(t, err, api.ErrUnavailable, "no publish")
	if _, err := tn.connect(t, "gamma").call(api.OpNodeImport, &api.NodeObject{Object: id}); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("import by a tenant not granted: %v, want permission denied", err)
	}

	wantErr(t, piece(a, 0, size), api.ErrInvalidArgument, "an object of that id is live")
	_, err = a.call(api.OpNodeRestore, &api.NodeRestore{Object: 78, Version: 1, Size: MaxRestoreBytes})
	wantErr(t, err, api.ErrQuotaExceeded, "at most 1073741824")
	_, err = a.call(api.OpNodeRestore, &api.NodeRestore{Object: 79, Version: 1, Size: 10, Payload: make([]byte, 11)})
	wantErr(t, err, api.ErrInvalidArgument, "11 bytes at offset 0 run past its 10")
	_, err = a.call(api.OpNodeRestore, &api.NodeRestore{Object: 80, Version: 0, Size: 10})
	wantErr(t, err, api.ErrInvalidArgument, "version 0")

	a.rpc.Close() // its exporter's connection ends: so does the object, and its importer hears
	if m := b.next(); m.Object != id || m.Tenant != "" {
		t.Fatalf("push %+v, want the end of object %d", m, id)
	}
}
