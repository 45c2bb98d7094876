package api

import "time"

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

// NodeStatus is what a node reports (OpNodeStatus, JSON body).
type NodeStatus struct {
	Addr        string         `json:"addr"`
	Backend     string         `json:"backend"`
	Devices     []DeviceStatus `json:"devices"`
	Connections int            `json:"connections"`
	Error       string         `json:"error,omitempty"` // set by a mediator that could not reach the node
	// Shares is each tenant's use of each device, from the node's compute
	// scheduler, by device, then tenant.
	Shares []DeviceTenant `json:"shares,omitempty"`
	// Coherence counts the protocol messages of the node's shared objects.
	Coherence CoherenceStatus `json:"coherence"`
}

// CoherenceStatus is what a node's shared objects have cost since it
// started: requests served and invalidation messages, over all objects;
// and what they hold now.
type CoherenceStatus struct {
	Objects   int    `json:"objects"`
	Reads     uint64 `json:"reads"`
	Writes    uint64 `json:"writes"`
	Invals    uint64 `json:"invals"`
	InvalAcks uint64 `json:"inval_acks"`
	Expired   uint64 `json:"expired"` // invalidations a write stopped waiting for: the lease ran out
	// Versions are the published versions of versioned objects the node
	// keeps now in host memory (each object's latest and every pinned one),
	// and VersionBytes their size.
	Versions     int    `json:"versions"`
	VersionBytes uint64 `json:"version_bytes"`
}

// DeviceStatus is one physical device of a node.
type DeviceStatus struct {
	Index  uint32 `json:"index"`
	Name   string `json:"name"`
	Memory uint64 `json:"memory"`
	Used   uint64 `json:"used"`
	Frames int    `json:"frames"`
	Free   int    `json:"free_frames"` // that an allocation may have, Retained among them
	// Retained frames hold sealed contents (weights) whose holders freed
	// them, kept for a tenant that loads them again until an allocation
	// needs the memory.
	Retained int    `json:"retained_frames"`
	Launches uint64 `json:"launches"`
	// GPU is what NVML says of the GPU behind a cuda device, read when the
	// status was; nil for other backends.
	GPU *GPUStatus `json:"gpu,omitempty"`
}

// GPUStatus is one GPU as NVML describes it: what it is, and its state now.
type GPUStatus struct {
	Index    int    `json:"index"` // NVML's
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pci_bus_id"`
	MIG      string `json:"mig"` // enabled, disabled, unsupported
	// Memory is the GPU's own, of which the device serves part.
	Memory          uint64 `json:"memory"`
	MemoryUsed      uint64 `json:"memory_used"` // by every process on the GPU
	Utilization     uint32 `json:"utilization_percent"`
	TemperatureC    uint32 `json:"temperature_c"`
	PowerMilliwatts uint32 `json:"power_mw"`
	ECCCorrected    uint64 `json:"ecc_corrected"`
	ECCUncorrected  uint64 `json:"ecc_uncorrected"`
	// Unsupported names readings the GPU does not offer; Error says why
	// none could be read (a GPU fallen off the bus).
	Unsupported []string `json:"unsupported,omitempty"`
	Error       string   `json:"error,omitempty"`
}

// DeviceTenant is one tenant's share of one physical device, as the node's
// scheduler accounts it (device time measured around each kernel slice).
type DeviceTenant struct {
	Device     uint32        `json:"device"`
	Tenant     string        `json:"tenant"`
	Weight     uint32        `json:"weight"`      // fair-share weight in force
	ComputeMax float64       `json:"compute_max"` // cap on its share; 0: none
	DeviceTime time.Duration `json:"device_time_ns"`
	Slices     uint64        `json:"slices"`
	Launches   uint64        `json:"launches"`  // launches completed through the scheduler
	Throttled  bool          `json:"throttled"` // waiting on its cap now
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
	// Cluster is its use over all mediators, in cluster mode; nil otherwise
	// or when etcd could not be read.
	Cluster *ClusterUse `json:"cluster,omitempty"`
}
