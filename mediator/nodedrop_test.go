package mediator_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// cutter is a proxy to a node that can cut the connections that attached
// (a journaled session's, not the mediator's control connection) from the
// node's side, as a network fault or the node's peer timeout would, and
// can refuse new connections for a while.
type cutter struct {
	addr    string
	refuse  atomic.Bool // new connections are closed at their first frame
	mu      sync.Mutex
	started map[net.Conn]bool // by the mediator's side: a frame went through; guarded by mu
	attach  []net.Conn        // the node's sides of connections that attached; guarded by mu
}

func newCutter(t *testing.T, node string) *cutter {
	c := &cutter{started: map[net.Conn]bool{}}
	c.addr = proxy(t, node, func(_ *wire.Conn, mc, nc net.Conn, h wire.Header, body []byte) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.started[mc] && c.refuse.Load() {
			mc.Close()
			nc.Close()
			return true
		}
		c.started[mc] = true
		if h.Op == api.OpNodeAttach {
			c.attach = append(c.attach, nc)
		}
		return false
	})
	return c
}

// cut closes, from the node's side, the connections that attached since
// the last cut, and returns how many.
func (c *cutter) cut() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.attach)
	for _, nc := range c.attach {
		nc.Close()
	}
	c.attach = nil
	return n
}

