package client

import (
	"encoding/json"
	"fmt"

	"github.com/vgpu/vgpu/api"
)

// Register admits a container that is being created (vgpu-hook, at
// createRuntime). The mediator decides its tenant, checks the tenant's
// quota and makes the container's socket in r.SocketDir; a refusal wraps
// api.ErrQuotaExceeded, api.ErrPermissionDenied or api.ErrInvalidArgument
// and its text says why.
func (o *Operator) Register(r api.Register) (*api.RegisterReply, error) {
	body, err := o.call(api.OpRegister, api.Encode(&r))
	if err != nil {
		return nil, err
	}
	var reply api.RegisterReply
	if err := api.Decode(body, &reply); err != nil {
		return nil, fmt.Errorf("register reply: %w", err)
	}
	return &reply, nil
}

// Release ends the registration of container id of namespace ("" for a
// container registered without one): its memory and its socket are freed
// (vgpu-hook, at poststop).
func (o *Operator) Release(namespace, container string) error {
	_, err := o.call(api.OpRelease, api.Encode(&api.Release{Container: container, Namespace: namespace}))
	return err
}

// Tenants lists the tenants of the mediator's quota file, with their use.
func (o *Operator) Tenants() ([]api.TenantInfo, error) {
	body, err := o.call(api.OpTenants)
	if err != nil {
		return nil, err
	}
	var ts []api.TenantInfo
	if err := json.Unmarshal(body, &ts); err != nil {
		return nil, fmt.Errorf("tenants reply: %v: %w", err, api.ErrProtocol)
	}
	return ts, nil
}

// Reload makes the mediator re-read its quota file. If the new file is
// invalid the mediator keeps the old one and the error says what is wrong.
func (o *Operator) Reload() error {
	_, err := o.call(api.OpReload)
	return err
}
