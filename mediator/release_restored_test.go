package mediator

import (
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// deviceUsed is the memory the host's node holds on its device, as the
// running mediator's status reports it.
func (h *host) deviceUsed() uint64 {
	h.t.Helper()
	st := h.med.Status()
	if len(st.Nodes) != 1 || len(st.Nodes[0].Devices) != 1 {
		h.t.Fatalf("status: %+v, want one node with one device", st.Nodes)
	}
	return st.Nodes[0].Devices[0].Used
}

// A container released after a restart, before its tenant resumed its
// session, takes the restored session with it: its frames are freed before
// the release returns the container's quota, as for a live session, not
// ResumeGrace later (meanwhile the quota could be granted again while the
// node still held the memory).
func TestReleaseEndsRestoredSessions(t *testing.T) {
	h := newHost(t)
	h.start()
	h.serveHost()
	reply := h.register(api.Register{Container: "a", Namespace: "moby", Memory: 16 << 20, Pid: uint32(sleeper(t).Process.Pid)})
	c, err := client.Dial(client.Options{Socket: reply.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Malloc(0, 8<<20); err != nil {
		t.Fatal(err)
	}
	h.crash()
	h.start()
	if used := h.deviceUsed(); used < 8<<20 {
		t.Fatalf("the restored session holds %d bytes on the device, want its 8 MiB", used)
	}
	if err := h.med.Release("moby", "a"); err != nil {
		t.Fatal(err)
	}
	if used := h.deviceUsed(); used != 0 {
		t.Errorf("after the container's release its restored session still holds %d bytes on the device", used)
	}
	h.med.mu.Lock()
	left := len(h.med.restored)
	h.med.mu.Unlock()
	if left != 0 {
		t.Errorf("%d restored sessions left after their container's release", left)
	}
}
