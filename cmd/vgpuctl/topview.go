package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vgpu/vgpu/api"
)

// topSnapshot is one reading of the mediator for vgpuctl top: on the host
// socket its status and tenants, on a container's socket that container's
// own view.
type topSnapshot struct {
	At      time.Time
	Socket  string
	Every   time.Duration    // the refresh interval, for the header
	Status  *api.Status      // the host's view; nil in a container
	Tenants []api.TenantInfo // with Status: limits from the quota file
	Self    *api.SelfStatus  // a container's own view
	Err     error            // the reading failed: the rest is the last good one
}

// The rows of top, with rates over the time between two snapshots; a rate
// of -1 is unknown (a first snapshot).
type (
	topDevice struct {
		name        string
		used, total uint64
		util        float64
		err         string // the node cannot be reached
		gpu         string // the GPU behind it as NVML reads it (cuda devices); "" for none
	}
	topTenant struct {
		name      string
		sessions  int
		used, cap uint64
		share     float64 // its device time per second, over the devices it ran on
		weight    uint32
		fair      float64 // its weight's share among the tenants on its devices; -1 unknown
		in, out   float64 // bytes per second copied to and from devices
	}
	topSession struct {
		id                uint64
		tenant, container string
		mem               uint64
		in, out, launches float64
	}
	topView struct {
		title    string
		devices  []topDevice
		tenants  []topTenant
		sessions []topSession
	}
)

// devKey names a physical device of a node; shareKey one tenant's use of it.
type (
	devKey struct {
		node string
		dev  uint32
	}
	shareKey struct {
		devKey
		tenant string
	}
)

// gpuLine is the line top shows under a device for the GPU behind it, as
// status's GPU table shows it: what NVML says of its load, memory,
// temperature, power and ECC errors, which covers every process on the
// GPU, where the device line above is vgpu's own.
func gpuLine(g *api.GPUStatus) string {
	if g == nil {
		return ""
	}
	if g.Error != "" {
		return fmt.Sprintf("GPU %d unreadable: %s", g.Index, g.Error)
	}
	util, used, temp, power, ecc := g.Readings(func(n uint64) string { return count(n, false) })
	return fmt.Sprintf("GPU %d: util %s · %s used · %s · %s · ECC %s", g.Index, util, used, temp, power, ecc)
}

// rate is (cur − prev) per second of dt; -1 without a previous reading, a
// counter that went back (a restart) counts from 0.
func rate(prev, cur uint64, havePrev bool, dt time.Duration) float64 {
	if !havePrev || dt <= 0 {
		return -1
	}
	if cur < prev {
		prev = 0
	}
	return float64(cur-prev) / dt.Seconds()
}

// buildTopView makes top's rows from the snapshot cur and the one before
// it, prev (nil for the first).
func buildTopView(prev, cur *topSnapshot) topView {
	var dt time.Duration
	if prev != nil {
		dt = cur.At.Sub(prev.At)
	}
	if cur.Self != nil {
		var p *api.SelfStatus
		if prev != nil {
			p = prev.Self
		}
		return selfView(p, cur.Self, dt)
	}
	var p *api.Status
	if prev != nil {
		p = prev.Status
	}
	return hostView(p, cur.Status, cur.Tenants, dt)
}

