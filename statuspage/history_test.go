package statuspage

import (
	"reflect"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

func TestRingKeepsTheLastValuesOldestFirst(t *testing.T) {
	r := NewRing[int](3)
	if _, ok := r.Last(); ok || r.Len() != 0 || len(r.Values()) != 0 {
		t.Fatalf("empty ring: len %d, values %v", r.Len(), r.Values())
	}
	for i, want := range [][]int{{1}, {1, 2}, {1, 2, 3}, {2, 3, 4}, {3, 4, 5}, {4, 5, 6}, {5, 6, 7}} {
		r.Add(i + 1)
		if got := r.Values(); !reflect.DeepEqual(got, want) {
			t.Fatalf("after adding 1..%d: %v, want %v", i+1, got, want)
		}
		if last, ok := r.Last(); !ok || last != i+1 {
			t.Fatalf("after adding 1..%d: last %d %v", i+1, last, ok)
		}
		if r.Len() != len(want) {
			t.Fatalf("after adding 1..%d: len %d, want %d", i+1, r.Len(), len(want))
		}
	}
	// Values is a copy: changing it leaves the ring as it was.
	v := r.Values()
	v[0] = 99
	if got := r.Values(); got[0] != 5 {
		t.Fatalf("Values shares the ring's memory: %v", got)
	}
	one := NewRing[int](0)
	if one.Add(1); one.Len() != 1 {
		t.Fatalf("a ring asked for capacity 0 holds %d, want 1 (at least one)", one.Len())
	}
}

func status(launches0, launches1 uint64, tenants ...api.TenantStatus) *api.Status {
	return &api.Status{Nodes: []api.NodeStatus{
		{Addr: "n1:7070", Devices: []api.DeviceStatus{{Index: 0, Used: 4 << 20, Launches: launches0}, {Index: 1, Used: 2 << 20, Launches: launches1}}},
	}, Tenants: tenants}
}

func TestSampleSumsTenantsAndMeasuresTheLaunchRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	first := NewSample(t0, status(10, 100,
		api.TenantStatus{Tenant: "alice", Session: 1, Allocated: 1 << 20},
		api.TenantStatus{Tenant: "alice", Session: 2, Allocated: 3 << 20},
		api.TenantStatus{Tenant: "bob", Session: 3, Allocated: 5 << 20}), nil)
	if want := map[string]uint64{"alice": 4 << 20, "bob": 5 << 20}; !reflect.DeepEqual(first.TenantMemory, want) {
		t.Fatalf("tenant memory %v, want %v (a tenant's sessions summed)", first.TenantMemory, want)
	}
	if want := map[string]uint64{"n1:7070/0": 4 << 20, "n1:7070/1": 2 << 20}; !reflect.DeepEqual(first.DeviceUsed, want) {
		t.Fatalf("device memory %v, want %v", first.DeviceUsed, want)
	}
	if first.LaunchRate != 0 {
		t.Fatalf("first sample's launch rate %v, want 0", first.LaunchRate)
	}
	second := NewSample(t0.Add(2*time.Second), status(30, 120), &first)
	if second.LaunchRate != 20 {
		t.Fatalf("launch rate %v, want 20/s (40 launches in 2s)", second.LaunchRate)
	}
	if len(second.TenantMemory) != 0 {
		t.Fatalf("tenant memory %v after the sessions ended, want none", second.TenantMemory)
	}
	// The node restarted: device 0's counter went back. It adds nothing,
	// device 1's 10 more launches count.
	third := NewSample(t0.Add(3*time.Second), status(5, 130), &second)
	if third.LaunchRate != 10 {
		t.Fatalf("launch rate %v after a counter went back, want 10/s (device 1's alone)", third.LaunchRate)
	}
	// The node is unreachable: no device, no rate, and the next answer
	// after it measures against a sample without the devices.
	down := &api.Status{Nodes: []api.NodeStatus{{Addr: "n1:7070", Error: "connection refused"}}}
	fourth := NewSample(t0.Add(4*time.Second), down, &third)
	if fourth.LaunchRate != 0 || len(fourth.DeviceUsed) != 0 {
		t.Fatalf("unreachable node: rate %v, devices %v; want 0 and none", fourth.LaunchRate, fourth.DeviceUsed)
	}
	fifth := NewSample(t0.Add(5*time.Second), status(1000, 2000), &fourth)
	if fifth.LaunchRate != 0 {
		t.Fatalf("launch rate %v right after the node came back, want 0 (no previous counter)", fifth.LaunchRate)
	}
}

func TestSampleMeasuresEachTenantsDeviceTime(t *testing.T) {
	shares := func(a0, a1, b0 time.Duration) *api.Status {
		return &api.Status{Nodes: []api.NodeStatus{{Addr: "n1:7070", Shares: []api.DeviceTenant{
			{Device: 0, Tenant: "alice", DeviceTime: a0}, {Device: 1, Tenant: "alice", DeviceTime: a1}, {Device: 0, Tenant: "bob", DeviceTime: b0},
		}}}}
	}
	t0 := time.Unix(1000, 0)
	first := NewSample(t0, shares(time.Second, 0, 5*time.Second), nil)
	if len(first.Busy) != 0 {
		t.Fatalf("first sample busy %v, want none", first.Busy)
	}
	// In 2s: alice used 1s of device 0 and 2s of device 1 (1.5 devices'
	// time per second); bob's node restarted, his counter went back.
	second := NewSample(t0.Add(2*time.Second), shares(2*time.Second, 2*time.Second, time.Second), &first)
	if want := map[string]float64{"alice": 1.5}; !reflect.DeepEqual(second.Busy, want) {
		t.Fatalf("busy %v, want %v", second.Busy, want)
	}
	third := NewSample(t0.Add(4*time.Second), shares(2*time.Second, 2*time.Second, 2*time.Second), &second)
	if want := map[string]float64{"alice": 0, "bob": 0.5}; !reflect.DeepEqual(third.Busy, want) {
		t.Fatalf("busy %v, want %v", third.Busy, want)
	}
}
