package api

// Status is what a mediator reports to operators (OpStatus, JSON body).
type Status struct {
	Socket  string         `json:"socket"`
	Nodes   []NodeStatus   `json:"nodes"`
	Tenants []TenantStatus `json:"tenants"`
	// Evicted device memory held for all sessions: in host RAM, in the
	// spill file.
	HostRAM     uint64 `json:"host_ram_bytes"`
	HostSpilled uint64 `json:"host_spilled_bytes"`
	// Cluster is the cluster as etcd has it, in cluster mode; nil otherwise.
	Cluster *ClusterStatus `json:"cluster,omitempty"`
	// Containers are the registered containers, each with what admission
	// reserved for it, whether or not a session of it is open.
	Containers []ContainerStatus `json:"containers"`
}

// ContainerStatus is one registered container and its grant.
type ContainerStatus struct {
	Namespace string `json:"namespace,omitempty"`
	Container string `json:"container"`
	Tenant    string `json:"tenant"`
	Memory    uint64 `json:"memory"`  // reserved for it, of its tenant's cap
	Compute   uint32 `json:"compute"` // fair-share weight granted
	Devices   uint32 `json:"devices"` // virtual devices granted
}

// TenantStatus is one tenant session of a mediator.
type TenantStatus struct {
	Tenant      string  `json:"tenant"`
	Container   string  `json:"container,omitempty"` // set when the session came through a container's socket
	Namespace   string  `json:"namespace,omitempty"` // that container's containerd namespace
	Session     uint64  `json:"session"`
	Devices     int     `json:"devices"`
	Allocations int     `json:"allocations"`
	Allocated   uint64  `json:"allocated_bytes"` // sum of live allocation sizes
	Mapped      uint64  `json:"mapped_bytes"`    // device memory held in frames
	Mapped4K    uint64  `json:"mapped_4k_bytes"` // allocated bytes mapped by 4 KiB pages
	Mapped64K   uint64  `json:"mapped_64k_bytes"`
	Mapped2M    uint64  `json:"mapped_2m_bytes"`
	Resident    uint64  `json:"resident_bytes"` // chunks on the device
	Evicted     uint64  `json:"evicted_bytes"`  // chunks in host memory or the spill file
	Lost        uint64  `json:"lost_bytes"`     // chunks whose device memory went with their node: their allocations fail unavailable until freed
	TLBHitRate  float64 `json:"tlb_hit_rate"`
	CopiedIn    uint64  `json:"copied_in_bytes"`
	CopiedOut   uint64  `json:"copied_out_bytes"`
	Launches    uint64  `json:"launches"`
	// SharedHits and SharedMisses count the session's reads of imported
	// shared buffers served from the host's page cache, and those that had
	// to ask the buffer's home node.
	SharedHits   uint64 `json:"shared_hits"`
	SharedMisses uint64 `json:"shared_misses"`
	// Links are the bytes of frames the session moved over each of its
	// connections: its socket, and one per node its devices are on.
	Links []LinkStatus `json:"links,omitempty"`
	// DeviceMemory is the memory of the frames the session holds on each
	// physical device behind its virtual devices, in their order.
	DeviceMemory []DeviceMemory `json:"device_memory,omitempty"`
}

// DeviceMemory is the device memory a session's frames hold on one
// physical device: Device of the node at Node.
type DeviceMemory struct {
	Node   string `json:"node"`
	Device uint32 `json:"device"`
	Held   uint64 `json:"held_bytes"`
}

// LinkStatus is what a session sent and received over one connection, frame
// headers included. Peer is "socket" for the tenant's own connection, else
// "node ADDR".
type LinkStatus struct {
	Peer     string `json:"peer"`
	Sent     uint64 `json:"sent_bytes"`
	Received uint64 `json:"received_bytes"`
}

// TenantInfo is a tenant's limits from the quota file and its current use
// (OpTenants, JSON body).
type TenantInfo struct {
	Name          string  `json:"name"`
	Memory        uint64  `json:"memory"`         // cap summed over its containers; 0: none
	Compute       uint32  `json:"compute"`        // fair-share weight
	ComputeMax    float64 `json:"compute_max"`    // share of a device it may use, 0: no cap
	Bandwidth     uint64  `json:"bandwidth"`      // bytes per second copied; 0: no cap
	MaxContainers int     `json:"max_containers"` // 0: no cap
	DefaultMemory uint64  `json:"default_memory"` // request of a container that names none
	Oversubscribe float64 `json:"oversubscribe"`
	// DedupCharge is the share of a frame charged for a sealed weight frame
	// stored once with another tenant's (1: in full).
	DedupCharge float64 `json:"dedup_charge"`
	Containers  int     `json:"containers"`      // registered now
	Reserved    uint64  `json:"reserved_bytes"`  // memory granted to its containers
	Allocated   uint64  `json:"allocated_bytes"` // memory its sessions hold
	// Charged is what its containers' and sessions' memory budgets count
	// now: Allocated less the credits for sealed weights stored once.
	Charged uint64 `json:"charged_bytes"`
	// Lost is the bytes of its sessions' allocations whose device memory
	// went with their node (TenantStatus.Lost), until they are freed.
	Lost uint64 `json:"lost_bytes"`
	// Cluster is its use over all mediators, in cluster mode; nil otherwise
	// or when etcd could not be read.
	Cluster *ClusterUse `json:"cluster,omitempty"`
}
