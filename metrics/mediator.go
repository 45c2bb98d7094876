package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu/vgpu/api"
)

// MediatorSource is what a mediator reports (mediator.Mediator's methods
// of these names): nodes, devices and sessions; tenants with their limits.
type MediatorSource interface {
	Status() api.Status
	Tenants() []api.TenantInfo
}

// Metrics of a mediator's tenants and sessions.
var (
	hostEvicted = desc("vgpu_host_evicted_bytes", "Evicted device memory of all sessions held on the host, in RAM or in the spill file.", "store")

	tenantUsed      = desc("vgpu_tenant_memory_used_bytes", "Device memory the tenant's sessions hold: the sum of their live allocations.", "tenant")
	tenantCap       = desc("vgpu_tenant_memory_cap_bytes", "The tenant's memory cap from the quota file, summed over its containers; absent when it has none.", "tenant")
	tenantReserved  = desc("vgpu_tenant_memory_reserved_bytes", "Memory granted to the tenant's registered containers.", "tenant")
	tenantCharged   = desc("vgpu_tenant_memory_charged_bytes", "What the tenant's memory budgets count now: used memory less credits for sealed weights stored once.", "tenant")
	tenantResident  = desc("vgpu_tenant_memory_resident_bytes", "The tenant's allocated memory on devices now.", "tenant")
	tenantEvicted   = desc("vgpu_tenant_memory_evicted_bytes", "The tenant's allocated memory evicted to the host (RAM or spill file) now.", "tenant")
	tenantLost      = desc("vgpu_tenant_memory_lost_bytes", "The tenant's allocated memory whose device memory went with its node (a node restart, or a dropped connection not reclaimed within the node's reattach grace), until freed.", "tenant")
	tenantDevice    = desc("vgpu_tenant_device_memory_used_bytes", "Device memory the tenant's sessions hold in frames on each physical device.", "tenant", "node", "device")
	tenantCtrs      = desc("vgpu_tenant_containers", "The tenant's registered containers.", "tenant")
	tenantSessions  = desc("vgpu_tenant_sessions", "The tenant's open sessions.", "tenant")
	tenantWeight    = desc("vgpu_tenant_compute_weight", "The tenant's fair-share weight from the quota file; absent for a tenant the file does not name.", "tenant")
	tenantBandwidth = desc("vgpu_tenant_bandwidth_limit_bytes_per_second", "Cap on the bytes per second the tenant may copy; absent when it has none.", "tenant")

	sessionCopied   = desc("vgpu_session_copied_bytes_total", "Bytes the session copied between host and device memory, by direction (to_device, from_device).", "tenant", "container", "session", "direction")
	sessionLink     = desc("vgpu_session_link_bytes_total", "Bytes of frames the session moved over a link (socket: the tenant's connection; node ADDR: its connection to that node), by direction (sent, received) as the mediator sees it.", "tenant", "container", "session", "link", "direction")
	sessionLaunches = desc("vgpu_session_launches_total", "Kernel launches the session completed.", "tenant", "container", "session")
	sessionHits     = desc("vgpu_session_coherence_cache_hits_total", "Reads of imported shared buffers served from the mediator's page cache.", "tenant", "container", "session")
	sessionMisses   = desc("vgpu_session_coherence_cache_misses_total", "Reads of imported shared buffers that asked the buffer's home node.", "tenant", "container", "session")
	sessionAlloc    = desc("vgpu_session_memory_allocated_bytes", "Device memory of the session's live allocations.", "tenant", "container", "session")
)

var mediatorDescs = []*prometheus.Desc{hostEvicted, tenantUsed, tenantDevice, tenantCap, tenantReserved, tenantCharged, tenantResident, tenantEvicted,
	tenantLost, tenantCtrs, tenantSessions, tenantWeight, tenantBandwidth,
	sessionCopied, sessionLink, sessionLaunches, sessionHits, sessionMisses, sessionAlloc}

// MediatorCollector exports a mediator's status and tenants at each
// scrape, with the status of each of its nodes as the mediator sees it
// (so that a mediator with an embedded node exports that node too).
type MediatorCollector struct {
	src MediatorSource
}

// NewMediatorCollector returns the collector of src.
func NewMediatorCollector(src MediatorSource) *MediatorCollector {
	return &MediatorCollector{src: src}
}

// Describe implements prometheus.Collector.
func (c *MediatorCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range nodeDescs {
		ch <- d
	}
	for _, d := range mediatorDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *MediatorCollector) Collect(ch chan<- prometheus.Metric) {
	gauge, counter := emitters(ch)
	st := c.src.Status()
	seen := map[string]bool{} // a node listed twice is exported once: series must be unique
	for _, n := range st.Nodes {
		if !seen[n.Addr] {
			seen[n.Addr] = true
			collectNode(ch, n.Addr, n)
		}
	}
	gauge(hostEvicted, float64(st.HostRAM), "ram")
	gauge(hostEvicted, float64(st.HostSpilled), "spill")

	type sums struct {
		resident, evicted, lost float64
		sessions                int
	}
	by := map[string]*sums{}
	type onDevice struct{ tenant, node, device string }
	held := map[onDevice]float64{}
	for _, t := range st.Tenants {
		s := by[t.Tenant]
		if s == nil {
			s = &sums{}
			by[t.Tenant] = s
		}
		s.resident += float64(t.Resident)
		s.evicted += float64(t.Evicted)
		s.lost += float64(t.Lost)
		s.sessions++
		for _, d := range t.DeviceMemory {
			held[onDevice{t.Tenant, d.Node, strconv.FormatUint(uint64(d.Device), 10)}] += float64(d.Held)
		}
		l := []string{t.Tenant, t.Container, strconv.FormatUint(t.Session, 10)}
		counter(sessionCopied, float64(t.CopiedIn), append(l, "to_device")...)
		counter(sessionCopied, float64(t.CopiedOut), append(l, "from_device")...)
		for _, k := range t.Links {
			counter(sessionLink, float64(k.Sent), append(l, k.Peer, "sent")...)
			counter(sessionLink, float64(k.Received), append(l, k.Peer, "received")...)
		}
		counter(sessionLaunches, float64(t.Launches), l...)
		counter(sessionHits, float64(t.SharedHits), l...)
		counter(sessionMisses, float64(t.SharedMisses), l...)
		gauge(sessionAlloc, float64(t.Allocated), l...)
	}
	for _, t := range c.src.Tenants() {
		if by[t.Name] == nil { // a tenant without sessions: its zeros
			by[t.Name] = &sums{}
		}
		gauge(tenantUsed, float64(t.Allocated), t.Name)
		if t.Memory > 0 {
			gauge(tenantCap, float64(t.Memory), t.Name)
		}
		gauge(tenantReserved, float64(t.Reserved), t.Name)
		gauge(tenantCharged, float64(t.Charged), t.Name)
		gauge(tenantCtrs, float64(t.Containers), t.Name)
		if t.Compute > 0 { // 0: a tenant outside the quota file, weighted 1 by the nodes
			gauge(tenantWeight, float64(t.Compute), t.Name)
		}
		if t.Bandwidth > 0 {
			gauge(tenantBandwidth, float64(t.Bandwidth), t.Name)
		}
	}
	for k, v := range held {
		gauge(tenantDevice, v, k.tenant, k.node, k.device)
	}
	for name, s := range by {
		gauge(tenantResident, s.resident, name)
		gauge(tenantEvicted, s.evicted, name)
		gauge(tenantLost, s.lost, name)
		gauge(tenantSessions, float64(s.sessions), name)
	}
}
