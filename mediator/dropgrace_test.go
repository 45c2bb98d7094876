package mediator

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// nodeUsed is the device memory the node at addr reports in use on its
// first device, asked over a connection of its own.
func nodeUsed(t *testing.T, addr string) uint64 {
	t.Helper()
	rpc, _, err := dialNode(addr, nodeTenant{name: "probe"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rpc.Close()
	body, err := rpc.Call(api.OpNodeStatus, nil, nil)
	var st api.NodeStatus
	if err == nil {
		err = json.Unmarshal(body, &st)
	}
	if err != nil {
		t.Fatalf("node status: %v", err)
	}
	return st.Devices[0].Used
}

// A mediator with no journal that dies leaves its sessions' frames parked
// on the node only for its drop grace, not for the node's reattach grace
// (60 s here): they are kept at first, since its connections attached,
// and then freed, so that a mediator started again has the tenant's share
// of the node back within the drop grace.
func TestUnjournaledDeathFreesAfterDropGrace(t *testing.T) {
	const grace = time.Second
	h := newHost(t)
	h.startWith(func(c *Config) { c.StateDir, c.DropGrace = "", grace })
	c := h.dial(h.serveHost())
	const n = 4 << 20
	p, err := c.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	s.CopyToDevice(p, pattern(1, n))
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	used := nodeUsed(t, h.node)
	if used < n {
		t.Fatalf("node uses %d bytes with the session's %d written", used, n)
	}

	// The mediator dies: the node sees its connections drop before it
	// frees anything, and its teardown then reaches nothing.
	m := h.med
	h.med = nil
	m.mu.Lock()
	var rpcs []*wire.RPC
	for _, s := range m.sessions {
		if s.jr != nil {
			t.Fatal("the session has a journal with no state directory")
		}
		for _, v := range s.vdevs {
			rpcs = append(rpcs, v.rpc)
		}
	}
	m.mu.Unlock()
	dropped := time.Now()
	for _, r := range rpcs {
		r.Close()
	}
	m.Close()
	if got := nodeUsed(t, h.node); got < n && time.Since(dropped) < grace/2 {
		t.Fatalf("node uses %d bytes %v after the drop, want the session's %d kept for the drop grace",
			got, time.Since(dropped), n)
	}
	waitFreedAfterDropGrace(t, h.node, dropped, grace)
}

// waitFreedAfterDropGrace waits until the node at addr holds no frames,
// failing if that is before grace has passed since dropped (when the
// mediator died), or not within 20 s: held for the node's own reattach
// grace.
func waitFreedAfterDropGrace(t *testing.T, addr string, dropped time.Time, grace time.Duration) {
	t.Helper()
	for nodeUsed(t, addr) != 0 {
		if time.Since(dropped) > 20*time.Second {
			t.Fatalf("frames still held %v after the mediator died, with a drop grace of %v", time.Since(dropped), grace)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if held := time.Since(dropped); held < grace-100*time.Millisecond {
		t.Fatalf("frames freed %v after the drop, before the %v drop grace", held, grace)
	}
}
