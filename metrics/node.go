package metrics

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu/vgpu/api"
)

// desc is a metric's description: name, help, and the labels of its series
// in the order Collect gives their values.
func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// Metrics of a node's status (api.NodeStatus), exported by a node about
// itself and by a mediator about each node it uses. Their node label is the
// node's address as the mediator dials it, or the node's --listen address.
var (
	nodeUp          = desc("vgpu_node_up", "1 if the node answered its status query, else 0 (a mediator's view; a node says 1 of itself).", "node")
	nodeConnections = desc("vgpu_node_connections", "Mediator connections the node serves (one per tenant session per node, and control connections).", "node")

	deviceInfo     = desc("vgpu_device_info", "Each physical device of a node, with its name; always 1.", "node", "device", "name")
	deviceTotal    = desc("vgpu_device_memory_total_bytes", "Memory of the device.", "node", "device")
	deviceUsed     = desc("vgpu_device_memory_used_bytes", "Device memory held by tenants' frames.", "node", "device")
	deviceFree     = desc("vgpu_device_memory_free_bytes", "Device memory an allocation may have, retained frames included.", "node", "device")
	deviceRetained = desc("vgpu_device_memory_retained_bytes", "Device memory of sealed weights kept after their holders freed them, until an allocation needs it.", "node", "device")
	deviceLaunches = desc("vgpu_device_launches_total", "Kernel launches the device ran.", "node", "device")

	shareTime     = desc("vgpu_device_tenant_time_seconds_total", "Device time the node's scheduler charged to the tenant (kernel slices, fills, copies, hashing).", "node", "device", "tenant")
	shareRatio    = desc("vgpu_device_tenant_share_ratio", "The tenant's part of all device time charged on the device since the node started (0 to 1); rates of vgpu_device_tenant_time_seconds_total give it over a window.", "node", "device", "tenant")
	shareWeight   = desc("vgpu_device_tenant_weight", "The tenant's fair-share weight on the device.", "node", "device", "tenant")
	shareCap      = desc("vgpu_device_tenant_compute_max_ratio", "Cap on the tenant's share of the device (0 to 1); absent when it has none.", "node", "device", "tenant")
	shareThrottle = desc("vgpu_device_tenant_throttled", "1 while the tenant waits on its compute cap, else 0.", "node", "device", "tenant")
	shareLaunches = desc("vgpu_device_tenant_launches_total", "Kernel launches of the tenant the device's scheduler completed.", "node", "device", "tenant")

	cohObjects  = desc("vgpu_coherence_objects", "Shared objects the node is home of.", "node")
	cohReads    = desc("vgpu_coherence_reads_total", "Read requests the node's shared objects served (misses of the mediators' page caches).", "node")
	cohWrites   = desc("vgpu_coherence_writes_total", "Write requests the node's shared objects served.", "node")
	cohInvals   = desc("vgpu_coherence_invalidations_total", "Invalidations the node sent to holders of copies.", "node")
	cohAcks     = desc("vgpu_coherence_invalidation_acks_total", "Invalidations the holders acknowledged.", "node")
	cohExpired  = desc("vgpu_coherence_lease_expiries_total", "Invalidations a write stopped waiting for because the holder's lease ran out.", "node")
	cohVersions = desc("vgpu_coherence_versions", "Published versions of versioned objects the node keeps in host memory.", "node")
	cohVerBytes = desc("vgpu_coherence_version_bytes", "Size of those versions.", "node")

	// The GPU behind a cuda device, as NVML reads it at each status request
	// (api.GPUStatus); no series for other backends. A reading the GPU does
	// not offer has no series; a GPU NVML could not read has vgpu_gpu_up 0
	// and its info.
	gpuInfo     = desc("vgpu_gpu_info", "The NVIDIA GPU behind a cuda device: its NVML index, UUID, PCI bus id and MIG mode; always 1.", "node", "device", "gpu", "uuid", "pci_bus_id", "mig")
	gpuUp       = desc("vgpu_gpu_up", "1 if NVML read the GPU's telemetry at this scrape, else 0 (a GPU fallen off the bus).", "node", "device")
	gpuUtil     = desc("vgpu_gpu_utilization_ratio", "Part of the last sample period in which a kernel ran on the GPU (0 to 1), by any process.", "node", "device")
	gpuMemTotal = desc("vgpu_gpu_memory_total_bytes", "Memory of the GPU, of which the device serves part.", "node", "device")
	gpuMemUsed  = desc("vgpu_gpu_memory_used_bytes", "GPU memory used by every process on the GPU.", "node", "device")
	gpuTemp     = desc("vgpu_gpu_temperature_celsius", "Temperature of the GPU die.", "node", "device")
	gpuPower    = desc("vgpu_gpu_power_watts", "Power the GPU draws now.", "node", "device")
	gpuECC      = desc("vgpu_gpu_ecc_errors_total", "Memory ECC errors since the driver loaded (volatile), by type (corrected, uncorrected).", "node", "device", "type")
)

