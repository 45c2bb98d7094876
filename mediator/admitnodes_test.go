package mediator_test

import (
	"os"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// With a node down, a container that asks for more devices than the
// reachable nodes have is refused as unavailable, naming the node; one
// they can serve is admitted and its session placed on them, though the
// node down is the first one and as little used. Once the node is back,
// the first container is admitted too.
func TestAdmissionWithNodeDown(t *testing.T) {
	s := startNodes(t, 2, 1, 64<<20, nil)
	addr := s.med.Status().Nodes[0].Addr
	s.nodes[0].Close()
	waitDown(t, s, 0)

	pid := uint32(os.Getpid())
	_, err := s.med.Register(api.Register{Container: "both", Devices: 2, Memory: 16 << 20, Pid: pid})
	wantErr(t, err, api.ErrUnavailable, "both", addr)

	reply, err := s.med.Register(api.Register{Container: "one", Memory: 16 << 20, Pid: pid})
	if err != nil {
		t.Fatalf("register a container the reachable node can serve: %v", err)
	}
	c, err := client.Dial(client.Options{Socket: reply.Socket})
	if err != nil {
		t.Fatalf("session of a container admitted with a node down: %v", err)
	}
	defer c.Close()
	if _, err := c.Malloc(0, 1<<20); err != nil {
		t.Fatalf("allocate in a container admitted with a node down: %v", err)
	}

	node, _, err := accelerator.StartSim(addr, 1, 64<<20, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	if _, err := s.med.Register(api.Register{Container: "both", Devices: 2, Memory: 16 << 20, Pid: pid}); err != nil {
		t.Fatalf("register once the node is back: %v", err)
	}
}

// waitDown waits until the mediator's status reports node i unreachable:
// the node's end of its connection may take a moment to be seen closed.
func waitDown(t *testing.T, s *system, i int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.med.Status().Nodes[i].Error == "" {
		if time.Now().After(deadline) {
			t.Fatalf("node %d still reported reachable 10s after it stopped", i)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
