package statuspage

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

// snapshotAt is a status of one node with one device, a tenant with a
// session and a container, and another tenant whose name is markup.
func snapshotAt(now time.Time) Snapshot {
	return Snapshot{Time: now,
		Status: &api.Status{Socket: "/run/vgpu/mediator.sock", HostRAM: 3 << 20,
			Nodes: []api.NodeStatus{
				{Addr: "10.0.0.2:7070", Backend: "sim", Connections: 2, Devices: []api.DeviceStatus{{Index: 0, Name: "sim0", Memory: 1 << 30, Used: 256 << 20, Frames: 512, Retained: 4, Launches: 77}}},
				{Addr: "10.0.0.3:7070", Error: "dial tcp 10.0.0.3:7070: connection refused"},
			},
			Tenants: []api.TenantStatus{
				{Tenant: "alice", Session: 7, Devices: 1, Allocations: 2, Allocated: 64 << 20, Resident: 64 << 20, TLBHitRate: 0.5, Launches: 12},
				{Tenant: "<script>alert(1)</script>", Container: "0123456789abcdef", Namespace: "k8s.io", Session: 8, Allocated: 1 << 20},
			},
			Containers: []api.ContainerStatus{{Namespace: "moby", Container: "fedcba9876543210", Tenant: "alice", Memory: 1 << 30, Compute: 2, Devices: 1}}},
		Tenants: []api.TenantInfo{{Name: "alice", Memory: 2 << 30, Compute: 3, ComputeMax: 0.5, Containers: 1, Reserved: 1 << 30, Allocated: 64 << 20, Charged: 64 << 20}},
	}
}

func TestPageShowsTheStatus(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	snap := snapshotAt(now)
	hist := []Sample{
		NewSample(now.Add(-2*time.Second), snap.Status, nil),
		NewSample(now, snap.Status, nil),
	}
	var b bytes.Buffer
	if err := render(&b, "page", snap, hist, time.Minute, time.Second); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{
		"<!DOCTYPE html>", `<div id="live">`, "setTimeout(refresh,  1000 )", // the frame and its refresh
		"10.0.0.2:7070", "sim0", "1.0 GiB", "256.0 MiB", "8.0 MiB", ">77<", // the device: memory, used, retained (4 of 512 frames), launches
		"width: 25.0%", // its bar
		"unreachable: dial tcp 10.0.0.3:7070: connection refused", // the node that did not answer
		"3.0 MiB in RAM",                                                       // evicted memory on the host
		`data-tenant="alice"`, "2.0 GiB", "3 (max 50%)", "1.0 GiB", "64.0 MiB", // the tenant's quota and use
		`data-session="7"`, "50.0%", ">12<", // its session
		"k8s.io/0123456789ab",                                    // a container's session, its id cut to 12
		`data-container="fedcba9876543210"`, "moby/fedcba987654", // a registered container
		"&lt;script&gt;alert(1)&lt;/script&gt;", // a tenant's name is text, never markup
		`id="chart-tenant-memory"`, `id="chart-device-memory"`, `id="chart-device-time"`, `id="chart-launches"`,
		"-2s", // the samples' span, shorter than the window
	} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(html, "<script>alert(1)") {
		t.Errorf("a tenant's name went into the page as markup")
	}
	if t.Failed() {
		t.Log(html)
	}
	// The live part is the page's inside, without the frame.
	b.Reset()
	if err := render(&b, "live", snap, hist, time.Minute, time.Second); err != nil {
		t.Fatal(err)
	}
	if live := b.String(); strings.Contains(live, "<html") || strings.Contains(live, "setTimeout") || !strings.Contains(live, `data-tenant="alice"`) ||
		!strings.Contains(html, live) {
		t.Errorf("live part is not the page's inside:\n%s", live)
	}
}

func TestPageShowsWhyTheMediatorDidNotAnswer(t *testing.T) {
	var b bytes.Buffer
	snap := Snapshot{Time: time.Now(), Error: "dial unix /run/vgpu/mediator.sock: connect: connection refused"}
	if err := render(&b, "live", snap, nil, time.Minute, time.Second); err != nil {
		t.Fatal(err)
	}
	if html := b.String(); !strings.Contains(html, `id="error"`) || !strings.Contains(html, "connect: connection refused") || !strings.Contains(html, "No tenant.") ||
		strings.Contains(html, "No container registered.") { // no status: nothing to say about containers
		t.Errorf("page without a status:\n%s", html)
	}
}