// readBack reads len(want) bytes at p on st, retrying while the session's
// node connection is not back yet, for up to 10 s, and returns the error
// once it is not that.
func readBack(t *testing.T, st *client.Stream, p client.Ptr, want []byte) error {
	t.Helper()
	got := make([]byte, len(want))
	deadline := time.Now().Add(10 * time.Second)
	for {
		st.CopyFromDevice(got, p)
		err := st.Synchronize()
		if err == nil {
			if !bytes.Equal(got, want) {
				t.Fatalf("buffer at %#x read back differs from what was written", p)
			}
			return nil
		}
		// Until the watcher has redialled, requests meet the closed
		// connection; a loss says "went with it".
		if !errors.Is(err, api.ErrUnavailable) || strings.Contains(err.Error(), "went with it") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeBuffers allocates buffers of the given sizes on device 0, fills each
// with its own bytes and returns them with their contents.
func writeBuffers(t *testing.T, c *client.Client, sizes ...int) ([]client.Ptr, [][]byte) {
	t.Helper()
	st := c.Stream()
	var ps []client.Ptr
	var data [][]byte
	for i, n := range sizes {
		p, err := c.Malloc(0, uint64(n))
		if err != nil {
			t.Fatal(err)
		}
		b := randomBytes(uint64(40+i), n)
		st.CopyToDevice(p, b)
		ps, data = append(ps, p), append(data, b)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return ps, data
}

// A node connection that drops while the node stays up loses nothing: the
// session reclaims the frames the node parked for it, and every byte of
// every buffer there reads back; new work goes on. So for a session with
// no journal (a mediator with no state directory): its connection
// attached all the same.
func TestNodeDropReclaimsMemory(t *testing.T) {
	for _, journal := range []bool{true, false} {
		t.Run(fmt.Sprintf("journal=%v", journal), func(t *testing.T) { nodeDropReclaimsMemory(t, journal) })
	}
}

func nodeDropReclaimsMemory(t *testing.T, journal bool) {
	var cut *cutter
	sys := startWith(t, 64<<20, func(c *mediator.Config) {
		if !journal {
			c.StateDir = ""
		}
		cut = newCutter(t, c.Nodes[0])
		c.Nodes[0] = cut.addr
	})
	c := sys.dial(t, "a", 1)
	ps, data := writeBuffers(t, c, 4<<20, 4096, 3<<20+17)
	if err := c.Seal(ps[0]); err != nil {
		t.Fatal(err)
	}

	if n := cut.cut(); n != 1 {
		t.Fatalf("%d attached connections cut, want the session's 1", n)
	}
	st := c.Stream()
	for i, p := range ps {
		if err := readBack(t, st, p, data[i]); err != nil {
			t.Fatalf("buffer %d after the drop: %v", i, err)
		}
	}
	if n := mediator.NodeReclaims(sys.med, c.Session()); n != 1 {
		t.Fatalf("%d node connections reclaimed, want 1", n)
	}
	// The session goes on: a write to a kept buffer, a new one; and the
	// reclaimed connection, attached under the same owner and token, can
	// drop and be reclaimed again.
	data[1] = randomBytes(50, 4096)
	st.CopyToDevice(ps[1], data[1])
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	fresh, fdata := writeBuffers(t, c, 2<<20)
	if n := cut.cut(); n != 1 {
		t.Fatalf("%d attached connections cut the second time, want the reclaimed 1", n)
	}
	for i, p := range append(ps, fresh...) {
		if err := readBack(t, st, p, append(data, fdata...)[i]); err != nil {
			t.Fatalf("buffer %d after the second drop: %v", i, err)
		}
	}
	if n := mediator.NodeReclaims(sys.med, c.Session()); n != 2 {
		t.Fatalf("%d node connections reclaimed, want 2", n)
	}
	for _, p := range append(ps, fresh...) {
		if err := c.Free(p); err != nil {
			t.Fatalf("free %#x: %v", p, err)
		}
	}
}

// A drop longer than the node's reattach grace loses the memory there,
// typed, saying the reclaim was refused; the session goes on.
func TestNodeDropPastGraceLosesMemory(t *testing.T) {
	var cut *cutter
	sys := startWith(t, 64<<20, func(c *mediator.Config) {
		cut = newCutter(t, c.Nodes[0])
		c.Nodes[0] = cut.addr
	})
	sys.nodes[0].SetReattachGrace(200 * time.Millisecond)
	c := sys.dial(t, "a", 1)
	ps, data := writeBuffers(t, c, 4096, 2<<20)

	cut.refuse.Store(true)
	if n := cut.cut(); n != 1 {
		t.Fatalf("%d attached connections cut, want the session's 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for sys.nodes[0].Expired() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the node's grace did not end with the connection parked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cut.refuse.Store(false)
	st := c.Stream()
	for i, p := range ps {
		err := readBack(t, st, p, data[i])
		wantErr(t, err, api.ErrUnavailable, "dropped the session's connection (it did not restart)", "went with it", "the reclaim was refused", "keeps nothing of it")
	}
	if n := mediator.NodeReclaims(sys.med, c.Session()); n != 0 {
		t.Fatalf("%d node connections reclaimed, want none", n)
	}
	// The status and the tenants' listing show the lost bytes.
	if lost := lostBytes(t, sys, "a"); lost < 2<<20 {
		t.Fatalf("%d lost bytes shown, want at least the 2 MiB buffer's", lost)
	}
	fresh, fdata := writeBuffers(t, c, 4096)
	if err := readBack(t, st, fresh[0], fdata[0]); err != nil {
		t.Fatal(err)
	}
	for _, p := range append(ps, fresh...) {
		if err := c.Free(p); err != nil {
			t.Fatalf("free %#x: %v", p, err)
		}
	}
	if lost := lostBytes(t, sys, "a"); lost != 0 {
		t.Fatalf("%d lost bytes shown once every lost buffer is freed", lost)
	}
}

// lostBytes is the lost bytes the mediator's status shows for tenant's
// sessions, checked to be what its tenants' listing shows.
func lostBytes(t *testing.T, sys *system, tenant string) uint64 {
	t.Helper()
	var inStatus, inTenants uint64
	for _, s := range sys.med.Status().Tenants {
		if s.Tenant == tenant {
			inStatus += s.Lost
		}
	}
	for _, ti := range sys.med.Tenants() {
		if ti.Name == tenant {
			inTenants += ti.Lost
		}
	}
	if inStatus != inTenants {
		t.Fatalf("status shows %d lost bytes of tenant %s, its listing %d", inStatus, tenant, inTenants)
	}
	return inStatus
}

// A tensor graph of a node connection that dropped and was reclaimed is
// registered again on the new connection: it gives the same results after
// the drop, under the same id.
func TestNodeDropKeepsTensorGraphs(t *testing.T) {
	var cut *cutter
	sys := startWith(t, 64<<20, func(c *mediator.Config) {
		cut = newCutter(t, c.Nodes[0])
		c.Nodes[0] = cut.addr
	})
	c := raw(t, sys)
	if _, err := roundTrip(t, c, api.OpHello, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleTenant,
		Tenant: "acme", Resumable: true})); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	w := seq(n, func(i int) float32 { return float32(i) / 3 })
	id := mustRegister(t, c, affineGraph(n, weight(t, c, w)))
	checkAffine(t, c, id, w, 1)

	if k := cut.cut(); k != 1 {
		t.Fatalf("%d attached connections cut, want the session's 1", k)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := invoke(t, c, id, nil, client.Float32Bytes(w))
		if err == nil {
			break
		}
		// Until the watcher has redialled, the invocation meets the closed
		// connection; a graph gone with it says so.
		if !errors.Is(err, api.ErrUnavailable) || strings.Contains(err.Error(), "tensor graphs registered there") || time.Now().After(deadline) {
			t.Fatalf("invocation after the drop: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkAffine(t, c, id, w, 2)
	if err := release(t, c, id); err != nil {
		t.Fatal(err)
	}
}