var nodeDescs = []*prometheus.Desc{nodeUp, nodeConnections, deviceInfo, deviceTotal, deviceUsed, deviceFree, deviceRetained, deviceLaunches,
	shareTime, shareRatio, shareWeight, shareCap, shareThrottle, shareLaunches,
	cohObjects, cohReads, cohWrites, cohInvals, cohAcks, cohExpired, cohVersions, cohVerBytes,
	gpuInfo, gpuUp, gpuUtil, gpuMemTotal, gpuMemUsed, gpuTemp, gpuPower, gpuECC}

// collectNode sends the metrics of st, the status of the node at addr.
// A status with an error (a node a mediator could not reach) gives
// vgpu_node_up 0 and nothing else.
func collectNode(ch chan<- prometheus.Metric, addr string, st api.NodeStatus) {
	gauge, counter := emitters(ch)
	if st.Error != "" {
		gauge(nodeUp, 0, addr)
		return
	}
	gauge(nodeUp, 1, addr)
	gauge(nodeConnections, float64(st.Connections), addr)
	for _, d := range st.Devices {
		dev := strconv.FormatUint(uint64(d.Index), 10)
		var frame uint64
		if d.Frames > 0 {
			frame = d.Memory / uint64(d.Frames)
		}
		gauge(deviceInfo, 1, addr, dev, d.Name)
		gauge(deviceTotal, float64(d.Memory), addr, dev)
		gauge(deviceUsed, float64(d.Used), addr, dev)
		gauge(deviceFree, float64(uint64(d.Free)*frame), addr, dev)
		gauge(deviceRetained, float64(uint64(d.Retained)*frame), addr, dev)
		counter(deviceLaunches, float64(d.Launches), addr, dev)
		if d.GPU != nil {
			collectGPU(gauge, counter, addr, dev, d.GPU)
		}
	}
	total := map[uint32]float64{} // device time charged on each device
	for _, s := range st.Shares {
		total[s.Device] += s.DeviceTime.Seconds()
	}
	for _, s := range st.Shares {
		l := []string{addr, strconv.FormatUint(uint64(s.Device), 10), s.Tenant}
		counter(shareTime, s.DeviceTime.Seconds(), l...)
		var ratio float64
		if t := total[s.Device]; t > 0 {
			ratio = s.DeviceTime.Seconds() / t
		}
		gauge(shareRatio, ratio, l...)
		gauge(shareWeight, float64(s.Weight), l...)
		if s.ComputeMax > 0 {
			gauge(shareCap, s.ComputeMax, l...)
		}
		gauge(shareThrottle, b2f(s.Throttled), l...)
		counter(shareLaunches, float64(s.Launches), l...)
	}
	c := st.Coherence
	gauge(cohObjects, float64(c.Objects), addr)
	counter(cohReads, float64(c.Reads), addr)
	counter(cohWrites, float64(c.Writes), addr)
	counter(cohInvals, float64(c.Invals), addr)
	counter(cohAcks, float64(c.InvalAcks), addr)
	counter(cohExpired, float64(c.Expired), addr)
	gauge(cohVersions, float64(c.Versions), addr)
	gauge(cohVerBytes, float64(c.VersionBytes), addr)
}

