package client

import (
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Shared buffers: a tenant exports an allocation to named tenants, who
// import it through their own mediator, on this host or another, and copy
// to and from it like any buffer. A session that shares one is resumed
// after its mediator restarts, its exports and imports with it; an Export,
// Import, Revoke, Publish or Pin in flight then fails with ErrInterrupted
// (docs/architecture.md). Its mode says what readers may rely on
// (docs/coherence.md): api.ModeImmutable (sealed first; cached anywhere),
// api.ModeCoherent (linearizable reads and writes, page by page).

// Export shares the allocation at p, from p to its end, with the tenants
// grants name, once work already queued is done. Hand the returned name to
// the importers; it grants nothing by itself.
func (c *Client) Export(p Ptr, mode api.Mode, grants ...api.Grant) (api.Shared, error) {
	c.flushAll()
	var sh api.Shared
	body, err := c.rpc.Call(api.OpExport, nil, api.Encode(&api.Export{Addr: uint64(p), Mode: mode, Grants: grants}))
	if err == nil {
		err = api.Decode(body, &sh)
	}
	return sh, err
}

// Import maps a shared buffer into the session: copies to and from the
// returned range go through the buffer's home node. Free ends the import.
func (c *Client) Import(sh api.Shared) (Ptr, api.ImportReply, error) {
	var r api.ImportReply
	body, err := c.rpc.Call(api.OpImport, nil, api.Encode(&sh))
	if err == nil {
		err = api.Decode(body, &r)
	}
	return Ptr(r.Addr), r, err
}

// Revoke withdraws tenant's grant to the buffer exported from p: its next
// access fails with api.ErrPermissionDenied.
func (c *Client) Revoke(p Ptr, tenant string) error {
	_, err := c.rpc.Call(api.OpRevoke, nil, api.Encode(&api.Revoke{Addr: uint64(p), Tenant: tenant}))
	return err
}

// Publish makes the draft of a versioned buffer (everything written to it
// so far) its next version, once work already queued is done, and returns
// the version. Readers see it once they Pin.
func (c *Client) Publish(p Ptr) (uint64, error) { return c.version(api.OpPublish, p) }

// Pin makes reads through p (an import of a versioned buffer, or the
// buffer exported) read the latest published version from now on, and
// returns it; until p is pinned again, what it reads does not change,
// whatever writers do. Other imports of the buffer keep their versions.
func (c *Client) Pin(p Ptr) (uint64, error) { return c.version(api.OpPin, p) }

func (c *Client) version(op wire.Op, p Ptr) (uint64, error) {
	c.flushAll()
	var v api.BufVersion
	body, err := c.rpc.Call(op, nil, api.Encode(&api.At{Addr: uint64(p)}))
	if err == nil {
		err = api.Decode(body, &v)
	}
	return v.Version, err
}
