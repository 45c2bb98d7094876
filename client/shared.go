package client

import (
	"github.com/vgpu/vgpu/api"
)

// Shared buffers: a tenant exports an allocation to named tenants, who
// import it through their own mediator, on this host or another, and copy
// to and from it like any buffer. Its mode says what readers may rely on
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