// collectGPU sends the metrics of g, the GPU behind device dev of the node
// at addr: its info and up always, each reading it offers when NVML could
// read them.
func collectGPU(gauge, counter func(d *prometheus.Desc, v float64, labels ...string), addr, dev string, g *api.GPUStatus) {
	gauge(gpuInfo, 1, addr, dev, strconv.Itoa(g.Index), g.UUID, g.PCIBusID, g.MIG)
	gauge(gpuMemTotal, float64(g.Memory), addr, dev)
	if g.Error != "" {
		gauge(gpuUp, 0, addr, dev)
		return
	}
	gauge(gpuUp, 1, addr, dev)
	// offered is whether the GPU has the reading NVML names what
	// (accelerator/gpus: Telemetry.Unsupported).
	offered := func(what string) bool { return !slices.Contains(g.Unsupported, what) }
	if offered("utilization") {
		gauge(gpuUtil, float64(g.Utilization)/100, addr, dev)
	}
	if offered("memory") {
		gauge(gpuMemUsed, float64(g.MemoryUsed), addr, dev)
	}
	if offered("temperature") {
		gauge(gpuTemp, float64(g.TemperatureC), addr, dev)
	}
	if offered("power") {
		gauge(gpuPower, float64(g.PowerMilliwatts)/1000, addr, dev)
	}
	if offered("ecc") { // a GPU without ECC has neither count
		counter(gpuECC, float64(g.ECCCorrected), addr, dev, "corrected")
		if offered("ecc uncorrected") {
			counter(gpuECC, float64(g.ECCUncorrected), addr, dev, "uncorrected")
		}
	}
}

// emitters return functions that send a gauge's and a counter's value to
// ch, with the labels of the series in its Desc's order.
func emitters(ch chan<- prometheus.Metric) (gauge, counter func(d *prometheus.Desc, v float64, labels ...string)) {
	gauge = func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter = func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	return gauge, counter
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Dedup is a node's use of content deduplication (accelerator.ContentStats).
type Dedup struct {
	Lookups uint64 // hashes asked for by dedup requests
	Hits    uint64 // of which a sealed frame was copied or aliased
	Saved   uint64 // device memory that frames stored once save now, in bytes
	Sealed  int    // frames sealed and indexed now
}

var (
	dedupLookups = desc("vgpu_dedup_lookups_total", "Sealed weight pieces mediators asked the node for by content hash.", "node")
	dedupHits    = desc("vgpu_dedup_hits_total", "Of those, pieces the node already held, so their bytes were not sent.", "node")
	dedupSaved   = desc("vgpu_dedup_saved_bytes", "Device memory saved now by storing identical sealed frames once.", "node")
	sealedFrames = desc("vgpu_sealed_frames", "Frames sealed (read-only weights) and indexed by content now.", "node")
)

// NodeCollector exports a node's own status at each scrape.
type NodeCollector struct {
	addr   string
	status func() api.NodeStatus
	dedup  func() Dedup
}

// NewNodeCollector returns the collector of the node serving at addr, whose
// status and dedup give its state (accelerator.Node's Status and
// ContentStats).
func NewNodeCollector(addr string, status func() api.NodeStatus, dedup func() Dedup) *NodeCollector {
	return &NodeCollector{addr: addr, status: status, dedup: dedup}
}

// Describe implements prometheus.Collector.
func (c *NodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range nodeDescs {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{dedupLookups, dedupHits, dedupSaved, sealedFrames} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *NodeCollector) Collect(ch chan<- prometheus.Metric) {
	collectNode(ch, c.addr, c.status())
	gauge, counter := emitters(ch)
	d := c.dedup()
	counter(dedupLookups, float64(d.Lookups), c.addr)
	counter(dedupHits, float64(d.Hits), c.addr)
	gauge(dedupSaved, float64(d.Saved), c.addr)
	gauge(sealedFrames, float64(d.Sealed), c.addr)
}
