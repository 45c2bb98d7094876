package main

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/isolation"
)

// A busy cluster's status, with every name as long as operators make them
// and every counter large.
func bigStatus() *api.Status {
	id := strings.Repeat("0123456789abcdef", 4) // a container id: 64 hex digits
	st := &api.Status{HostRAM: 1000 << 30, HostSpilled: 3 << 40}
	for i, addr := range []string{"accelerator-host-17.rack-b.cluster.example.com:7070", "10.200.30.40:7070"} {
		n := api.NodeStatus{Addr: addr, Backend: "cuda"}
		for d := range 2 {
			n.Devices = append(n.Devices, api.DeviceStatus{Index: uint32(d), Name: "NVIDIA H200 NVL 141GB HBM3e PCIe",
				Memory: 141 << 30, Used: 1023 << 30 / 8, Frames: 72192, Retained: 1000, Launches: 98_765_432_101_234 * uint64(i+1),
				GPU: &api.GPUStatus{Index: 15, UUID: "GPU-0b6e4c2a-9f3d-4e1b-8c7a-5d2f1e0a9b8c", PCIBusID: "00000000:E3:00.0", MIG: "unsupported",
					Memory: 1023 << 30, MemoryUsed: 1023 << 30, Utilization: 100, TemperatureC: 105, PowerMilliwatts: 1_000_000,
					ECCCorrected: 18_446_744_073_709_551_615, ECCUncorrected: 18_446_744_073_709_551_615}})
		}
		st.Nodes = append(st.Nodes, n)
	}
	st.Nodes = append(st.Nodes, api.NodeStatus{Addr: "accelerator-host-18.rack-b.cluster.example.com:7070",
		Error: "dial tcp 10.200.30.41:7070: connect: connection refused (down since 2026-12-01T19:00:00Z)"})
	for i, ns := range []string{"k8s.io", "moby", "a-very-long-containerd-namespace"} {
		tenant := []string{"research-group-computer-vision-and-robotics", "team-a", "inference-production-eu-west"}[i]
		st.Containers = append(st.Containers, api.ContainerStatus{Namespace: ns, Container: id, Tenant: tenant,
			Memory: 1000 << 30, Compute: 4_000_000, Devices: 8})
		for s := range 2 {
			st.Tenants = append(st.Tenants, api.TenantStatus{Tenant: tenant, Container: id, Namespace: ns, Session: uint64(1_000_000 + 10*i + s),
				Devices: 8, Allocations: 123456, Allocated: 1000 << 30, Mapped4K: 999 << 20, Mapped64K: 1000 << 20, Mapped2M: 1000 << 30,
				Resident: 1000 << 30, Evicted: 1023 << 30, Lost: 1022 << 30, TLBHitRate: 0.999, CopiedIn: 5 << 50, CopiedOut: 1 << 50, Launches: 18_446_744_073_709_551_615})
		}
	}
	st.Tenants = append(st.Tenants, api.TenantStatus{Tenant: "host-tenant-without-a-container-but-a-long-name", Session: 7})
	return st
}

