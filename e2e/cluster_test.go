package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/internal/etcdtest"
)

// clusterMediator starts vgpu-mediator --etcd with id, returning its socket
// and process.
func clusterMediator(t *testing.T, endpoints, id string) (string, *proc) {
	t.Helper()
	dir := t.TempDir()
	socket := filepath.Join(dir, "mediator.sock")
	p := startProc(t, "vgpu-mediator", "--socket", socket, "--etcd", endpoints, "--cluster-id", id, "--etcd-ttl", "2s",
		"--state-dir", dir, "--container-dir", filepath.Join(dir, "c"), "--quota", "", "--containerd", "", "--log-level", "warn")
	waitFor(t, "vgpu-mediator "+id+" to serve on its socket", func() bool { return daemon.Serving(socket) })
	return socket, p
}

// registerRetry registers, retrying while the answer is unavailable (an
// etcd member just killed) for at most d.
func registerRetry(t *testing.T, socket string, reg api.Register, d time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		_, err := register(t, socket, reg)
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The real binaries in cluster mode on a 3-member etcd: vgpuctl tenants
// apply sets one cap for two mediators, which neither passes; nodes
// register and join a running mediator; one etcd member dies and service
// goes on; a SIGKILLed mediator's reservation comes back within its lease
// TTL; with etcd gone, a session goes on and a registration fails
// unavailable within a bounded time.
func TestClusterProcesses(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	eps := strings.Join(etcd.Endpoints(), ",")
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[tenants.t]\nmemory = \"256MiB\"\nmax_containers = -1\n"), 0o644)
	if out, err := run(t, "vgpuctl", "tenants", "apply", "--etcd", eps, bad); err == nil || !strings.Contains(out, "max_containers") {
		t.Fatalf("tenants apply of an invalid file: %v\n%s", err, out)
	}
	quota := filepath.Join(dir, "tenants.toml")
	os.WriteFile(quota, []byte("[tenants.t]\nmemory = \"256MiB\"\nmax_containers = 3\n"), 0o644)
	if out, err := run(t, "vgpuctl", "tenants", "apply", "--etcd", eps, quota); err != nil {
		t.Fatalf("tenants apply: %v\n%s", err, out)
	}

	nodeA := startNode(t, "--etcd", eps, "--etcd-ttl", "2s", "--memory", "1GiB")
	s1, m1 := clusterMediator(t, eps, "m1")
	s2, _ := clusterMediator(t, eps, "m2")
	pid := uint32(os.Getpid())
	if _, err := register(t, s1, api.Register{Container: "c1", Tenant: "t", Memory: 160 << 20, Devices: 1, Pid: pid}); err != nil {
		t.Fatal(err)
	}
	_, err := register(t, s2, api.Register{Container: "c2", Tenant: "t", Memory: 128 << 20, Devices: 1, Pid: pid})
	if !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("m2 alone holds nothing, m1 160MiB of 256MiB: 128MiB more: %v, want quota exceeded", err)
	}
	st := status(t, s2)
	if c := st.Cluster; c == nil || len(c.Nodes) != 1 || c.Nodes[0].Addr != nodeA || len(c.Mediators) != 2 ||
		len(c.Tenants) != 1 || c.Tenants[0].Reserved != 160<<20 {
		t.Fatalf("m2's cluster status %+v", st.Cluster)
	}
	out, err := run(t, "vgpuctl", "--socket", s2, "status")
	if err != nil || !strings.Contains(out, "this mediator: m2") || !strings.Contains(out, nodeA) {
		t.Fatalf("vgpuctl status: %v\n%s", err, out)
	}

	out, err = run(t, "vgpuctl", "--socket", s2, "tenants")
	if err != nil || !strings.Contains(out, "RESERVED CLUSTER-WIDE") || !strings.Contains(out, "160.0 MiB") {
		t.Fatalf("vgpuctl tenants: %v\n%s", err, out)
	}

	// A node that registers now joins the running mediators.
	nodeB := startNode(t, "--etcd", eps, "--etcd-ttl", "2s", "--memory", "1GiB")
	waitFor(t, "node b in m2", func() bool { return len(status(t, s2).Nodes) == 2 })

	// One etcd member of three dies: admissions go on.
	etcd.Kill(0)
	if err := registerRetry(t, s2, api.Register{Container: "c3", Tenant: "t", Memory: 64 << 20, Devices: 1, Pid: pid}, 10*time.Second); err != nil {
		t.Fatalf("with an etcd member dead: %v", err)
	}

	// m1 is SIGKILLed holding 160MiB: within its 2s TTL, m2 can have it.
	if _, err := register(t, s2, api.Register{Container: "c4", Tenant: "t", Memory: 190 << 20, Devices: 1, Pid: pid}); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("190MiB while m1 holds 160MiB: %v, want quota exceeded", err)
	}
	m1.cmd.Process.Signal(syscall.SIGKILL)
	m1.cmd.Wait()
	killed := time.Now()
	// Restarted at once with its id, m1 waits for its predecessor's lease.
	clusterMediator(t, eps, "m1")
	t.Logf("m1 restarted with its id, serving %v after the SIGKILL", time.Since(killed))
	for {
		_, err := register(t, s2, api.Register{Container: "c4", Tenant: "t", Memory: 190 << 20, Devices: 1, Pid: pid})
		if err == nil {
			break
		}
		if !errors.Is(err, api.ErrQuotaExceeded) || time.Since(killed) > 5*time.Second {
			t.Fatalf("%v after m1's SIGKILL: %v", time.Since(killed), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("m1's reservation was m2's %v after its SIGKILL (TTL 2s)", time.Since(killed))

	// A host session on m2, placed on a node, then etcd goes away.
	c, err := client.Dial(client.Options{Socket: s2, Tenant: "other", Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := []string{c.Devices()[0].Node, c.Devices()[1].Node}; !(got[0] != got[1] && (got[0] == nodeB || got[1] == nodeB)) {
		t.Fatalf("a 2-device session on nodes %v, want one device on each of %s and %s", got, nodeA, nodeB)
	}
	p, err := c.Malloc(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	etcd.Kill(1)
	etcd.Kill(2)
	start := time.Now()
	_, err = register(t, s2, api.Register{Container: "c5", Tenant: "t", Memory: 1 << 20, Devices: 1, Pid: pid})
	if !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a registration with etcd gone: %v, want unavailable", err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("refused after %v, want within the hook's 8s", d)
	}
	s := c.Stream()
	s.CopyToDevice(p, make([]byte, 1<<20))
	if err := s.Synchronize(); err != nil {
		t.Fatalf("a session with etcd gone: %v", err)
	}
}
