package metrics

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

const mib = 1 << 20

// nodeStatus is a node of two 64 MiB devices (32 frames each) used by two
// tenants, with shared objects.
func nodeStatus() api.NodeStatus {
	return api.NodeStatus{
		Backend: "sim", Connections: 3,
		Devices: []api.DeviceStatus{
			{Index: 0, Name: "sim0", Memory: 64 * mib, Used: 6 * mib, Frames: 32, Free: 29, Retained: 1, Launches: 7},
			{Index: 1, Name: "sim1", Memory: 64 * mib, Frames: 32, Free: 32},
		},
		Shares: []api.DeviceTenant{
			{Device: 0, Tenant: "a", Weight: 1, DeviceTime: 3 * time.Second, Launches: 5},
			{Device: 0, Tenant: "b", Weight: 3, ComputeMax: 0.5, DeviceTime: time.Second, Launches: 2, Throttled: true},
		},
		Coherence: api.CoherenceStatus{Objects: 2, Reads: 10, Writes: 4, Invals: 3, InvalAcks: 2, Expired: 1, Versions: 1, VersionBytes: 4096},
	}
}

// compare checks the named metrics of c against want, in the text format.
func compare(t *testing.T, c prometheus.Collector, want string, names ...string) {
	t.Helper()
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

// lint fails t on any problem promlint (promtool's linter) finds in c.
func lint(t *testing.T, c prometheus.Collector) {
	t.Helper()
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestNodeCollector(t *testing.T) {
	dedup := func() Dedup { return Dedup{Lookups: 4, Hits: 3, Saved: 2 * mib, Sealed: 2} }
	c := NewNodeCollector("10.0.0.1:7070", nodeStatus, dedup)
	lint(t, c)
	compare(t, c, `
# HELP vgpu_node_up 1 if the node answered its status query, else 0 (a mediator's view; a node says 1 of itself).
# TYPE vgpu_node_up gauge
vgpu_node_up{node="10.0.0.1:7070"} 1
# HELP vgpu_device_memory_used_bytes Device memory held by tenants' frames.
# TYPE vgpu_device_memory_used_bytes gauge
vgpu_device_memory_used_bytes{device="0",node="10.0.0.1:7070"} 6.291456e+06
vgpu_device_memory_used_bytes{device="1",node="10.0.0.1:7070"} 0
# HELP vgpu_device_memory_retained_bytes Device memory of sealed weights kept after their holders freed them, until an allocation needs it.
# TYPE vgpu_device_memory_retained_bytes gauge
vgpu_device_memory_retained_bytes{device="0",node="10.0.0.1:7070"} 2.097152e+06
vgpu_device_memory_retained_bytes{device="1",node="10.0.0.1:7070"} 0
# HELP vgpu_device_tenant_time_seconds_total Device time the node's scheduler charged to the tenant (kernel slices, fills, copies, hashing).
# TYPE vgpu_device_tenant_time_seconds_total counter
vgpu_device_tenant_time_seconds_total{device="0",node="10.0.0.1:7070",tenant="a"} 3
vgpu_device_tenant_time_seconds_total{device="0",node="10.0.0.1:7070",tenant="b"} 1
# HELP vgpu_device_tenant_share_ratio The tenant's part of all device time charged on the device since the node started (0 to 1); rates of vgpu_device_tenant_time_seconds_total give it over a window.
# TYPE vgpu_device_tenant_share_ratio gauge
vgpu_device_tenant_share_ratio{device="0",node="10.0.0.1:7070",tenant="a"} 0.75
vgpu_device_tenant_share_ratio{device="0",node="10.0.0.1:7070",tenant="b"} 0.25
# HELP vgpu_device_tenant_compute_max_ratio Cap on the tenant's share of the device (0 to 1); absent when it has none.
# TYPE vgpu_device_tenant_compute_max_ratio gauge
vgpu_device_tenant_compute_max_ratio{device="0",node="10.0.0.1:7070",tenant="b"} 0.5
# HELP vgpu_device_tenant_throttled 1 while the tenant waits on its compute cap, else 0.
# TYPE vgpu_device_tenant_throttled gauge
vgpu_device_tenant_throttled{device="0",node="10.0.0.1:7070",tenant="a"} 0
vgpu_device_tenant_throttled{device="0",node="10.0.0.1:7070",tenant="b"} 1
# HELP vgpu_coherence_invalidations_total Invalidations the node sent to holders of copies.
# TYPE vgpu_coherence_invalidations_total counter
vgpu_coherence_invalidations_total{node="10.0.0.1:7070"} 3
# HELP vgpu_dedup_hits_total Of those, pieces the node already held, so their bytes were not sent.
# TYPE vgpu_dedup_hits_total counter
vgpu_dedup_hits_total{node="10.0.0.1:7070"} 3
`, "vgpu_node_up", "vgpu_device_memory_used_bytes", "vgpu_device_memory_retained_bytes", "vgpu_device_tenant_time_seconds_total",
		"vgpu_device_tenant_share_ratio", "vgpu_device_tenant_compute_max_ratio", "vgpu_device_tenant_throttled",
		"vgpu_coherence_invalidations_total", "vgpu_dedup_hits_total")
	// Every family the collector describes, and nothing else, is collected.
	if n := testutil.CollectAndCount(c); n != 2+6*2+5*2+1+8+4 {
		t.Errorf("collected %d series, want %d", n, 2+6*2+5*2+1+8+4)
	}
}

// fakeMediator is a mediator's status: an unreachable node and a node that
// answers, two sessions of tenant a (one in a container), one of b.
type fakeMediator struct{}

func (fakeMediator) Status() api.Status {
	return api.Status{
		Nodes: []api.NodeStatus{
			{Addr: "10.0.0.2:7070", Error: "node 10.0.0.2:7070: dial: connection refused"},
			func() api.NodeStatus { s := nodeStatus(); s.Addr = "10.0.0.1:7070"; return s }(),
		},
		Tenants: []api.TenantStatus{
			{Tenant: "a", Container: "ctr1", Session: 1, Allocated: 4 * mib, Resident: 3 * mib, Evicted: mib, CopiedIn: 100, CopiedOut: 50, Launches: 9,
				SharedHits: 6, SharedMisses: 2,
				Links:        []api.LinkStatus{{Peer: "socket", Sent: 70, Received: 140}, {Peer: "node 10.0.0.1:7070", Sent: 150, Received: 80}},
				DeviceMemory: []api.DeviceMemory{{Node: "10.0.0.1:7070", Device: 0, Held: 4 * mib}}},
			{Tenant: "a", Session: 2, Allocated: 2 * mib, Resident: 2 * mib, Lost: 2 * mib,
				DeviceMemory: []api.DeviceMemory{{Node: "10.0.0.1:7070", Device: 0, Held: 2 * mib}, {Node: "10.0.0.1:7070", Device: 1}}},
			{Tenant: "b", Session: 3},
		},
		HostRAM: mib, HostSpilled: 0,
	}
}

func (fakeMediator) Tenants() []api.TenantInfo {
	return []api.TenantInfo{
		{Name: "a", Memory: 8 * mib, Compute: 2, Containers: 1, Reserved: 8 * mib, Allocated: 6 * mib, Charged: 5 * mib},
		{Name: "b", Compute: 1},
		{Name: "idle", Compute: 1, Bandwidth: 1 << 30},
	}
}

func TestMediatorCollector(t *testing.T) {
	c := NewMediatorCollector(fakeMediator{})
	lint(t, c)
	compare(t, c, `
# HELP vgpu_node_up 1 if the node answered its status query, else 0 (a mediator's view; a node says 1 of itself).
# TYPE vgpu_node_up gauge
vgpu_node_up{node="10.0.0.1:7070"} 1
vgpu_node_up{node="10.0.0.2:7070"} 0
# HELP vgpu_tenant_memory_used_bytes Device memory the tenant's sessions hold: the sum of their live allocations.
# TYPE vgpu_tenant_memory_used_bytes gauge
vgpu_tenant_memory_used_bytes{tenant="a"} 6.291456e+06
vgpu_tenant_memory_used_bytes{tenant="b"} 0
vgpu_tenant_memory_used_bytes{tenant="idle"} 0
# HELP vgpu_tenant_device_memory_used_bytes Device memory the tenant's sessions hold in frames on each physical device.
# TYPE vgpu_tenant_device_memory_used_bytes gauge
vgpu_tenant_device_memory_used_bytes{device="0",node="10.0.0.1:7070",tenant="a"} 6.291456e+06
vgpu_tenant_device_memory_used_bytes{device="1",node="10.0.0.1:7070",tenant="a"} 0
# HELP vgpu_tenant_memory_cap_bytes The tenant's memory cap from the quota file, summed over its containers; absent when it has none.
# TYPE vgpu_tenant_memory_cap_bytes gauge
vgpu_tenant_memory_cap_bytes{tenant="a"} 8.388608e+06
# HELP vgpu_tenant_memory_evicted_bytes The tenant's allocated memory evicted to the host (RAM or spill file) now.
# TYPE vgpu_tenant_memory_evicted_bytes gauge
vgpu_tenant_memory_evicted_bytes{tenant="a"} 1.048576e+06
vgpu_tenant_memory_evicted_bytes{tenant="b"} 0
vgpu_tenant_memory_evicted_bytes{tenant="idle"} 0
# HELP vgpu_tenant_memory_lost_bytes The tenant's allocated memory whose device memory went with its node (a node restart, or a dropped connection not reclaimed within the node's reattach grace), until freed.
# TYPE vgpu_tenant_memory_lost_bytes gauge
vgpu_tenant_memory_lost_bytes{tenant="a"} 2.097152e+06
vgpu_tenant_memory_lost_bytes{tenant="b"} 0
vgpu_tenant_memory_lost_bytes{tenant="idle"} 0
# HELP vgpu_tenant_sessions The tenant's open sessions.
# TYPE vgpu_tenant_sessions gauge
vgpu_tenant_sessions{tenant="a"} 2
vgpu_tenant_sessions{tenant="b"} 1
vgpu_tenant_sessions{tenant="idle"} 0
# HELP vgpu_tenant_bandwidth_limit_bytes_per_second Cap on the bytes per second the tenant may copy; absent when it has none.
# TYPE vgpu_tenant_bandwidth_limit_bytes_per_second gauge
vgpu_tenant_bandwidth_limit_bytes_per_second{tenant="idle"} 1.073741824e+09
# HELP vgpu_session_copied_bytes_total Bytes the session copied between host and device memory, by direction (to_device, from_device).
# TYPE vgpu_session_copied_bytes_total counter
vgpu_session_copied_bytes_total{container="ctr1",direction="from_device",session="1",tenant="a"} 50
vgpu_session_copied_bytes_total{container="ctr1",direction="to_device",session="1",tenant="a"} 100
vgpu_session_copied_bytes_total{container="",direction="from_device",session="2",tenant="a"} 0
vgpu_session_copied_bytes_total{container="",direction="to_device",session="2",tenant="a"} 0
vgpu_session_copied_bytes_total{container="",direction="from_device",session="3",tenant="b"} 0
vgpu_session_copied_bytes_total{container="",direction="to_device",session="3",tenant="b"} 0
# HELP vgpu_session_link_bytes_total Bytes of frames the session moved over a link (socket: the tenant's connection; node ADDR: its connection to that node), by direction (sent, received) as the mediator sees it.
# TYPE vgpu_session_link_bytes_total counter
vgpu_session_link_bytes_total{container="ctr1",direction="received",link="node 10.0.0.1:7070",session="1",tenant="a"} 80
vgpu_session_link_bytes_total{container="ctr1",direction="received",link="socket",session="1",tenant="a"} 140
vgpu_session_link_bytes_total{container="ctr1",direction="sent",link="node 10.0.0.1:7070",session="1",tenant="a"} 150
vgpu_session_link_bytes_total{container="ctr1",direction="sent",link="socket",session="1",tenant="a"} 70
# HELP vgpu_session_coherence_cache_hits_total Reads of imported shared buffers served from the mediator's page cache.
# TYPE vgpu_session_coherence_cache_hits_total counter
vgpu_session_coherence_cache_hits_total{container="ctr1",session="1",tenant="a"} 6
vgpu_session_coherence_cache_hits_total{container="",session="2",tenant="a"} 0
vgpu_session_coherence_cache_hits_total{container="",session="3",tenant="b"} 0
# HELP vgpu_host_evicted_bytes Evicted device memory of all sessions held on the host, in RAM or in the spill file.
# TYPE vgpu_host_evicted_bytes gauge
vgpu_host_evicted_bytes{store="ram"} 1.048576e+06
vgpu_host_evicted_bytes{store="spill"} 0
`, "vgpu_node_up", "vgpu_tenant_memory_used_bytes", "vgpu_tenant_device_memory_used_bytes", "vgpu_tenant_memory_cap_bytes", "vgpu_tenant_memory_evicted_bytes",
		"vgpu_tenant_memory_lost_bytes", "vgpu_tenant_sessions", "vgpu_tenant_bandwidth_limit_bytes_per_second", "vgpu_session_copied_bytes_total",
		"vgpu_session_link_bytes_total", "vgpu_session_coherence_cache_hits_total", "vgpu_host_evicted_bytes")
}

// A node listed twice is exported once: duplicate series would fail the
// whole scrape.
func TestMediatorCollectorDuplicateNode(t *testing.T) {
	c := NewMediatorCollector(dupNodes{})
	if n := testutil.CollectAndCount(c, "vgpu_node_up"); n != 1 {
		t.Errorf("vgpu_node_up: %d series, want 1", n)
	}
}

type dupNodes struct{ fakeMediator }

func (dupNodes) Status() api.Status {
	s := nodeStatus()
	s.Addr = "n:1"
	return api.Status{Nodes: []api.NodeStatus{s, s}}
}

func TestRequests(t *testing.T) {
	r := NewRequests(true)
	r.Replied(api.OpMalloc, 20*time.Microsecond, api.CodeOK)
	r.Replied(api.OpMalloc, 3*time.Millisecond, api.CodeQuotaExceeded)
	r.Replied(api.OpRegister, time.Millisecond, api.CodeOK)
	r.Replied(api.OpRegister, time.Millisecond, api.CodeQuotaExceeded)
	r.Replied(wire.Op(9999), time.Millisecond, api.CodeProtocol) // a peer's invented operation
	r.Replied(wire.Op(127), time.Millisecond, api.CodeProtocol)  // unknown too, in the last slot
	lint(t, r)
	compare(t, r, `
# HELP vgpu_request_errors_total Requests answered with an error, by operation and error code.
# TYPE vgpu_request_errors_total counter
vgpu_request_errors_total{code="protocol_error",op="unknown"} 2
vgpu_request_errors_total{code="quota_exceeded",op="malloc"} 1
vgpu_request_errors_total{code="quota_exceeded",op="register"} 1
# HELP vgpu_admissions_total Containers admitted (registrations granted).
# TYPE vgpu_admissions_total counter
vgpu_admissions_total 1
# HELP vgpu_admission_rejections_total Containers refused at admission, by error code (quota_exceeded: over the tenant's caps).
# TYPE vgpu_admission_rejections_total counter
vgpu_admission_rejections_total{code="quota_exceeded"} 1
`, "vgpu_request_errors_total", "vgpu_admissions_total", "vgpu_admission_rejections_total")
	// Histograms: one series per operation answered, unknown ones pooled.
	if n := testutil.CollectAndCount(r, "vgpu_request_duration_seconds"); n != 3 {
		t.Errorf("vgpu_request_duration_seconds: %d series (malloc, register, unknown), want 3", n)
	}
	compare(t, r.latency.WithLabelValues("malloc").(prometheus.Collector), `
# HELP vgpu_request_duration_seconds Time from reading a request to writing its reply, by operation.
# TYPE vgpu_request_duration_seconds histogram
vgpu_request_duration_seconds_bucket{op="malloc",le="1e-05"} 0
vgpu_request_duration_seconds_bucket{op="malloc",le="4e-05"} 1
vgpu_request_duration_seconds_bucket{op="malloc",le="0.00016"} 1
vgpu_request_duration_seconds_bucket{op="malloc",le="0.00064"} 1
vgpu_request_duration_seconds_bucket{op="malloc",le="0.00256"} 1
vgpu_request_duration_seconds_bucket{op="malloc",le="0.01024"} 2
vgpu_request_duration_seconds_bucket{op="malloc",le="0.04096"} 2
vgpu_request_duration_seconds_bucket{op="malloc",le="0.16384"} 2
vgpu_request_duration_seconds_bucket{op="malloc",le="0.65536"} 2
vgpu_request_duration_seconds_bucket{op="malloc",le="2.62144"} 2
vgpu_request_duration_seconds_bucket{op="malloc",le="+Inf"} 2
vgpu_request_duration_seconds_sum{op="malloc"} 0.00302
vgpu_request_duration_seconds_count{op="malloc"} 2
`)
	// A node counts no admissions.
	if n := testutil.CollectAndCount(NewRequests(false), "vgpu_admissions_total"); n != 0 {
		t.Errorf("a node's Requests has %d admission series, want none", n)
	}
}

// The wire.Conn side: a Conn with an observer reports each reply to a
// request it read, with the time between, and the code of an error reply.
func TestConnObserver(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	r := NewRequests(false)
	server := wire.NewConn(a)
	server.Observe(r)
	client := wire.NewConn(b)
	go func() {
		for _, op := range []wire.Op{api.OpMalloc, api.OpFree} {
			if err := client.WriteFrame(op, 0, 1, nil); err != nil {
				return
			}
			h, err := client.ReadHeader()
			if err != nil {
				return
			}
			_, _ = io.CopyN(io.Discard, client.BodyReader(int(h.Len)), int64(h.Len))
		}
	}()
	h, err := server.ReadHeader()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if err := server.Reply(h); err != nil {
		t.Fatal(err)
	}
	if h, err = server.ReadHeader(); err != nil {
		t.Fatal(err)
	}
	if err := server.ReplyError(h, api.ErrInvalidAddress); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(r.errors.WithLabelValues("free", "invalid_address")); got != 1 {
		t.Errorf("errors{free, invalid_address} = %v, want 1", got)
	}
	var m dto.Metric
	if err := r.latency.WithLabelValues("malloc").(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	if n, sum := m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum(); n != 1 || sum < 0.002 {
		t.Errorf("malloc: %d observations, sum %vs; want 1 of at least the 2ms the reply waited", n, sum)
	}
}

func TestStartTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	log, _ := logtest.NewNullLogger()
	addr := l.Addr().String()
	s, err := Start(addr, log, NewRequests(false))
	if err == nil {
		s.Close()
		t.Fatalf("Start on %s, which is taken: no error", addr)
	}
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "--metrics "+addr) {
		t.Errorf("Start on taken %s: %v; want EADDRINUSE naming --metrics %s", addr, err, addr)
	}
}

// Served over HTTP; a failing collector costs its metrics, not the scrape,
// and is logged.
func TestServe(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	s, err := Start("127.0.0.1:0", log, NewNodeCollector("n:1", nodeStatus, func() Dedup { return Dedup{} }), failing{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get("http://" + s.Addr().String() + Path)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `vgpu_node_up{node="n:1"} 1`) ||
		!strings.Contains(string(body), "go_goroutines") {
		t.Errorf("GET %s: %s\n%s", Path, resp.Status, body)
	}
	var logged bool
	for _, e := range hook.AllEntries() {
		logged = logged || (e.Level == logrus.WarnLevel && strings.Contains(e.Message, "broken source"))
	}
	if !logged {
		t.Errorf("the failing collector's error was not logged: %v", hook.AllEntries())
	}
}

// failing is a collector whose source fails.
type failing struct{}

var failingDesc = desc("vgpu_test_failing", "A collector whose source fails.")

func (failing) Describe(ch chan<- *prometheus.Desc) { ch <- failingDesc }
func (failing) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(failingDesc, errors.New("broken source"))
}

// Replies observed at once from many goroutines, each operation's first
// among them racing to make its histogram, are all counted (run with -race).
func TestRequestsConcurrent(t *testing.T) {
	r := NewRequests(false)
	const goroutines, each = 8, 500
	ops := []wire.Op{api.OpMalloc, api.OpFree, api.OpLaunch, wire.Op(9999)}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				r.Replied(ops[(g+i)%len(ops)], time.Microsecond, api.CodeOK)
			}
		})
	}
	wg.Wait()
	var total uint64
	for _, op := range []string{"malloc", "free", "launch", "unknown"} {
		var m dto.Metric
		if err := r.latency.WithLabelValues(op).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		total += m.GetHistogram().GetSampleCount()
	}
	if total != goroutines*each {
		t.Errorf("%d replies observed, want %d", total, goroutines*each)
	}
	if n := testutil.CollectAndCount(r, "vgpu_request_duration_seconds"); n != len(ops) {
		t.Errorf("%d histograms, want one per operation (%d)", n, len(ops))
	}
}

