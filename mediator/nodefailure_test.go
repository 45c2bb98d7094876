package mediator_test

import (
	"net"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// A node that goes away fails the work of the sessions on it with
// ErrUnavailable; once it is back, status recovers and new sessions work.
func TestNodeRestart(t *testing.T) {
	node, addr, err := accelerator.StartSim("127.0.0.1:0", 1, 64<<20, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	m, err := mediator.New(mediator.Config{Nodes: []string{addr.String()}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s := &system{socket: t.TempDir() + "/m.sock", med: m}
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(l)

	c := s.dial(t, "a", 1)
	p, err := c.Malloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	node.Close()
	st := c.Stream()
	st.Memset(p, 1, 4096)
	wantErr(t, st.Synchronize(), api.ErrUnavailable)
	if ns := m.Status().Nodes[0]; ns.Error == "" {
		t.Fatalf("status of a stopped node has no error: %+v", ns)
	}

	node, _, err = accelerator.StartSim(addr.String(), 1, 64<<20, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	deadline := time.Now().Add(5 * time.Second)
	for m.Status().Nodes[0].Error != "" {
		if time.Now().After(deadline) {
			t.Fatalf("status did not recover: %+v", m.Status().Nodes[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
	fresh, err := client.Dial(client.Options{Socket: s.socket, Tenant: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	victim(t, fresh)
}