func hostView(prev, cur *api.Status, infos []api.TenantInfo, dt time.Duration) topView {
	v := topView{title: "host"}
	if cur == nil {
		return v
	}
	before := map[shareKey]time.Duration{}
	if prev != nil {
		for _, n := range prev.Nodes {
			for _, sh := range n.Shares {
				before[shareKey{devKey{n.Addr, sh.Device}, sh.Tenant}] = sh.DeviceTime
			}
		}
	}
	// Device time by device and tenant over the interval, and the tenants
	// on each device with their weights.
	spent := map[shareKey]float64{}
	onDev := map[devKey]map[string]uint32{}
	weights := map[string]uint32{}
	for _, n := range cur.Nodes {
		if n.Error != "" {
			v.devices = append(v.devices, topDevice{name: n.Addr, util: -1, err: n.Error})
			continue
		}
		for _, sh := range n.Shares {
			k := shareKey{devKey{n.Addr, sh.Device}, sh.Tenant}
			// A tenant new on the device since the last reading ran all
			// its device time in the interval.
			if old := before[k]; prev != nil && dt > 0 && sh.DeviceTime >= old {
				spent[k] = float64(sh.DeviceTime-old) / float64(dt)
			}
			if onDev[k.devKey] == nil {
				onDev[k.devKey] = map[string]uint32{}
			}
			onDev[k.devKey][sh.Tenant] = sh.Weight
			weights[sh.Tenant] = sh.Weight
		}
		for _, d := range n.Devices {
			util := -1.0
			if prev != nil && dt > 0 {
				util = 0
				for k, s := range spent {
					if k.devKey == (devKey{n.Addr, d.Index}) {
						util += s
					}
				}
			}
			v.devices = append(v.devices, topDevice{name: fmt.Sprintf("%s/%d %s", n.Addr, d.Index, d.Name), used: d.Used, total: d.Memory, util: util, gpu: gpuLine(d.GPU)})
		}
	}
	// Tenants: those of the quota file, and any with a session.
	rows := map[string]*topTenant{}
	row := func(name string) *topTenant {
		if rows[name] == nil {
			rows[name] = &topTenant{name: name, share: -1, fair: -1, in: -1, out: -1}
		}
		return rows[name]
	}
	for _, ti := range infos {
		t := row(ti.Name)
		t.used, t.cap, t.weight = ti.Allocated, ti.Memory, ti.Compute
	}
	prevSess := map[uint64]api.TenantStatus{}
	if prev != nil {
		for _, s := range prev.Tenants {
			prevSess[s.Session] = s
		}
	}
	used := map[string]uint64{}
	for _, s := range cur.Tenants {
		t := row(s.Tenant)
		t.sessions++
		used[s.Tenant] += s.Allocated
		p := prevSess[s.Session]
		// A session new since the last reading moved all it counts in it.
		in, out := rate(p.CopiedIn, s.CopiedIn, prev != nil, dt), rate(p.CopiedOut, s.CopiedOut, prev != nil, dt)
		if in >= 0 {
			t.in, t.out = max(t.in, 0)+in, max(t.out, 0)+out
		}
		v.sessions = append(v.sessions, topSession{
			id: s.Session, tenant: s.Tenant, container: s.Container, mem: s.Allocated,
			in: in, out: out, launches: rate(p.Launches, s.Launches, prev != nil, dt),
		})
	}
	for name, n := range used {
		if t := rows[name]; t.used == 0 {
			t.used = n // a host-socket tenant outside the quota file
		}
	}
	for name, w := range weights {
		if t := row(name); t.weight == 0 {
			t.weight = w
		}
	}
	if prev != nil && dt > 0 {
		for _, t := range rows {
			t.share, t.fair = shareOf(t.name, spent, onDev)
			if t.in < 0 {
				t.in, t.out = 0, 0
			}
		}
	}
	for _, t := range rows {
		v.tenants = append(v.tenants, *t)
	}
	slices.SortFunc(v.tenants, func(a, b topTenant) int { return strings.Compare(a.name, b.name) })
	sortSessions(v.sessions)
	return v
}

// shareOf is a tenant's device time per second over the devices it ran
// on, and its weight's fair share of them: its weight over the weights of
// the tenants that ran on them too, in the interval. Both are -1 for a
// tenant that ran on no device.
func shareOf(tenant string, spent map[shareKey]float64, onDev map[devKey]map[string]uint32) (share, fair float64) {
	var devs int
	var fairSum float64
	share = 0
	for k, s := range spent {
		if k.tenant != tenant || s <= 0 {
			continue
		}
		devs++
		share += s
		var sum, mine float64
		for other, w := range onDev[k.devKey] {
			if spent[shareKey{k.devKey, other}] > 0 {
				sum += float64(w)
			}
			if other == tenant {
				mine = float64(w)
			}
		}
		if sum > 0 {
			fairSum += mine / sum
		}
	}
	if devs == 0 {
		return 0, -1
	}
	return share / float64(devs), fairSum / float64(devs)
}