// The default view fits 100 columns whatever the names and numbers; the
// wide one has every name whole, and both show each container's
// reservation.
func TestStatusFits100Columns(t *testing.T) {
	st := bigStatus()
	var narrow, wide strings.Builder
	if err := renderStatus(&narrow, st, false); err != nil {
		t.Fatal(err)
	}
	if err := renderStatus(&wide, st, true); err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(narrow.String(), "\n") {
		if n := utf8.RuneCountInString(l); n > statusWidth {
			t.Errorf("line %d is %d columns:\n%s", i+1, n, l)
		}
	}
	t.Logf("default view:\n%s", narrow.String())
	for _, want := range []string{"RESERVED", "1000.0 GiB", "ECC CORR/UNCORR", "18.4E/18.4E", "k8s.io/0123456789ab", "a-very…/0123456789ab", "research-group-…", "unreachable", "98.8T"} {
		if !strings.Contains(narrow.String(), want) {
			t.Errorf("default view lacks %q", want)
		}
	}
	for _, want := range []string{st.Containers[0].Tenant, "a-very-long-containerd-namespace/" + st.Containers[0].Container,
		st.Nodes[0].Addr, st.Nodes[0].Devices[0].Name, st.Nodes[2].Error, "18446744073709551615", "TLB HITS", "IN 4K/64K/2M PAGES",
		st.Nodes[0].Devices[0].GPU.UUID, "00000000:E3:00.0", "1023.0 GiB / 1023.0 GiB", "LOST", "1022.0 GiB"} {
		if !strings.Contains(wide.String(), want) {
			t.Errorf("wide view lacks %q", want)
		}
	}
	// Each container's row says how much it reserved and how many sessions
	// it has open.
	for _, l := range strings.Split(narrow.String(), "\n") {
		if strings.HasPrefix(l, "team-a") && strings.Contains(l, "moby/") && !strings.Contains(l, "RESERVED") {
			if f := strings.Fields(l); len(f) == 7 && f[2]+" "+f[3] == "1000.0 GiB" && f[6] == "2" {
				return
			}
		}
	}
	t.Errorf("no row of team-a's container with its 1000.0 GiB reserved and 2 sessions:\n%s", narrow.String())
}

// Each cuda device's GPU gets a row of its NVML readings: n/a for one the
// GPU lacks, unreadable for a GPU NVML could not read (why in -o wide). A
// status without GPUs has no GPU table.
func TestStatusGPUs(t *testing.T) {
	st := &api.Status{Nodes: []api.NodeStatus{{Addr: "gpu-host:7070", Backend: "cuda", Devices: []api.DeviceStatus{
		{Index: 0, Name: "NVIDIA H200", Memory: 140 << 30, GPU: &api.GPUStatus{Index: 0, UUID: "GPU-aaaa", PCIBusID: "00000000:19:00.0",
			MIG: "disabled", Memory: 141 << 30, MemoryUsed: 70 << 30, Utilization: 87, TemperatureC: 64, PowerMilliwatts: 512_250, ECCCorrected: 3, ECCUncorrected: 1}},
		{Index: 1, Name: "NVIDIA L4", Memory: 22 << 30, GPU: &api.GPUStatus{Index: 3, UUID: "GPU-bbbb", PCIBusID: "00000000:3b:00.0",
			MIG: "unsupported", Memory: 24 << 30, MemoryUsed: 1 << 20, Utilization: 5, TemperatureC: 41, Unsupported: []string{"power", "ecc"}}},
		{Index: 2, Name: "NVIDIA H200", Memory: 140 << 30, GPU: &api.GPUStatus{Index: 5, UUID: "GPU-cccc", MIG: "enabled", Memory: 141 << 30,
			Error: "NVML: GPU 5 (GPU-cccc): temperature: ERROR_GPU_IS_LOST: unavailable"}},
	}}}}
	var narrow, wide strings.Builder
	if err := renderStatus(&narrow, st, false); err != nil {
		t.Fatal(err)
	}
	if err := renderStatus(&wide, st, true); err != nil {
		t.Fatal(err)
	}
	// rows are the fields of the GPU table's rows, by NVML index.
	rows := func(out string) map[string][]string {
		m := map[string][]string{}
		table := false
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) > 2 && f[0] == "NODE" && f[2] == "GPU":
				table = true
			case len(f) == 0:
				table = false
			case table:
				m[f[3]] = f // after node and a two-word device name
			}
		}
		return m
	}
	got := rows(narrow.String())
	for gpu, want := range map[string]string{
		"0": "gpu-host:7070 NVIDIA H200 0 87% 70.0 GiB 64°C 512 W 3/1",
		"3": "gpu-host:7070 NVIDIA L4 3 5% 1.0 MiB 41°C n/a n/a",
		"5": "gpu-host:7070 NVIDIA H200 5 unreadable - - - -",
	} {
		if g := strings.Join(got[gpu], " "); g != want {
			t.Errorf("default view, GPU %s: %q, want %q\n%s", gpu, g, want, narrow.String())
		}
	}
	got = rows(wide.String())
	for gpu, want := range map[string]string{
		"0": "gpu-host:7070 NVIDIA H200 0 GPU-aaaa 00000000:19:00.0 disabled 87% 70.0 GiB / 141.0 GiB 64°C 512 W 3/1",
		"5": "gpu-host:7070 NVIDIA H200 5 GPU-cccc enabled unreadable - - - - NVML: GPU 5 (GPU-cccc): temperature: ERROR_GPU_IS_LOST: unavailable",
	} {
		if g := strings.Join(got[gpu], " "); g != want {
			t.Errorf("wide view, GPU %s: %q, want %q\n%s", gpu, g, want, wide.String())
		}
	}
	var sim strings.Builder
	st.Nodes[0].Backend = "sim"
	for i := range st.Nodes[0].Devices {
		st.Nodes[0].Devices[i].GPU = nil
	}
	if err := renderStatus(&sim, st, true); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sim.String(), "GPU") {
		t.Errorf("a status without GPUs shows a GPU table:\n%s", sim.String())
	}
}

