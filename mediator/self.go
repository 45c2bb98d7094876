package mediator

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// A container's own view: a connection to a container's socket that says
// hello as an operator (vgpu-smi, `vgpuctl top` inside the container) may
// read what that container has (OpSelf) and the kernel catalog, nothing
// else. Everything in the answer is the container's, or its tenant's
// (limits, device time on the devices its sessions use): never another
// container's sessions, nor a physical device's total use, which would tell
// it what other tenants hold.

// SelfInterval is the least time between two answers to OpSelf of one
// container, over all its connections: each asks the nodes for their
// status, so a container that asks in a loop, on as many connections as it
// may open, is slowed down to a pace its nodes do not notice; its own
// later requests wait their turn, another container's do not.
const SelfInterval = 100 * time.Millisecond

// pace spaces answers SelfInterval apart: those to OpSelf of one
// container, and to OpStatus of one unprivileged uid (statuspace.go).
type pace struct {
	mu   sync.Mutex
	next time.Time // guarded by mu: when the next answer may start
}

// wait returns when the caller's answer may start, having taken its turn,
// or at once with api.ErrUnavailable when stop is closed first: the
// mediator closes, and must not wait out the turns of those queued.
func (p *pace) wait(stop <-chan struct{}) error {
	p.mu.Lock()
	at := time.Now()
	if p.next.After(at) {
		at = p.next
	}
	p.next = at.Add(SelfInterval)
	p.mu.Unlock()
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-stop:
		return fmt.Errorf("the mediator is stopping: %w", api.ErrUnavailable)
	}
}

// serveSelf answers a container's requests about itself until it hangs up.
// What it may ask has no body.
func (m *Mediator) serveSelf(c *wire.Conn, hello wire.Header, ctr *container) {
	serveRequests(c, hello, false, fmt.Sprintf("the socket of container %v", ctr.key()), func(op wire.Op, _ []byte) ([]byte, error) {
		switch op {
		case api.OpSelf:
			if err := ctr.selfPace.wait(m.stop); err != nil {
				return nil, err
			}
			reply, err := json.Marshal(m.selfStatus(ctr))
			if err != nil {
				return nil, fmt.Errorf("encode the status of container %v: %v: %w", ctr.key(), err, api.ErrInternal)
			}
			return reply, nil
		case api.OpKernels:
			return m.catalogBody(), nil
		}
		return nil, fmt.Errorf("%v on the socket of container %v: a container may read only its own status (%v: vgpu-smi, vgpuctl top) and the kernels: %w",
			op, ctr.key(), api.OpSelf, api.ErrPermissionDenied)
	})
}

// selfStatus is what container c has now. Its virtual device i is, for
// each of its sessions, that session's vdevs[i]; name and node are taken
// from the first session that has it.
func (m *Mediator) selfStatus(c *container) api.SelfStatus {
	g := c.grant
	st := api.SelfStatus{
		Tenant: g.Tenant, Container: g.Container, Namespace: g.Namespace,
		Memory: c.budget.limit, Resident: g.Memory, Charged: c.budget.inUse(),
		Sessions: []api.TenantStatus{},
	}
	if q := m.admission.Limits(g.Tenant); q != nil {
		st.Compute, st.ComputeMax, st.Bandwidth = q.Compute, q.ComputeMax, q.Bandwidth
	}
	c.mu.Lock()
	sessions := make([]*session, 0, len(c.sessions))
	for s := range c.sessions {
		sessions = append(sessions, s)
	}
	c.mu.Unlock()
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].id < sessions[j].id })

	st.Devices = make([]api.SelfDevice, max(int(g.Devices), 1))
	behind := make([]map[*device]bool, len(st.Devices)) // physical devices behind each virtual one
	for i := range st.Devices {
		st.Devices[i] = api.SelfDevice{Index: uint32(i), Memory: c.budget.limit}
		behind[i] = map[*device]bool{}
	}
	for _, s := range sessions {
		st.Sessions = append(st.Sessions, s.status())
		held := s.frames.byDevice()
		for i := range s.vdevs {
			if i >= len(st.Devices) { // more than granted: newSession refuses it
				break
			}
			dev := s.vdevs[i].dev // not the connection, which the session's reader may replace
			d := &st.Devices[i]
			if d.Name == "" {
				d.Name, d.Node = dev.info.Name, m.node(dev.node).addr
				if d.Memory == 0 || dev.info.Memory < d.Memory { // as the session's hello reports it
					d.Memory = dev.info.Memory
				}
			}
			d.Used += held[uint32(i)]
			behind[i][dev] = true
		}
	}
	m.addDeviceTime(g.Tenant, st.Devices, behind)
	return st
}

// addDeviceTime adds to each device the tenant's device time, launches and
// throttling on the physical devices behind it, from their nodes' status.
func (m *Mediator) addDeviceTime(tenant string, devs []api.SelfDevice, behind []map[*device]bool) {
	var want []int // nodes behind any device, each once
	for _, b := range behind {
		for d := range b {
			if !slices.Contains(want, d.node) {
				want = append(want, d.node)
			}
		}
	}
	nodes := make(map[int]api.NodeStatus, len(want))
	var (
		mu sync.Mutex // guards nodes while the calls run
		wg sync.WaitGroup
	)
	for _, i := range want {
		wg.Go(func() {
			ns := m.node(i).status()
			mu.Lock()
			nodes[i] = ns
			mu.Unlock()
		})
	}
	wg.Wait()
	for i, b := range behind {
		for d := range b {
			for _, sh := range nodes[d.node].Shares {
				if sh.Tenant == tenant && sh.Device == d.info.Index {
					devs[i].DeviceTime += sh.DeviceTime
					devs[i].Launches += sh.Launches
					devs[i].Throttled = devs[i].Throttled || sh.Throttled
				}
			}
		}
	}
}

// byDevice is the memory of the frames held, by virtual device.
func (f *frameSource) byDevice() map[uint32]uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[uint32]uint64{}
	for df := range f.held {
		out[df.dev] += memory.FrameSize
	}
	return out
}
