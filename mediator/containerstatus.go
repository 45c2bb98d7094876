package mediator

import "github.com/vgpu/vgpu/api"

// containerStatus is every registered container's grant, for Status: what
// admission reserved for it, sorted by namespace, then container id.
func (m *Mediator) containerStatus() []api.ContainerStatus {
	gs := m.admission.Grants()
	out := make([]api.ContainerStatus, len(gs))
	for i, g := range gs {
		out[i] = api.ContainerStatus{Namespace: g.Namespace, Container: g.Container, Tenant: g.Tenant,
			Memory: g.Memory, Compute: g.Compute, Devices: g.Devices}
	}
	return out
}