func TestStatusOutputFlag(t *testing.T) {
	for args, want := range map[string]string{"": "", "-o wide": "wide", "-o json": "json", "--json": "json", "-o=wide --json": "json"} {
		fs, view := statusFlags()
		if err := fs.Parse(strings.Fields(args)); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if got, err := view(); err != nil || got != want {
			t.Errorf("%q: view %q, %v; want %q", args, got, err, want)
		}
	}
	fs, view := statusFlags()
	fs.Parse([]string{"-o", "yaml"})
	if _, err := view(); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), `"yaml"`) {
		t.Errorf("-o yaml: %v", err)
	}
	if err := status("/nonexistent/socket", []string{"-o", "yaml"}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("status -o yaml dialled first, or took it: %v", err)
	}
}

// vgpuctl tenants shows every limit a tenant's quota has: a field added to
// isolation.Tenant without a column fails here. Each is a field of
// api.TenantInfo too, so the value reaches vgpuctl.
func TestTenantsShowEveryQuotaField(t *testing.T) {
	shown := map[string]bool{}
	for _, c := range tenantColumns {
		shown[c.field] = true
	}
	info := reflect.TypeFor[api.TenantInfo]()
	for f := range reflect.TypeFor[isolation.Tenant]().Fields() {
		if !shown[f.Name] {
			t.Errorf("isolation.Tenant.%s has no column in vgpuctl tenants", f.Name)
		}
		if _, ok := info.FieldByName(f.Name); !ok {
			t.Errorf("isolation.Tenant.%s is not in api.TenantInfo", f.Name)
		}
	}
	var b strings.Builder
	ts := []api.TenantInfo{{Name: "team-a", Memory: 512 << 20, DefaultMemory: 128 << 20, Compute: 3, ComputeMax: 0.25, Bandwidth: 1 << 30,
		MaxContainers: 4, Oversubscribe: 1.5, DedupCharge: 0.5, Containers: 2, Reserved: 256 << 20, Allocated: 100 << 20, Charged: 90 << 20, Lost: 3 << 20},
		{Name: "free", Compute: 1, Oversubscribe: 1, DedupCharge: 1}}
	if err := renderTenants(&b, ts); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := [][]string{
		{"TENANT", "MEMORY", "CAP", "DEFAULT", "COMPUTE", "MAX", "SHARE", "BANDWIDTH/s", "OVERSUB", "DEDUP", "CONTAINERS", "RESERVED", "ALLOCATED", "CHARGED", "LOST"},
		{"team-a", "512.0", "MiB", "128.0", "MiB", "3", "25%", "1.0", "GiB", "1.5x", "0.5", "2/4", "256.0", "MiB", "100.0", "MiB", "90.0", "MiB", "3.0", "MiB"},
		{"free", "-", "-", "1", "-", "-", "1x", "1", "0/-", "0", "B", "0", "B", "0", "B", "0", "B"},
	}
	if len(lines) != len(want) {
		t.Fatalf("tenants table:\n%s", b.String())
	}
	for i, l := range lines {
		if got := strings.Fields(l); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("line %d: %q, want %q", i, got, want[i])
		}
	}
}
