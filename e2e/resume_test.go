package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
)

// nodeUsed asks the node at addr, as a mediator would, how many bytes of
// its devices are held.
func nodeUsed(t *testing.T, addr string) uint64 {
	t.Helper()
	var used uint64
	for _, d := range nodeStatusAt(t, addr).Devices {
		used += d.Used
	}
	return used
}

// nodeStatusAt asks the node at addr for its status, as a mediator would.
func nodeStatusAt(t *testing.T, addr string) api.NodeStatus {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rpc := wire.NewRPC(wire.NewConn(nc), "node "+addr)
	defer rpc.Close()
	if _, err := rpc.Call(api.OpHello, nil, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator})); err != nil {
		t.Fatal(err)
	}
	body, err := rpc.Call(api.OpNodeStatus, nil)
	if err != nil {
		t.Fatal(err)
	}
	var st api.NodeStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// dial opens a session of tenant team-a that tries to reconnect for
// reconnect (0: the default), closed with the test.
func (r *restartable) dial(reconnect time.Duration) *client.Client {
	r.t.Helper()
	c, err := client.Dial(client.Options{Socket: r.socket, Tenant: "team-a", Reconnect: reconnect})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close() })
	return c
}

// written is a buffer a tenant wrote, and the checksum of what it wrote.
type written struct {
	p   client.Ptr
	n   int
	sum [32]byte
}

// writeBuffers allocates buffers of the sizes given on c, fills them with
// random bytes through its default stream, and waits for the writes.
func writeBuffers(t *testing.T, c *client.Client, sizes ...int) []written {
	t.Helper()
	var ws []written
	s := c.Stream()
	for _, n := range sizes {
		p, err := c.Malloc(0, uint64(n))
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rand.Uint32())
		}
		s.CopyToDevice(p, b)
		ws = append(ws, written{p, n, sha256.Sum256(b)})
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return ws
}

// checkBuffers reads each of ws back, one at a time, and fails the test if
// a read fails or its bytes differ from what was written; when names the
// moment in the messages.
func checkBuffers(t *testing.T, c *client.Client, ws []written, when string) {
	t.Helper()
	s := c.Stream()
	for i, x := range ws {
		got := make([]byte, x.n)
		s.CopyFromDevice(got, x.p)
		if err := s.Synchronize(); err != nil {
			t.Fatalf("read %s: %v", when, err)
		}
		if sha256.Sum256(got) != x.sum {
			t.Fatalf("buffer %d differs %s", i, when)
		}
	}
}