func selfView(prev, cur *api.SelfStatus, dt time.Duration) topView {
	v := topView{title: fmt.Sprintf("container %s of tenant %s", cur.Container, cur.Tenant)}
	t := topTenant{name: cur.Tenant, sessions: len(cur.Sessions), used: cur.Charged, cap: cur.Memory, weight: cur.Compute, share: -1, fair: -1, in: -1, out: -1}
	var spentSum float64
	var ran int
	for _, d := range cur.Devices {
		name := fmt.Sprintf("vgpu%d", d.Index)
		if d.Name != "" {
			name += " " + d.Name
		}
		util := -1.0
		if prev != nil && int(d.Index) < len(prev.Devices) && dt > 0 && d.DeviceTime >= prev.Devices[d.Index].DeviceTime {
			util = float64(d.DeviceTime-prev.Devices[d.Index].DeviceTime) / float64(dt)
			if util > 0 {
				spentSum += util
				ran++
			}
		}
		v.devices = append(v.devices, topDevice{name: name, used: d.Used, total: d.Memory, util: util})
	}
	if prev != nil && dt > 0 {
		t.share = 0
		if ran > 0 {
			t.share = spentSum / float64(ran)
		}
	}
	prevSess := map[uint64]api.TenantStatus{}
	if prev != nil {
		for _, s := range prev.Sessions {
			prevSess[s.Session] = s
		}
	}
	for _, s := range cur.Sessions {
		p := prevSess[s.Session]
		in, out := rate(p.CopiedIn, s.CopiedIn, prev != nil, dt), rate(p.CopiedOut, s.CopiedOut, prev != nil, dt)
		if in >= 0 {
			t.in, t.out = max(t.in, 0)+in, max(t.out, 0)+out
		}
		v.sessions = append(v.sessions, topSession{id: s.Session, tenant: s.Tenant, container: s.Container, mem: s.Allocated,
			in: in, out: out, launches: rate(p.Launches, s.Launches, prev != nil, dt)})
	}
	if prev != nil && dt > 0 && t.in < 0 {
		t.in, t.out = 0, 0
	}
	v.tenants = []topTenant{t}
	sortSessions(v.sessions)
	return v
}