// Metrics served beyond loopback are served, with a warning in the log.
func TestStartBeyondLoopbackWarns(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	s, err := Start("0.0.0.0:0", log, NewRequests(false))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if e := hook.LastEntry(); e == nil || e.Level != logrus.WarnLevel || !strings.Contains(e.Message, "beyond loopback") {
		t.Errorf("Start on %s: log %v, want a warning that it serves beyond loopback", s.Addr(), hook.AllEntries())
	}
	hook.Reset()
	s2, err := Start("127.0.0.1:0", log, NewRequests(false))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if len(hook.AllEntries()) != 0 {
		t.Errorf("Start on loopback logged %v, want nothing", hook.AllEntries())
	}
}

// gpuNode is a cuda node of three devices: an H200 with every reading, a
// GPU without power or ECC readings, and one NVML could not read.
func gpuNode() api.NodeStatus {
	s := api.NodeStatus{Backend: "cuda", Connections: 1}
	for i, g := range []*api.GPUStatus{
		{Index: 0, UUID: "GPU-aaaa", PCIBusID: "00000000:19:00.0", MIG: "disabled", Memory: 141 << 30, MemoryUsed: 70 << 30,
			Utilization: 87, TemperatureC: 64, PowerMilliwatts: 512_250, ECCCorrected: 3, ECCUncorrected: 1},
		{Index: 3, UUID: "GPU-bbbb", PCIBusID: "00000000:3b:00.0", MIG: "unsupported", Memory: 24 << 30, MemoryUsed: mib,
			Utilization: 5, TemperatureC: 41, Unsupported: []string{"power", "ecc"}},
		{Index: 5, UUID: "GPU-cccc", PCIBusID: "00000000:5d:00.0", MIG: "enabled", Memory: 141 << 30,
			Error: "NVML: GPU 5 (GPU-cccc): temperature: ERROR_GPU_IS_LOST: unavailable"},
	} {
		s.Devices = append(s.Devices, api.DeviceStatus{Index: uint32(i), Name: "cuda" + strconv.Itoa(i), Memory: 64 * mib, Frames: 32, Free: 32, GPU: g})
	}
	return s
}