// TestSessionSurvivesMediatorKill: a tenant writes device memory through a
// mediator that is then SIGKILLed and started again on the same state
// directory; the tenant's next calls reconnect and resume its session on
// their own, and every byte it wrote reads back intact.
func TestSessionSurvivesMediatorKill(t *testing.T) {
	r := newRestartable(t)
	r.start()
	c := r.dial(0)
	ws := writeBuffers(t, c, 3<<20, 64<<10, 5000, 8<<20+123, 100)
	w := ws[3]
	if err := c.Seal(w.p); err != nil {
		t.Fatal(err)
	}
	session := c.Session()

	r.kill()
	r.start()
	s := c.Stream()
	got := make([][]byte, len(ws))
	for i, x := range ws {
		got[i] = make([]byte, x.n)
		s.CopyFromDevice(got[i], x.p)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("reading back after the restart: %v\nmediator log:\n%s", err, r.med.out.String())
	}
	for i, x := range ws {
		if sha256.Sum256(got[i]) != x.sum {
			t.Fatalf("buffer %d (%d bytes at %#x) differs after the restart", i, x.n, x.p)
		}
	}
	if c.Session() != session {
		t.Fatalf("session %d after the restart, want %d resumed", c.Session(), session)
	}
	r.med.out.waitLog(t, "the mediator's log does not say it restored and resumed the session", "session restored", "session resumed")
	// It goes on: new memory, and its sealed weight stays sealed.
	more := writeBuffers(t, c, 1<<20)
	s.CopyToDevice(w.p, []byte{1})
	if err := s.Synchronize(); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("write to the sealed weight after the restart: %v, want permission denied", err)
	}
	for _, x := range append(ws, more...) {
		if err := c.Free(x.p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReattachGraceExpires: with no mediator coming back, the node keeps a
// killed mediator's frames for its --reattach-grace, then scrubs and frees
// them; a mediator started after that cannot restore the session, says
// so, and the tenant's next call fails as unavailable.
func TestReattachGraceExpires(t *testing.T) {
	r := newRestartable(t, "--reattach-grace", "1s")
	r.start()
	c := r.dial(20 * time.Second)
	writeBuffers(t, c, 8<<20)
	r.kill()
	killed := time.Now()
	if used := nodeUsed(t, r.node); used < 8<<20 {
		t.Fatalf("node holds %d bytes right after the kill, want the session's 8 MiB kept", used)
	}
	waitFor(t, "the node to free the frames", func() bool { return nodeUsed(t, r.node) == 0 })
	if held := time.Since(killed); held < 900*time.Millisecond {
		t.Fatalf("frames freed %v after the kill, before the 1s grace", held)
	}
	r.start()
	if _, err := c.Stats(); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "no session to resume") {
		t.Fatalf("call after the grace ended: %v, want unavailable: no session to resume", err)
	}
	if out := r.med.out.String(); !strings.Contains(out, "session not restored") || !strings.Contains(out, "grace ended") {
		t.Fatalf("the mediator's log does not say why it did not restore the session:\n%s", out)
	}
}

// TestUpgradeHandover: SIGUSR2 makes the mediator hand over, as an upgrade
// does: it exits, a new one starts on the same state directory, and the
// tenant goes on with its session and every byte of its device memory.
func TestUpgradeHandover(t *testing.T) {
	r := newRestartable(t)
	r.start()
	c := r.dial(0)
	ws := writeBuffers(t, c, 6<<20, 3000)
	if err := r.med.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	if err := r.med.cmd.Wait(); err != nil {
		t.Fatalf("mediator after SIGUSR2: %v\n%s", err, r.med.out.String())
	}
	if out := r.med.out.String(); !strings.Contains(out, "handing over") {
		t.Fatalf("the mediator's log does not say it handed over:\n%s", out)
	}
	r.start()
	checkBuffers(t, c, ws, "after the handover")
}

// TestContainerSessionSurvivesMediatorKill: a session through a
// container's socket survives a SIGKILL of the mediator with its bytes,
// and the container's accounting is what it was: vgpuctl tenants shows
// the same reservation, allocation and charge, and the grant still bounds
// what the session may allocate.
func TestContainerSessionSurvivesMediatorKill(t *testing.T) {
	r := newRestartable(t)
	r.start()
	p := sleeping(t)
	sock := r.register(api.Register{Container: "job", Namespace: "moby", Memory: 32 << 20, Devices: 1, Pid: uint32(p.Process.Pid)})
	c, err := client.Dial(client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ws := writeBuffers(t, c, 8<<20, 64<<10, 777)
	before := r.tenantLine("team-a")
	if before.Allocated == 0 || before.Reserved != 32<<20 {
		t.Fatalf("team-a before the kill: %+v", before)
	}
	r.kill()
	r.start()
	checkBuffers(t, c, ws, "through the container's socket after the restart")
	if after := r.tenantLine("team-a"); after != before {
		t.Fatalf("team-a after the restart: %+v, want %+v as before", after, before)
	}
	if _, err := c.Malloc(0, 24<<20); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("malloc past the grant after the restart: %v, want quota exceeded", err)
	}
}

// tenantLine is tenant name's line of vgpuctl tenants --json.
func (r *restartable) tenantLine(name string) api.TenantInfo {
	r.t.Helper()
	for _, ti := range r.tenantList() {
		if ti.Name == name {
			return ti
		}
	}
	r.t.Fatalf("tenant %s not listed", name)
	return api.TenantInfo{}
}

// TestContainerReattachGraceExpires: a container's session holds memory
// when its mediator is SIGKILLed, and no mediator comes back within the
// node's --reattach-grace. The node then scrubs and frees the frames (its
// devices hold nothing, its log says it scrubbed them), not before the
// grace; the mediator started after that restores the container's
// registration but not the session, and the container's quota is whole
// again: vgpuctl tenants shows its reservation with nothing allocated or
// charged, and a new session through its socket allocates what the dead
// one held, which the 32 MiB grant would refuse if that were still charged.
func TestContainerReattachGraceExpires(t *testing.T) {
	const grace, held = 2 * time.Second, 20 << 20
	r := newRestartable(t, "--reattach-grace", grace.String(), "--log-level", "info")
	r.start()
	p := sleeping(t)
	sock := r.register(api.Register{Container: "job", Namespace: "moby", Memory: 32 << 20, Devices: 1, Pid: uint32(p.Process.Pid)})
	c, err := client.Dial(client.Options{Socket: sock, Reconnect: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	writeBuffers(t, c, held)
	if before := r.tenantLine("team-a"); before.Containers != 1 || before.Reserved != 32<<20 || before.Allocated < held || before.Charged < held {
		t.Fatalf("team-a before the kill: %+v, want its container's 32 MiB reserved and %d bytes allocated and charged", before, held)
	}

	r.kill()
	killed := time.Now()
	if used := nodeUsed(t, r.node); used < held {
		t.Fatalf("node holds %d bytes right after the kill, want the session's %d kept", used, held)
	}
	waitFor(t, "the node to free the frames", func() bool { return nodeUsed(t, r.node) == 0 })
	if after := time.Since(killed); after < grace*9/10 {
		t.Fatalf("frames freed %v after the kill, before the %v grace", after, grace)
	}
	r.nodeProc.out.waitLog(t, "the node's log does not say it scrubbed the frames when the grace ended",
		"reattach grace ended with no reclaim: frames scrubbed and freed")

	r.start()
	if after := r.tenantLine("team-a"); after.Containers != 1 || after.Reserved != 32<<20 || after.Allocated != 0 || after.Charged != 0 {
		t.Fatalf("team-a after the restart: %+v, want the container's 32 MiB reserved and nothing allocated or charged", after)
	}
	if _, err := c.Stats(); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("call of the expired session after the restart: %v, want unavailable", err)
	}
	fresh, err := client.Dial(client.Options{Socket: sock})
	if err != nil {
		t.Fatalf("a new session through the container's socket after the restart: %v", err)
	}
	defer fresh.Close()
	if _, err := fresh.Malloc(0, held); err != nil {
		t.Fatalf("a new session allocating the %d bytes the expired one held: %v\n%s", held, err, r.med.out.String())
	}
}