func TestLineChartPlacesPointsInTheWindow(t *testing.T) {
	now := time.Unix(2000, 0)
	hist := []Sample{
		{Time: now.Add(-2 * time.Minute), TenantMemory: map[string]uint64{"old": 1 << 30}}, // before the window: left out
		{Time: now.Add(-time.Minute), TenantMemory: map[string]uint64{"a": 0}},
		{Time: now.Add(-30 * time.Second), TenantMemory: map[string]uint64{"a": 32 << 20, "b": 16 << 20}},
		{Time: now, TenantMemory: map[string]uint64{"a": 48 << 20}},
	}
	tenantMem := func(s Sample) map[string]uint64 { return s.TenantMemory }
	c := lineChart("t", "id", hist, []string{"a", "b"}, func(s Sample, k string) float64 { return float64(s.TenantMemory[k]) },
		ceilPow2, func(v float64) string { return api.FormatSize(uint64(v)) }, now, time.Minute)
	if c.Top != "64.0 MiB" || c.Mid != "32.0 MiB" || c.Span != "-1m" {
		t.Fatalf("axis: top %q, mid %q, span %q; want 64 MiB (48 MiB rounded up to a power of two; the 1 GiB before the window left out), 32 MiB, -1m", c.Top, c.Mid, c.Span)
	}
	if len(c.Lines) != 2 {
		t.Fatalf("%d lines, want 2", len(c.Lines))
	}
	// x: the window's start at 0, now at chartW; y: 0 at chartH, the top at 0.
	if a := c.Lines[0]; a.Name != "a" || a.Points != "0.0,150.0 300.0,75.0 600.0,37.5" || a.Last != "48.0 MiB" {
		t.Errorf("line a: %+v", a)
	}
	// b is missing from the first and last samples: 0 there.
	if b := c.Lines[1]; b.Name != "b" || b.Points != "0.0,150.0 300.0,112.5 600.0,150.0" || b.Last != "0 B" {
		t.Errorf("line b: %+v", b)
	}
	if got := seriesNames(hist, tenantMem); strings.Join(got, ",") != "a,b,old" {
		t.Errorf("series names %v", got)
	}
	// A series' colour comes from its name, not its rank: "a" keeps its
	// colour in a chart where another series comes before it.
	if ab, za := c.Lines[0].Color, lineChart("t", "id", hist, []string{"0", "a"}, func(Sample, string) float64 { return 0 }, ceil125, func(float64) string { return "" }, now, time.Minute).Lines[1].Color; ab != za || ab == "" {
		t.Errorf("series a's colour: %q first, %q second", ab, za)
	}
	// Samples of the last 30s of a window of a minute span the chart.
	short := lineChart("t", "id", hist[2:], []string{"a"}, func(s Sample, k string) float64 { return float64(s.TenantMemory[k]) },
		ceilPow2, func(v float64) string { return api.FormatSize(uint64(v)) }, now, time.Minute)
	if a := short.Lines[0]; a.Points != "0.0,75.0 600.0,37.5" || short.Span != "-30s" {
		t.Errorf("a history shorter than the window: span %s, line %+v; want -30s, from x 0 to 600", short.Span, a)
	}
	// No sample: an empty chart with an axis, not a division by zero.
	empty := lineChart("t", "id", nil, []string{"a"}, func(Sample, string) float64 { return 0 }, ceil125, func(v float64) string { return "x" }, now, time.Minute)
	if len(empty.Lines) != 1 || empty.Lines[0].Points != "" {
		t.Errorf("empty chart: %+v", empty)
	}
}

func TestAxisCeilings(t *testing.T) {
	for _, c := range []struct {
		f    func(float64) float64
		in   float64
		want float64
	}{
		{ceilPow2, 0, 1}, {ceilPow2, 1, 1}, {ceilPow2, 3, 4}, {ceilPow2, 4, 4}, {ceilPow2, 100 << 20, 128 << 20}, {ceilPow2, 1<<30 + 1, 2 << 30},
		{ceil125, 0, 1}, {ceil125, 0.5, 1}, {ceil125, 1.5, 2}, {ceil125, 3, 5}, {ceil125, 7, 10}, {ceil125, 10, 10}, {ceil125, 11, 20}, {ceil125, 4999, 5000},
	} {
		if got := c.f(c.in); got != c.want || math.IsNaN(got) {
			t.Errorf("ceiling of %v: %v, want %v", c.in, got, c.want)
		}
	}
}

// TestPageShowsGPUs: a cuda node's devices get a GPU table of their NVML
// readings (n/a where the GPU lacks one, the error where NVML could not read
// it); a page of sim devices has none.
func TestPageShowsGPUs(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	snap := snapshotAt(now)
	var b bytes.Buffer
	if err := render(&b, "page", snap, nil, time.Minute, time.Second); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), `id="gpus"`) {
		t.Errorf("a GPU table for sim devices")
	}
	st := *snap.Status
	st.Nodes = append(st.Nodes, api.NodeStatus{Addr: "gpu-host:7070", Backend: "cuda", Devices: []api.DeviceStatus{
		{Index: 0, Name: "NVIDIA H200 (GPU 3)", Memory: 8 << 30, GPU: &api.GPUStatus{Index: 3, UUID: "GPU-0a1b", Memory: 141 << 30, MemoryUsed: 9 << 30,
			Utilization: 42, TemperatureC: 55, PowerMilliwatts: 301000, ECCCorrected: 7, Unsupported: []string{"ecc uncorrected"}}},
		{Index: 1, Name: "NVIDIA H200 (GPU 4)", Memory: 8 << 30, GPU: &api.GPUStatus{Index: 4, Error: "GPU is lost"}},
	}})
	snap.Status = &st
	b.Reset()
	if err := render(&b, "page", snap, nil, time.Minute, time.Second); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{
		`<table id="gpus">`, `data-gpu="gpu-host:7070/0"`, "GPU-0a1b", ">42%<", "9.0 GiB of 141.0 GiB", "55°C", "301 W", ">7/n/a<",
		`data-gpu="gpu-host:7070/1"`, "unreadable: GPU is lost",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(html)
	}
}
