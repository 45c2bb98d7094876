package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/internal/testenv"
	"github.com/vgpu/vgpu/metrics"
)

// scrape is one GET of a daemon's /metrics: the text, and its families.
type scrape struct {
	text     string
	families map[string]*dto.MetricFamily
}

func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	c := http.Client{Timeout: 20 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s, %v\n%s", addr, resp.Status, err, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("scrape %s: parse: %v\n%s", addr, err, body)
	}
	return scrape{text: string(body), families: fams}
}

// value is the value of the series of name whose labels include want; it
// fails t unless exactly one series matches.
func (s scrape) value(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	var found []float64
	for _, m := range s.families[name].GetMetric() {
		match := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match != len(want) {
			continue
		}
		switch {
		case m.Gauge != nil:
			found = append(found, m.GetGauge().GetValue())
		case m.Counter != nil:
			found = append(found, m.GetCounter().GetValue())
		case m.Histogram != nil:
			found = append(found, float64(m.GetHistogram().GetSampleCount()))
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s%v: %d series match, want 1", name, want, len(found))
	}
	return found[0]
}

// promtool runs promtool check metrics on a scrape's text.
func promtool(t *testing.T, what string, s scrape) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Missing(t, "promtool (Debian's prometheus package) is not installed")
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(s.text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on %s's scrape: %v\n%s", what, err, out)
	}
}

