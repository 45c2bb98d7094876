package accelerator

import (
	"testing"

	"github.com/vgpu/vgpu/api"
)

// A connection that reclaims another's restored objects may hold more
// than MaxRestoreBytes of them: it then restores nothing more, refused
// typed and naming the bytes, rather than taking the excess for room.
func TestRestoreBoundAfterReclaim(t *testing.T) {
	was := MaxRestoreBytes
	MaxRestoreBytes = 3 * PageSize
	t.Cleanup(func() { MaxRestoreBytes = was })
	tn := startNode(t)
	restore := func(c *client, id uint64, size int) error {
		_, err := c.call(api.OpNodeRestore, &api.NodeRestore{Object: id, Version: 1, Size: uint64(size),
			Payload: make([]byte, size)})
		return err
	}
	a := tn.connect(t, "acme")
	o := a.attach(testToken)
	if err := restore(a, 91, 2*PageSize); err != nil {
		t.Fatal(err)
	}
	a.rpc.Close()
	tn.waitParked(t, o)
	b := tn.connect(t, "acme")
	if err := restore(b, 92, 2*PageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := b.call(api.OpNodeAttach, &api.NodeAttach{Owner: o, Token: testToken}); err != nil {
		t.Fatalf("reclaim: %v", err)
	}
	wantErr(t, restore(b, 93, PageSize), api.ErrQuotaExceeded, "restored objects have 262144", "at most 196608")
}
