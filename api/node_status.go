package api

import (
	"fmt"
	"slices"
	"time"
)

// The node's status (OpNodeStatus, JSON body): what a mediator relays to
// operators in Status.Nodes.

// NodeStatus is what a node reports (OpNodeStatus, JSON body).
type NodeStatus struct {
	Addr        string         `json:"addr"`
	Backend     string         `json:"backend"`
	Boot        string         `json:"boot,omitempty"` // random, drawn at the node's start: another at the same address means it restarted
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

// Readings formats g's readings as vgpuctl status's GPU table, top and
// the status page show them: utilization, memory used, temperature, power
// and ECC errors corrected/uncorrected (each count as count writes it);
// "unreadable" and dashes when NVML could not read the GPU, and n/a for a
// reading the GPU does not offer.
func (g *GPUStatus) Readings(count func(uint64) string) (util, used, temp, power, ecc string) {
	if g.Error != "" {
		return "unreadable", "-", "-", "-", "-"
	}
	reading := func(what, s string) string {
		if slices.Contains(g.Unsupported, what) {
			return "n/a"
		}
		return s
	}
	return reading("utilization", fmt.Sprintf("%d%%", g.Utilization)),
		reading("memory", FormatSize(g.MemoryUsed)),
		reading("temperature", fmt.Sprintf("%d°C", g.TemperatureC)),
		reading("power", fmt.Sprintf("%.0f W", float64(g.PowerMilliwatts)/1000)),
		reading("ecc", count(g.ECCCorrected)+"/"+reading("ecc uncorrected", count(g.ECCUncorrected)))
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
