package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

// hostSnapshots are two readings 1s apart: on one device team-a (weight 1)
// ran 250ms and team-b (weight 3) 750ms; team-a's session copied 2 MiB in.
// Device 1 is a GPU's, whose NVML readings the node reports.
func hostSnapshots() (prev, cur *topSnapshot) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	mk := func(at time.Time, a, b time.Duration, copied, launches uint64) *topSnapshot {
		return &topSnapshot{
			At: at, Socket: "/run/vgpu/mediator.sock", Every: time.Second,
			Status: &api.Status{
				Nodes: []api.NodeStatus{{
					Addr: "10.0.0.7:7070",
					Devices: []api.DeviceStatus{
						{Index: 0, Name: "sim0", Memory: 16 << 30, Used: 4 << 30},
						{Index: 1, Name: "gpu1", Memory: 16 << 30, GPU: &api.GPUStatus{Index: 5, Memory: 141 << 30, MemoryUsed: 20 << 30,
							Utilization: 37, TemperatureC: 61, PowerMilliwatts: 352000, ECCUncorrected: 2, Unsupported: []string{"ecc"}}},
					},
					Shares: []api.DeviceTenant{
						{Device: 0, Tenant: "team-a", Weight: 1, DeviceTime: a},
						{Device: 0, Tenant: "team-b", Weight: 3, DeviceTime: b},
					},
				}, {Addr: "10.0.0.8:7070", Error: "connection refused"}},
				Tenants: []api.TenantStatus{
					{Tenant: "team-a", Container: "c0ffee", Session: 1, Allocated: 1 << 30, CopiedIn: copied, Launches: launches},
					{Tenant: "team-b", Session: 2, Allocated: 3 << 30, Launches: 5},
				},
			},
			Tenants: []api.TenantInfo{{Name: "team-a", Memory: 2 << 30, Compute: 1, Allocated: 1 << 30}, {Name: "team-b", Compute: 3, Allocated: 3 << 30}},
		}
	}
	return mk(t0, time.Second, time.Second, 0, 10), mk(t0.Add(time.Second), time.Second+250*time.Millisecond, time.Second+750*time.Millisecond, 2<<20, 30)
}

func checkFits(t *testing.T, out string, w, h int) []string {
	t.Helper()
	lines := strings.Split(out, "\n")
	if out == "" {
		lines = nil
	}
	if len(lines) > h {
		t.Fatalf("%dx%d: %d lines", w, h, len(lines))
	}
	for i, l := range lines {
		if n := len([]rune(l)); n > w {
			t.Fatalf("%dx%d: line %d has %d columns: %q", w, h, i, n, l)
		}
		if strings.ContainsAny(l, "\x1b\r\t") || strings.HasSuffix(l, " ") {
			t.Fatalf("%dx%d: line %d has control characters: %q", w, h, i, l)
		}
	}
	return lines
}

func TestRenderTopHost(t *testing.T) {
	prev, cur := hostSnapshots()
	out := renderTop(prev, cur, 80, 24)
	t.Logf("\n%s", out)
	lines := checkFits(t, out, 80, 24)
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return l
			}
		}
		t.Fatalf("no line starts with %q:\n%s", prefix, out)
		return ""
	}
	// Device 0: 4 of 16 GiB, busy all the second; device 1 idle.
	if d := find("10.0.0.7:7070/0"); !strings.Contains(d, "4.0G/16G") || !strings.Contains(d, "100%") || !strings.Contains(d, "[####") {
		t.Errorf("device 0: %q", d)
	}
	if d := find("10.0.0.7:7070/1"); !strings.Contains(d, "  0%") {
		t.Errorf("device 1: %q", d)
	}
	// Under it, its GPU as NVML reads it (it offers no ECC counts).
	if g := find("GPU 5:"); g != "   GPU 5: util 37% · 20.0 GiB used · 61°C · 352 W · ECC n/a" {
		t.Errorf("GPU line: %q", g)
	}
	if strings.Count(out, "GPU ") != 1 {
		t.Errorf("a GPU line for a device without a GPU:\n%s", out)
	}
	if d := find("10.0.0.8:7070"); !strings.Contains(d, "unreachable: connection refused") {
		t.Errorf("unreachable node: %q", d)
	}
	// Shares as the weights would have them: 25% and 75%.
	if a := find("team-a"); !strings.Contains(a, "1.0G/2.0G") || !strings.Contains(a, " 25% ") || !strings.Contains(a, "1(25%)") || !strings.Contains(a, "2.0M") {
		t.Errorf("team-a: %q", a)
	}
	if b := find("team-b"); !strings.Contains(b, "3.0G/-") || !strings.Contains(b, " 75% ") || !strings.Contains(b, "3(75%)") {
		t.Errorf("team-b: %q", b)
	}
	// Sessions, the most memory first.
	s1, s2 := find("1 team-a"), find("2 team-b")
	if strings.Index(out, s2) > strings.Index(out, s1) || !strings.Contains(s1, "c0ffee") || !strings.HasSuffix(s1, " 20") {
		t.Errorf("sessions: %q, %q", s1, s2)
	}

	// The first screen has no rates.
	first := renderTop(nil, cur, 80, 24)
	checkFits(t, first, 80, 24)
	if !strings.Contains(first, "team-a") || strings.Contains(first, "25%") || strings.Contains(first, "100%") {
		t.Errorf("first screen has rates:\n%s", first)
	}
	// A failed reading says so above the last good one.
	bad := *cur
	bad.Err = errors.New("mediator /run/vgpu/mediator.sock: unavailable")
	if out := renderTop(prev, &bad, 80, 24); !strings.Contains(out, "! mediator /run/vgpu/mediator.sock: unavailable") || !strings.Contains(out, "team-a") {
		t.Errorf("failed reading:\n%s", out)
	}
}