// Each device's GPU is exported with the readings it has, by both
// collectors; the families lint clean.
func TestGPUMetrics(t *testing.T) {
	want := `
# HELP vgpu_gpu_info The NVIDIA GPU behind a cuda device: its NVML index, UUID, PCI bus id and MIG mode; always 1.
# TYPE vgpu_gpu_info gauge
vgpu_gpu_info{device="0",gpu="0",mig="disabled",node="10.0.0.1:7070",pci_bus_id="00000000:19:00.0",uuid="GPU-aaaa"} 1
vgpu_gpu_info{device="1",gpu="3",mig="unsupported",node="10.0.0.1:7070",pci_bus_id="00000000:3b:00.0",uuid="GPU-bbbb"} 1
vgpu_gpu_info{device="2",gpu="5",mig="enabled",node="10.0.0.1:7070",pci_bus_id="00000000:5d:00.0",uuid="GPU-cccc"} 1
# HELP vgpu_gpu_up 1 if NVML read the GPU's telemetry at this scrape, else 0 (a GPU fallen off the bus).
# TYPE vgpu_gpu_up gauge
vgpu_gpu_up{device="0",node="10.0.0.1:7070"} 1
vgpu_gpu_up{device="1",node="10.0.0.1:7070"} 1
vgpu_gpu_up{device="2",node="10.0.0.1:7070"} 0
# HELP vgpu_gpu_utilization_ratio Part of the last sample period in which a kernel ran on the GPU (0 to 1), by any process.
# TYPE vgpu_gpu_utilization_ratio gauge
vgpu_gpu_utilization_ratio{device="0",node="10.0.0.1:7070"} 0.87
vgpu_gpu_utilization_ratio{device="1",node="10.0.0.1:7070"} 0.05
# HELP vgpu_gpu_memory_total_bytes Memory of the GPU, of which the device serves part.
# TYPE vgpu_gpu_memory_total_bytes gauge
vgpu_gpu_memory_total_bytes{device="0",node="10.0.0.1:7070"} 1.51397597184e+11
vgpu_gpu_memory_total_bytes{device="1",node="10.0.0.1:7070"} 2.5769803776e+10
vgpu_gpu_memory_total_bytes{device="2",node="10.0.0.1:7070"} 1.51397597184e+11
# HELP vgpu_gpu_memory_used_bytes GPU memory used by every process on the GPU.
# TYPE vgpu_gpu_memory_used_bytes gauge
vgpu_gpu_memory_used_bytes{device="0",node="10.0.0.1:7070"} 7.516192768e+10
vgpu_gpu_memory_used_bytes{device="1",node="10.0.0.1:7070"} 1.048576e+06
# HELP vgpu_gpu_temperature_celsius Temperature of the GPU die.
# TYPE vgpu_gpu_temperature_celsius gauge
vgpu_gpu_temperature_celsius{device="0",node="10.0.0.1:7070"} 64
vgpu_gpu_temperature_celsius{device="1",node="10.0.0.1:7070"} 41
# HELP vgpu_gpu_power_watts Power the GPU draws now.
# TYPE vgpu_gpu_power_watts gauge
vgpu_gpu_power_watts{device="0",node="10.0.0.1:7070"} 512.25
# HELP vgpu_gpu_ecc_errors_total Memory ECC errors since the driver loaded (volatile), by type (corrected, uncorrected).
# TYPE vgpu_gpu_ecc_errors_total counter
vgpu_gpu_ecc_errors_total{device="0",node="10.0.0.1:7070",type="corrected"} 3
vgpu_gpu_ecc_errors_total{device="0",node="10.0.0.1:7070",type="uncorrected"} 1
`
	names := []string{"vgpu_gpu_info", "vgpu_gpu_up", "vgpu_gpu_utilization_ratio", "vgpu_gpu_memory_total_bytes", "vgpu_gpu_memory_used_bytes",
		"vgpu_gpu_temperature_celsius", "vgpu_gpu_power_watts", "vgpu_gpu_ecc_errors_total"}
	node := NewNodeCollector("10.0.0.1:7070", gpuNode, func() Dedup { return Dedup{} })
	med := NewMediatorCollector(gpuMediator{})
	for name, c := range map[string]prometheus.Collector{"node": node, "mediator": med} {
		t.Run(name, func(t *testing.T) {
			lint(t, c)
			compare(t, c, want, names...)
		})
	}
	// A sim node has none of them.
	if n := testutil.CollectAndCount(NewNodeCollector("10.0.0.1:7070", nodeStatus, func() Dedup { return Dedup{} }), names...); n != 0 {
		t.Errorf("a sim node exports %d GPU series, want none", n)
	}
}

// gpuMediator is a mediator whose one node is gpuNode.
type gpuMediator struct{}

func (gpuMediator) Status() api.Status {
	s := gpuNode()
	s.Addr = "10.0.0.1:7070"
	return api.Status{Nodes: []api.NodeStatus{s}}
}

func (gpuMediator) Tenants() []api.TenantInfo { return nil }
