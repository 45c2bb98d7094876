package api

// The operator's wire: vgpuctl and vgpu-hook to a mediator — admission
// and release of containers, the quota file's reload, and status (JSON
// bodies: operator_status.go, operator_cluster.go; a container's own view,
// operator_self.go).

// Register admits a container that is being created. The hook sends it from
// the createRuntime hook; the mediator decides the tenant (from Tenant, set
// only by the operator's runtime configuration, else from the quota file's
// mapping of Namespace), checks the tenant's quota, and creates the
// container's own socket in SocketDir.
//
//vgpu:wire
type Register struct {
	Container string // container id
	Namespace string // containerd namespace ("moby" for Docker); with the id, names the container
	Tenant    string // from the runtime's own arguments; empty if the operator set none
	Memory    uint64 // bytes requested; 0: the tenant's default
	Compute   uint32 // weight requested; 0: the tenant's default
	Devices   uint32 // virtual devices; 0: 1
	Pid       uint32 // the container's init process, to notice it vanish
	SocketDir string // host directory, bind-mounted into the container, for its socket
}

// RegisterReply says what was granted.
//
//vgpu:wire
type RegisterReply struct {
	Tenant string
	Memory uint64
	Socket string // host path of the container's socket
}

// Release ends a container's registration. A container is named by its
// containerd namespace and id together, as in Register.
//
//vgpu:wire
type Release struct {
	Container string // container id
	Namespace string // containerd namespace; "" for a container registered without one
}