// Every size, down to one cell, renders within it; below the width where
// bars go, a narrower screen is the wider one cut, never a rearranged one.
func TestRenderTopSizes(t *testing.T) {
	prev, cur := hostSnapshots()
	self0, self1 := selfSnapshots()
	failed := &topSnapshot{Socket: "/run/vgpu/mediator.sock", Err: errors.New("dial: no such file")} // no reading yet
	for _, pair := range [][2]*topSnapshot{{prev, cur}, {nil, cur}, {self0, self1}, {nil, failed}, {cur, self1}, {self1, cur}} {
		for w := 0; w <= 130; w++ {
			for _, h := range []int{0, 1, 2, 5, 10, 24, 60} {
				checkFits(t, renderTop(pair[0], pair[1], w, h), w, h)
			}
		}
		wide := strings.Split(renderTop(pair[0], pair[1], 55, 60), "\n")
		for w := 1; w <= 55; w++ {
			for i, l := range strings.Split(renderTop(pair[0], pair[1], w, 60), "\n") {
				if want := strings.TrimRight(clipTo(wide[i], w), " "); l != want {
					t.Fatalf("%d columns, line %d: %q, want %q", w, i, l, want)
				}
			}
		}
	}
	// Sessions beyond the height are counted, not drawn.
	many := *cur
	st := *cur.Status
	for i := range 40 {
		st.Tenants = append(st.Tenants, api.TenantStatus{Tenant: "team-b", Session: uint64(100 + i)})
	}
	many.Status = &st
	out := renderTop(prev, &many, 80, 24)
	checkFits(t, out, 80, 24)
	if !strings.Contains(out, "... 33 more sessions") {
		t.Errorf("42 sessions in 24 lines:\n%s", out)
	}
}

// selfSnapshots are a container's readings 500ms apart: its tenant ran
// 100ms on its one device.
func selfSnapshots() (prev, cur *topSnapshot) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	mk := func(at time.Time, dt time.Duration, in uint64) *topSnapshot {
		return &topSnapshot{At: at, Socket: "/run/vgpu/mediator.sock", Every: time.Second, Self: &api.SelfStatus{
			Tenant: "team-a", Container: "c0ffee", Memory: 256 << 20, Charged: 64 << 20, Compute: 2,
			Devices:  []api.SelfDevice{{Index: 0, Name: "sim0", Memory: 256 << 20, Used: 64 << 20, DeviceTime: dt}},
			Sessions: []api.TenantStatus{{Tenant: "team-a", Container: "c0ffee", Session: 9, Allocated: 64 << 20, CopiedIn: in}},
		}}
	}
	return mk(t0, time.Second, 0), mk(t0.Add(500*time.Millisecond), time.Second+100*time.Millisecond, 1<<20)
}

func TestRenderTopContainer(t *testing.T) {
	prev, cur := selfSnapshots()
	out := renderTop(prev, cur, 80, 24)
	t.Logf("\n%s", out)
	checkFits(t, out, 80, 24)
	for _, want := range []string{"view: container c0ffee of tenant team-a", "vgpu0 sim0", "64M/256M", " 20%", "2.0M", "9 team-a"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "team-a"); n != 3 { // the title, its tenant row, its session
		t.Errorf("team-a appears %d times:\n%s", n, out)
	}
}

func TestShort(t *testing.T) {
	for n, want := range map[uint64]string{0: "0B", 999: "999B", 1000: "1.0K", 1536: "1.5K", 10 << 20: "10M", 256 << 20: "256M", 16 << 30: "16G", 1023 << 20: "1.0G"} {
		if got := short(n); got != want {
			t.Errorf("short(%d) = %q, want %q", n, got, want)
		}
	}
}
