package statuspage

import (
	"sort"
	"strconv"
	"time"

	"github.com/vgpu/vgpu/api"
)

// Ring keeps the last Cap values added to it, oldest first; adding to a
// full ring drops the oldest. The zero Ring holds nothing and drops
// everything; use NewRing. A Ring is not safe for concurrent use: the
// Server guards its own with a lock.
type Ring[T any] struct {
	buf   []T
	start int // index of the oldest value
	n     int // values held, at most len(buf)
}

// NewRing returns an empty ring that holds up to capacity values (at least 1).
func NewRing[T any](capacity int) *Ring[T] {
	return &Ring[T]{buf: make([]T, max(capacity, 1))}
}

// Add appends v, dropping the oldest value when the ring is full.
func (r *Ring[T]) Add(v T) {
	if len(r.buf) == 0 {
		return
	}
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = v
		r.n++
		return
	}
	r.buf[r.start] = v
	r.start = (r.start + 1) % len(r.buf)
}

// Len is how many values the ring holds.
func (r *Ring[T]) Len() int { return r.n }

// Values returns a copy of the values held, oldest first.
func (r *Ring[T]) Values() []T {
	out := make([]T, r.n)
	for i := range out {
		out[i] = r.buf[(r.start+i)%len(r.buf)]
	}
	return out
}

// Last returns the newest value, and false when the ring is empty.
func (r *Ring[T]) Last() (T, bool) {
	if r.n == 0 {
		var zero T
		return zero, false
	}
	return r.buf[(r.start+r.n-1)%len(r.buf)], true
}

// Sample is what the charts keep of one status snapshot: the few numbers
// they plot, not the whole snapshot, so that minutes of history stay small.
type Sample struct {
	Time time.Time `json:"time"`
	// TenantMemory is the memory each tenant's sessions hold (allocated
	// bytes, summed over its sessions), by tenant.
	TenantMemory map[string]uint64 `json:"tenant_memory_bytes"`
	// DeviceUsed is each physical device's used memory, by DeviceKey.
	DeviceUsed map[string]uint64 `json:"device_used_bytes"`
	// Launches is each device's launch counter, by DeviceKey: monotonic on
	// a node, so rates come from differences between samples.
	Launches map[string]uint64 `json:"device_launches"`
	// LaunchRate is kernel launches per second over all devices since the
	// previous sample (0 for the first).
	LaunchRate float64 `json:"launches_per_second"`
	// DeviceTime is each tenant's device time on each device, as the
	// node's scheduler counts it, by DeviceKey + "/" + tenant: monotonic
	// too.
	DeviceTime map[string]time.Duration `json:"device_time_ns"`
	// Busy is the device time each tenant used per second since the
	// previous sample, over all devices (0.5: half of one device's time),
	// by tenant.
	Busy map[string]float64 `json:"busy"`
}

// DeviceKey names a physical device across nodes: "node-address/index".
func DeviceKey(node string, index uint32) string {
	return node + "/" + strconv.FormatUint(uint64(index), 10)
}

// NewSample reduces a status snapshot taken at t to a Sample, with its
// rates measured against prev (nil: none before). A counter missing from
// either sample (its node unreachable in one of them), or that went back
// (the node restarted), adds nothing to a rate rather than a jump or a
// negative one.
func NewSample(t time.Time, st *api.Status, prev *Sample) Sample {
	s := Sample{Time: t, TenantMemory: map[string]uint64{}, DeviceUsed: map[string]uint64{}, Launches: map[string]uint64{},
		DeviceTime: map[string]time.Duration{}, Busy: map[string]float64{}}
	if st == nil {
		return s
	}
	for _, n := range st.Nodes {
		if n.Error != "" {
			continue
		}
		for _, d := range n.Devices {
			k := DeviceKey(n.Addr, d.Index)
			s.DeviceUsed[k] = d.Used
			s.Launches[k] = d.Launches
		}
		for _, sh := range n.Shares {
			s.DeviceTime[DeviceKey(n.Addr, sh.Device)+"/"+sh.Tenant] = sh.DeviceTime
		}
	}
	for _, ts := range st.Tenants {
		s.TenantMemory[ts.Tenant] += ts.Allocated
	}
	if prev != nil {
		if dt := t.Sub(prev.Time).Seconds(); dt > 0 {
			var delta uint64
			for k, now := range s.Launches {
				if before, ok := prev.Launches[k]; ok && now >= before {
					delta += now - before
				}
			}
			s.LaunchRate = float64(delta) / dt
			for _, n := range st.Nodes {
				if n.Error != "" {
					continue
				}
				for _, sh := range n.Shares {
					k := DeviceKey(n.Addr, sh.Device) + "/" + sh.Tenant
					if before, ok := prev.DeviceTime[k]; ok && sh.DeviceTime >= before {
						s.Busy[sh.Tenant] += (sh.DeviceTime - before).Seconds() / dt
					}
				}
			}
		}
	}
	return s
}

// seriesNames returns the sorted union of the keys that pick takes from
// each sample.
func seriesNames[V any](samples []Sample, pick func(Sample) map[string]V) []string {
	seen := map[string]bool{}
	for _, s := range samples {
		for k := range pick(s) {
			seen[k] = true
		}
	}
	names := make([]string, 0, len(seen))
	for k := range seen {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
