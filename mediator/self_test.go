package mediator_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// A container reads what it has over its own socket — its grant as its
// devices' memory, its use, its tenant's device time, its sessions — and
// nothing of another container, tenant or host session; every other
// operator request is refused there.
func TestContainerSeesOnlyItself(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	regs := map[string]*api.RegisterReply{}
	for _, r := range []struct {
		ns, id string
		memory uint64
	}{{"moby", "mine", 32 << 20}, {"k8s.io", "theirs", 16 << 20}} {
		reply, err := op.Register(api.Register{Container: r.id, Namespace: r.ns, Memory: r.memory, Pid: uint32(os.Getpid())})
		if err != nil {
			t.Fatal(err)
		}
		regs[r.id] = reply
		c, err := client.Dial(client.Options{Socket: reply.Socket})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		work(t, c)
	}
	work(t, cs.dial(t, "bystander", 1))

	view, err := client.DialOperator(regs["mine"].Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	self, err := view.Self()
	if err != nil {
		t.Fatal(err)
	}
	if self.Tenant != "team-a" || self.Container != "mine" || self.Namespace != "moby" || self.Memory != 32<<20 || self.Resident != 32<<20 {
		t.Fatalf("self: %+v", self)
	}
	if self.Charged < 4<<20 || self.Charged > self.Memory {
		t.Fatalf("self charged %d bytes, want its 4 MiB allocation, at most its %d", self.Charged, self.Memory)
	}
	if len(self.Devices) != 1 {
		t.Fatalf("self has %d devices, want its grant's 1: %+v", len(self.Devices), self.Devices)
	}
	d := self.Devices[0]
	if d.Memory != 32<<20 || d.Name == "" || d.Node == "" || d.Used < 4<<20 || d.Used > 32<<20 {
		t.Fatalf("device: %+v, want its grant of 32 MiB with 4 MiB or more in use", d)
	}
	if d.Launches == 0 || d.DeviceTime <= 0 {
		t.Fatalf("device: %+v, want the tenant's launch and its device time", d)
	}
	if len(self.Sessions) != 1 || self.Sessions[0].Container != "mine" || self.Sessions[0].Tenant != "team-a" {
		t.Fatalf("sessions %+v, want the container's one", self.Sessions)
	}
	body, err := json.Marshal(self)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{`"theirs"`, `"shared"`, `"bystander"`, `"k8s.io"`} { // as JSON values
		if strings.Contains(string(body), other) {
			t.Fatalf("the container's view names %q: %s", other, body)
		}
	}
	// The other container sees itself, not this one.
	view2, err := client.DialOperator(regs["theirs"].Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer view2.Close()
	if s2, err := view2.Self(); err != nil || s2.Tenant != "shared" || s2.Container != "theirs" || s2.Memory != 16<<20 || len(s2.Sessions) != 1 {
		t.Fatalf("the other container's view: %+v, %v", s2, err)
	}

	// Asked in a loop, it answers at most once per SelfInterval.
	start := time.Now()
	for range 3 {
		if _, err := view.Self(); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < 2*mediator.SelfInterval {
		t.Errorf("three readings in a row took %v, want at least %v", took, 2*mediator.SelfInterval)
	}

	// What a container may not read.
	_, err = view.Status()
	wantErr(t, err, api.ErrPermissionDenied, "status", "mine")
	_, err = view.Tenants()
	wantErr(t, err, api.ErrPermissionDenied, "tenants")
	if _, err := view.Kernels(); err != nil {
		t.Fatalf("kernels over a container's socket: %v", err)
	}
	// A request with a body is refused before it is read, and the
	// connection closed.
	_, err = view.Register(api.Register{Container: "x", Namespace: "moby", Memory: 1 << 20})
	wantErr(t, err, api.ErrPermissionDenied, "register")
	// The host socket has no self.
	_, err = op.Self()
	wantErr(t, err, api.ErrPermissionDenied, "self")
	// The mediator kept serving.
	again, err := client.DialOperator(regs["mine"].Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, err := again.Self(); err != nil {
		t.Fatal(err)
	}
}

// work allocates 4 MiB, copies into it and launches a kernel on it.
func work(t *testing.T, c *client.Client) {
	t.Helper()
	const n = 1 << 20
	x, err := c.Malloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	s.Memset(x, 0, 4*n)
	s.Launch("saxpy", client.I64(n), client.F32(2), client.Buf(x), client.Buf(x))
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}