// TestMetricsLiveScrape starts a vgpu-node and a vgpu-mediator with
// --metrics, does a tenant's work and a container's admission and refusal,
// and checks that both scrapes show that work: the tenant's memory is what
// it allocated, its launches and copies are counted on both daemons,
// refused requests by code, admissions; promtool accepts both scrapes;
// scrapes during quota reloads (SIGHUP) all succeed and see the reload;
// connections that stall the metrics listener do not stop tenants being
// served; and every metric the Grafana dashboard queries is in a scrape.
func TestMetricsLiveScrape(t *testing.T) {
	nodeAddr, nodeMetrics, medMetrics := freePort(t), freePort(t), freePort(t)
	startNodeAt(t, nodeAddr, "--devices", "1", "--memory", "256MiB", "--metrics", nodeMetrics)
	dir := t.TempDir()
	quota := filepath.Join(dir, "tenants.toml")
	writeQuota := func(capMiB int) {
		t.Helper()
		q := fmt.Sprintf("[tenants.alice]\nmemory = \"%dMiB\"\n", capMiB)
		if err := os.WriteFile(quota, []byte(q), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeQuota(64)
	socket := filepath.Join(dir, "m.sock")
	startProc(t, "vgpu-mediator", "--socket", socket, "--node", nodeAddr, "--state-dir", dir, "--container-dir", filepath.Join(dir, "c"),
		"--quota", quota, "--containerd", "", "--log-level", "warn", "--metrics", medMetrics)
	waitFor(t, "vgpu-mediator to serve on its socket", func() bool { return daemon.Serving(socket) })

	// The tenant's work: 6 MiB in whole 2 MiB pages, a 1 MiB copy in, two
	// launches, and one refused free.
	c, err := client.Dial(client.Options{Socket: socket, Tenant: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := c.Malloc(0, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Malloc(0, 2<<20); err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	s.CopyToDevice(a, bytes.Repeat([]byte{7}, 1<<20))
	s.Launch("fill_f32", client.Buf(a), client.I64(1024), client.F32(1))
	s.Launch("fill_f32", client.Buf(a), client.I64(1024), client.F32(2))
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(a + 4096); !errors.Is(err, api.ErrInvalidAddress) {
		t.Fatalf("free inside an allocation: %v, want invalid address", err)
	}
	// A container admitted and one refused: over alice's 64 MiB.
	if _, err := register(t, socket, api.Register{Container: "ok", Namespace: "moby", Tenant: "alice", Memory: 16 << 20}); err != nil {
		t.Fatalf("register within the cap: %v", err)
	}
	if _, err := register(t, socket, api.Register{Container: "big", Namespace: "moby", Tenant: "alice", Memory: 1 << 30}); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("register over the cap: %v, want quota exceeded", err)
	}

	// The node's frames hold what the mediator's session maps.
	mapped := 0.0
	for _, ts := range status(t, socket).Tenants {
		mapped += float64(ts.Mapped)
	}
	med := scrapeMetrics(t, medMetrics)
	alice := map[string]string{"tenant": "alice"}
	session := map[string]string{"tenant": "alice", "session": fmt.Sprint(c.Session())}
	dev := map[string]string{"node": nodeAddr, "device": "0"}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vgpu_tenant_memory_used_bytes", alice, 6 << 20},
		{"vgpu_tenant_memory_cap_bytes", alice, 64 << 20},
		{"vgpu_tenant_device_memory_used_bytes", map[string]string{"tenant": "alice", "node": nodeAddr, "device": "0"}, mapped},
		{"vgpu_tenant_memory_reserved_bytes", alice, 16 << 20},
		{"vgpu_tenant_sessions", alice, 1},
		{"vgpu_tenant_containers", alice, 1},
		{"vgpu_session_launches_total", session, 2},
		{"vgpu_session_copied_bytes_total", map[string]string{"session": session["session"], "direction": "to_device"}, 1 << 20},
		{"vgpu_node_up", map[string]string{"node": nodeAddr}, 1},
		{"vgpu_device_tenant_launches_total", map[string]string{"node": nodeAddr, "device": "0", "tenant": "alice"}, 2},
		{"vgpu_request_errors_total", map[string]string{"op": "free", "code": "invalid_address"}, 1},
		{"vgpu_request_duration_seconds", map[string]string{"op": "malloc"}, 2},
		{"vgpu_admissions_total", nil, 1},
		{"vgpu_admission_rejections_total", map[string]string{"code": "quota_exceeded"}, 1},
	} {
		if got := med.value(t, tc.name, tc.labels); got != tc.want {
			t.Errorf("mediator: %s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	// The copy went to the node over the session's link to it.
	if got := med.value(t, "vgpu_session_link_bytes_total", map[string]string{"session": session["session"], "link": "node " + nodeAddr, "direction": "sent"}); got < 1<<20 {
		t.Errorf("mediator: bytes sent to node %s = %v, want at least the 1 MiB copied", nodeAddr, got)
	}

	node := scrapeMetrics(t, nodeMetrics)
	if got := node.value(t, "vgpu_device_launches_total", dev); got != 2 {
		t.Errorf("node: launches = %v, want 2", got)
	}
	if got := node.value(t, "vgpu_device_tenant_launches_total", map[string]string{"tenant": "alice"}); got != 2 {
		t.Errorf("node: alice's launches = %v, want 2", got)
	}
	if got := node.value(t, "vgpu_device_memory_used_bytes", dev); got != mapped || got < 6<<20 {
		t.Errorf("node: device memory used = %v, want the %v bytes the session maps (at least its 6 MiB)", got, mapped)
	}
	if got := node.value(t, "vgpu_device_tenant_time_seconds_total", map[string]string{"tenant": "alice"}); got <= 0 {
		t.Errorf("node: alice's device time = %v, want more than 0 after two launches", got)
	}
	if got := node.value(t, "vgpu_request_duration_seconds", map[string]string{"op": "node-alloc"}); got < 1 {
		t.Errorf("node: node-alloc requests timed = %v, want at least 1", got)
	}
	promtool(t, "the mediator", med)
	promtool(t, "the node", node)

	t.Run("ScrapeDuringReload", func(t *testing.T) {
		pid := serverPid(t, socket)
		for i := range 10 {
			writeQuota(64 + 32*(i%2))
			if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			if got := scrapeMetrics(t, medMetrics).value(t, "vgpu_tenant_memory_used_bytes", alice); got != 6<<20 {
				t.Fatalf("scrape %d during a reload: alice uses %v, want 6 MiB", i, got)
			}
		}
		// The last reload (96 MiB) is seen.
		waitFor(t, "the reloaded cap in a scrape", func() bool {
			return scrapeMetrics(t, medMetrics).value(t, "vgpu_tenant_memory_cap_bytes", alice) == 96<<20
		})
	})

	t.Run("StalledScrapersDoNotStopTenants", func(t *testing.T) {
		// Connections that send half a request and stall, and one that
		// sends nothing, to both listeners.
		for _, addr := range []string{medMetrics, nodeMetrics} {
			for range 20 {
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				fmt.Fprintf(nc, "GET /metrics HTTP/1.1\r\nHost: x\r\n")
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			p, err := c.Malloc(0, 2<<20)
			if err == nil {
				err = c.Free(p)
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a tenant's malloc and free while scrapers stall: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("a tenant's malloc and free did not complete within 30s while scrapers stall")
		}
		scrapeMetrics(t, medMetrics) // and other scrapers are still served
		scrapeMetrics(t, nodeMetrics)
	})

	t.Run("GrafanaDashboard", func(t *testing.T) {
		checkDashboard(t, "../deploy/grafana/vgpu.json", med, node, cudaNodeMetrics(t))
	})
}

// cudaNodeMetrics is what a cuda node's collector exports of the GPU behind
// its device, restricted to the vgpu_gpu_ families that only a cuda device
// has: the sim node the test runs has no GPU, so the dashboard's GPU panels
// are checked against metrics.NodeCollector over a status whose device
// carries one, as vgpu-node --backend cuda reports it.
func cudaNodeMetrics(t *testing.T) scrape {
	t.Helper()
	st := api.NodeStatus{Backend: "cuda", Devices: []api.DeviceStatus{{Index: 0, Name: "NVIDIA H200", Memory: 140 << 30, Frames: 71680, Free: 71680,
		GPU: &api.GPUStatus{UUID: "GPU-aaaa", PCIBusID: "00000000:19:00.0", MIG: "disabled", Memory: 141 << 30, MemoryUsed: 1 << 30,
			Utilization: 50, TemperatureC: 60, PowerMilliwatts: 300_000, ECCCorrected: 1}}}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewNodeCollector("gpu-host:7070", func() api.NodeStatus { return st }, func() metrics.Dedup { return metrics.Dedup{} }))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	s := scrape{families: map[string]*dto.MetricFamily{}}
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "vgpu_gpu_") {
			s.families[f.GetName()] = f
		}
	}
	if len(s.families) == 0 {
		t.Fatal("a cuda node's collector exports no vgpu_gpu_ metric")
	}
	return s
}

// checkDashboard checks that every vgpu_ metric a Grafana dashboard's
// queries name is in one of the scrapes (a histogram's _bucket, _sum and
// _count by its family), and that it queries some.
func checkDashboard(t *testing.T, path string, scrapes ...scrape) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	name := regexp.MustCompile(`\bvgpu_[a-z0-9_]+`)
	var queried []string
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			for _, m := range name.FindAllString(q.Expr, -1) {
				if !slices.Contains(queried, m) {
					queried = append(queried, m)
				}
				fam := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if f := strings.TrimSuffix(m, suffix); f != m {
						if _, ok := scrapes[0].families[f]; ok {
							fam = f
						}
					}
				}
				found := false
				for _, s := range scrapes {
					_, ok := s.families[fam]
					found = found || ok
				}
				if !found {
					t.Errorf("%s: panel %q queries %s, which no scrape has", path, p.Title, m)
				}
			}
		}
	}
	if len(queried) < 10 {
		t.Errorf("%s: the dashboard queries %d vgpu metrics (%v), want a dashboard's worth", path, len(queried), queried)
	}
}

// TestMetricsPortTaken: a daemon whose --metrics address is taken refuses to
// start, saying which address, at once.
func TestMetricsPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().String()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"vgpu-node", "--listen", freePort(t), "--memory", "64MiB", "--metrics", taken},
		{"vgpu-mediator", "--socket", filepath.Join(dir, "m.sock"), "--embedded-memory", "64MiB", "--state-dir", "", "--quota", "",
			"--containerd", "", "--metrics", taken},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, filepath.Join(bin, args[0]), args[1:]...).CombinedOutput()
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "--metrics "+taken) ||
			!strings.Contains(string(out), "address already in use") {
			t.Errorf("%s --metrics %s (taken): %v, want exit 1 naming the address as in use\n%s", args[0], taken, err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "m.sock")); !os.IsNotExist(err) {
		t.Errorf("the mediator that refused to start left its socket: %v", err)
	}
}
