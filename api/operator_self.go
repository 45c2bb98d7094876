package api

import "time"

// SelfStatus is what a container may read about itself over its own
// socket (OpSelf, JSON body): its grant, its virtual devices, its tenant's
// limits and its own sessions. It holds nothing of another container or
// tenant: not a physical device's total use, which on a shared device would
// tell one tenant how much the others use.
type SelfStatus struct {
	Tenant    string `json:"tenant"`
	Container string `json:"container"`
	Namespace string `json:"namespace,omitempty"`
	// Memory is what the container may allocate: its grant, times its
	// tenant's oversubscription; Resident of it may be on devices at once.
	Memory   uint64 `json:"memory"`
	Resident uint64 `json:"resident_memory"`
	// Charged is what its memory budget counts now: its sessions'
	// allocations, less the credit for sealed weights stored once.
	Charged uint64 `json:"charged_bytes"`
	// Its tenant's limits from the quota file (0: none).
	Compute    uint32         `json:"compute"` // fair-share weight on each device
	ComputeMax float64        `json:"compute_max"`
	Bandwidth  uint64         `json:"bandwidth"` // bytes per second copied
	Devices    []SelfDevice   `json:"devices"`
	Sessions   []TenantStatus `json:"sessions"`
}

// SelfDevice is one virtual device of a container: the granted count, in
// the order its sessions see them.
type SelfDevice struct {
	Index uint32 `json:"index"`
	// Name and Node are those of the physical device behind it, for the
	// container's first session; empty while it has none.
	Name string `json:"name,omitempty"`
	Node string `json:"node,omitempty"`
	// Memory is what the device reports to the container's sessions: the
	// memory it may use, not the physical device's.
	Memory uint64 `json:"memory"`
	Used   uint64 `json:"used"` // held in frames by its sessions on this device
	// DeviceTime and Launches are its tenant's on the physical devices
	// behind it, as their nodes' schedulers account them (by tenant, since
	// the node shares device time by tenant); Throttled: waiting on the
	// tenant's compute cap now.
	DeviceTime time.Duration `json:"device_time_ns"`
	Launches   uint64        `json:"launches"`
	Throttled  bool          `json:"throttled"`
}