// sortSessions puts the sessions that hold the most memory first, then
// those that move the most bytes.
func sortSessions(ss []topSession) {
	slices.SortFunc(ss, func(a, b topSession) int {
		switch {
		case a.mem != b.mem:
			if a.mem > b.mem {
				return -1
			}
			return 1
		case a.in+a.out != b.in+b.out:
			if a.in+a.out > b.in+b.out {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.id, b.id)
	})
}

// renderTop is the screen of vgpuctl top for the snapshot cur, with rates
// since prev (nil for the first), in width columns and height lines: each
// line is at most width runes, without trailing blanks, and there are at
// most height lines, with no trailing newline. Below 80 columns bars shrink and then go, and lines
// are cut at the width; sessions fill the lines left.
func renderTop(prev, cur *topSnapshot, width, height int) string {
	if width < 1 || height < 1 {
		return ""
	}
	v := buildTopView(prev, cur)
	var lines []string
	add := func(format string, a ...any) { lines = append(lines, fmt.Sprintf(format, a...)) }
	add("vgpuctl top - %s - %s - every %v - q quits", cur.Socket, cur.At.Format("15:04:05"), cur.Every)
	if cur.Err != nil {
		add("! %v", cur.Err)
	}
	add("view: %s", v.title)

	// Devices: name, a memory bar and a utilization bar.
	const fixed = 50 // all of a device line but its two bars
	bar := min(max((width-fixed)/2, 0), 30)
	if bar < 3 {
		bar = 0
	}
	add("")
	add(" %-22s %s %15s %s %4s", "DEVICE", pad("MEMORY", bar), "USED/TOTAL", pad("UTIL", bar), "")
	for _, d := range v.devices {
		if d.err != "" {
			add(" %-22s unreachable: %s", clipTo(d.name, 22), d.err)
			continue
		}
		add(" %-22s %s %15s %s %4s", clipTo(d.name, 22), meter(float64(d.used)/float64(max(d.total, 1)), bar),
			short(d.used)+"/"+short(d.total), meter(d.util, bar), pct(d.util))
		if d.gpu != "" {
			add("   %s", d.gpu)
		}
	}

	add("")
	add(" %-14s %4s %13s %6s %9s %8s %8s", "TENANT", "SESS", "MEMORY/CAP", "SHARE", "WEIGHT", "IN/s", "OUT/s")
	for _, t := range v.tenants {
		capacity := "-"
		if t.cap > 0 {
			capacity = short(t.cap)
		}
		weight := fmt.Sprint(t.weight)
		if t.fair >= 0 {
			weight = fmt.Sprintf("%d(%s)", t.weight, strings.TrimSpace(pct(t.fair)))
		}
		add(" %-14s %4d %13s %6s %9s %8s %8s", clipTo(t.name, 14), t.sessions, short(t.used)+"/"+capacity, pct(t.share), weight, perSec(t.in), perSec(t.out))
	}

	add("")
	add(" %8s %-12s %-14s %9s %8s %8s %9s", "SESSION", "TENANT", "CONTAINER", "MEMORY", "IN/s", "OUT/s", "LAUNCH/s")
	room := height - len(lines)
	for i, s := range v.sessions {
		if i == room-1 && len(v.sessions) > room {
			add(" ... %d more sessions", len(v.sessions)-i)
			break
		}
		launches := "-"
		if s.launches >= 0 {
			launches = fmt.Sprintf("%.0f", s.launches)
		}
		add(" %8d %-12s %-14s %9s %8s %8s %9s", s.id, clipTo(s.tenant, 12), clipTo(s.container, 14), short(s.mem), perSec(s.in), perSec(s.out), launches)
	}
	if len(lines) > height {
		lines = lines[:height]
	}
	for i, l := range lines {
		lines[i] = strings.TrimRight(clipTo(l, width), " ")
	}
	return strings.Join(lines, "\n")
}

// meter is a bar of n cells, filled for the fraction f (clamped to [0, 1]);
// "" for n 0, blank for an unknown f (< 0).
func meter(f float64, n int) string {
	if n == 0 {
		return ""
	}
	if f < 0 {
		return "[" + strings.Repeat(" ", n-2) + "]"
	}
	full := int(min(f, 1)*float64(n-2) + 0.5)
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", n-2-full) + "]"
}

// pad is s in n columns, cut if longer; "" for n 0.
func pad(s string, n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%-*s", n, clipTo(s, n))
}

// clipTo cuts s to n runes.
func clipTo(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if r := []rune(s); len(r) > n {
		return string(r[:n])
	}
	return s
}

// pct prints a fraction as a percentage in 4 columns; "-" if unknown.
func pct(f float64) string {
	if f < 0 {
		return "-"
	}
	return fmt.Sprintf("%3.0f%%", 100*f)
}

// perSec prints a byte rate; "-" if unknown.
func perSec(r float64) string {
	if r < 0 {
		return "-"
	}
	return short(uint64(r + 0.5))
}

// short prints a byte count in at most 5 columns: 512B, 1.5K, 20M, 16G.
func short(n uint64) string {
	const units = "BKMGTPE"
	v, i := float64(n), 0
	for v >= 999.5 && i < len(units)-1 {
		v /= 1024
		i++
	}
	switch {
	case i == 0:
		return fmt.Sprintf("%d%c", n, units[0])
	case v < 9.95:
		return fmt.Sprintf("%.1f%c", v, units[i])
	}
	return fmt.Sprintf("%.0f%c", v, units[i])
}
