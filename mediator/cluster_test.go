package mediator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/cluster"
	"github.com/vgpu/vgpu/internal/capcheck"
	"github.com/vgpu/vgpu/internal/etcdtest"
	"github.com/vgpu/vgpu/mediator"
)

func etcdSession(t *testing.T, endpoints []string) *cluster.Session {
	t.Helper()
	s, err := cluster.Connect(cluster.Options{Endpoints: endpoints, TTL: 2 * time.Second, OpTimeout: time.Second, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// registeredNode starts a sim node and registers it as vgpu-node --etcd
// does; closing the returned session takes it out of the registry.
func registeredNode(t *testing.T, endpoints []string) (string, *cluster.Session) {
	t.Helper()
	n, addr, err := accelerator.StartSim("127.0.0.1:0", 1, 256<<20, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	s := etcdSession(t, endpoints)
	st := n.Status()
	info := cluster.NodeInfo{Addr: addr.String(), Backend: st.Backend}
	for _, d := range st.Devices {
		info.Devices = append(info.Devices, cluster.DeviceInfo{Index: d.Index, Name: d.Name, Memory: d.Memory, Free: uint64(d.Free) * accelerator.FrameSize})
	}
	if _, err := s.RegisterNode(info); err != nil {
		t.Fatal(err)
	}
	return addr.String(), s
}

// clusterMediator starts a mediator in cluster mode, serving on a socket
// it returns.
func clusterMediator(t *testing.T, endpoints []string, id string) (*mediator.Mediator, string) {
	t.Helper()
	tmp, err := os.MkdirTemp("", "vgpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	m, err := mediator.New(mediator.Config{ContainerDir: filepath.Join(tmp, "c"), StateDir: tmp, Log: quietLog(),
		Cluster: &mediator.ClusterConfig{Session: etcdSession(t, endpoints), ID: id, WaitNodes: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(tmp, "m.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(l)
	t.Cleanup(func() { m.Close() })
	return m, sock
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeOf is the node of the one device of the session c.
func nodeOf(t *testing.T, c *client.Client) string {
	t.Helper()
	devs := c.Devices()
	if len(devs) != 1 {
		t.Fatalf("devices %v", devs)
	}
	return devs[0].Node
}

// A mediator in cluster mode starts on the registered nodes, connects to a
// node that registers later and places on it, and places nothing more on
// a node whose registration went, while a session already there goes on.
func TestClusterNodesJoinAndLeave(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a, _ := registeredNode(t, etcd.Endpoints())
	m, sock := clusterMediator(t, etcd.Endpoints(), "m1")
	b, bs := registeredNode(t, etcd.Endpoints())
	eventually(t, 10*time.Second, "node b joined", func() bool { return len(m.Status().Nodes) == 2 })

	on := map[string]int{}
	var onB *client.Client
	for range 4 {
		c, err := client.Dial(client.Options{Socket: sock, Tenant: "x", Devices: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		n := nodeOf(t, c)
		on[n]++
		if n == b {
			onB = c
		}
	}
	if on[a] != 2 || on[b] != 2 {
		t.Fatalf("4 sessions placed %v, want 2 on each of %s and %s", on, a, b)
	}

	st := m.Status().Cluster
	if st == nil || st.ID != "m1" || len(st.Nodes) != 2 || len(st.Mediators) != 1 || st.Mediators[0].ID != "m1" || !st.Nodes[0].Connected {
		t.Fatalf("cluster status %+v", st)
	}

	bs.Close() // revokes b's lease: it leaves the registry at once
	eventually(t, 5*time.Second, "node b left", func() bool {
		st := m.Status().Cluster
		return st != nil && len(st.Nodes) == 1
	})
	for range 3 {
		c, err := client.Dial(client.Options{Socket: sock, Tenant: "x", Devices: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if n := nodeOf(t, c); n != a {
			t.Fatalf("a session placed on %s after it left the cluster", n)
		}
	}
	if _, err := client.Dial(client.Options{Socket: sock, Tenant: "x", Devices: 2}); err == nil {
		t.Fatal("2 devices granted with one node left in the cluster")
	}
	// The session on b goes on: b still serves, only its registration went.
	p, err := onB.Malloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	s := onB.Stream()
	s.CopyToDevice(p, make([]byte, 4096))
	if err := s.Synchronize(); err != nil {
		t.Fatalf("the session on the node that left: %v", err)
	}
}

// Two mediators admit one tenant's containers and host sessions against
// one cap, stored in etcd: neither passes it, whatever each holds alone;
// a release on one is room on the other; a new file in etcd is in force
// on both without a reload, and a local reload is refused.
func TestClusterQuotaAcrossMediators(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	registeredNode(t, etcd.Endpoints())
	admin := etcdSession(t, etcd.Endpoints())
	if _, err := admin.PutTenants(context.Background(), []byte("[tenants.t]\nmemory = \"64MiB\"\nmax_containers = 2\n")); err != nil {
		t.Fatal(err)
	}
	m1, _ := clusterMediator(t, etcd.Endpoints(), "m1")
	m2, sock2 := clusterMediator(t, etcd.Endpoints(), "m2")
	reg := func(m *mediator.Mediator, id string, mem uint64) error {
		_, err := m.Register(api.Register{Container: id, Tenant: "t", Memory: mem, Devices: 1, Pid: uint32(os.Getpid())})
		return err
	}
	if err := reg(m1, "c1", 32<<20); err != nil {
		t.Fatal(err)
	}
	if err := reg(m2, "c2", 24<<20); err != nil {
		t.Fatal(err)
	}
	err := reg(m2, "c3", 16<<20)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "cluster-wide") {
		t.Fatalf("m2 alone holds 24MiB of 64MiB, m1 32MiB: 16MiB more: %v, want quota exceeded cluster-wide", err)
	}
	if err := reg(m1, "c4", 1<<20); !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "max_containers is 2") {
		t.Fatalf("a third container: %v, want quota exceeded by max_containers", err)
	}

	// A host session of t on m2 allocates within what is left, 8MiB.
	c, err := client.Dial(client.Options{Socket: sock2, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Malloc(0, 8<<20); err != nil {
		t.Fatalf("8MiB in a host session, exactly the rest of the cap: %v", err)
	}
	if _, err := c.Malloc(0, 2<<20); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("2MiB past the cap in a host session: %v, want quota exceeded", err)
	}
	c.Close()

	if err := m1.Release("", "c1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "c1's reservation usable on m2", func() bool { return reg(m2, "c3", 16<<20) == nil })

	// A new file in etcd reaches both mediators.
	if _, err := admin.PutTenants(context.Background(), []byte("[tenants.t]\nmemory = \"64MiB\"\nmax_containers = 3\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "max_containers 3 in force on m1", func() bool { return reg(m1, "c5", 1<<20) == nil })
	if err := m2.Reload(); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "etcd") {
		t.Fatalf("a local reload in cluster mode: %v, want refused", err)
	}
	// The host session closed above releases its 8MiB when m2 reads the
	// close, which may come after the registrations: wait for it.
	var st *api.ClusterStatus
	eventually(t, 5*time.Second, "the closed host session's 8MiB released cluster-wide", func() bool {
		st = m1.Status().Cluster
		return st != nil && len(st.Tenants) == 1 && st.Tenants[0].Reserved == 41<<20
	})
	if st == nil || len(st.Tenants) != 1 || st.Tenants[0].Name != "t" || st.Tenants[0].Containers != 3 || st.Tenants[0].Reserved != 41<<20 {
		t.Fatalf("cluster-wide use %+v, want t with 3 containers and 41MiB", st)
	}
	for _, ti := range m2.Tenants() {
		if ti.Name == "t" && (ti.Cluster == nil || *ti.Cluster != api.ClusterUse{Reserved: 41 << 20, Containers: 3} || ti.Containers != 2) {
			t.Fatalf("m2's tenant t: %+v, cluster %+v; want its 2 containers here and 41MiB, 3 containers cluster-wide", ti, ti.Cluster)
		}
	}
}

// A mediator restarted on its state directory restores its containers and
// puts their reservations back in etcd, where the old run's lease took
// them away, so that another mediator cannot take that room.
func TestClusterRestoreReservations(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	registeredNode(t, etcd.Endpoints())
	admin := etcdSession(t, etcd.Endpoints())
	if _, err := admin.PutTenants(context.Background(), []byte("[tenants.t]\nmemory = \"64MiB\"\n")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	start := func() (*mediator.Mediator, *cluster.Session) {
		s, err := cluster.Connect(cluster.Options{Endpoints: etcd.Endpoints(), TTL: 2 * time.Second, OpTimeout: time.Second, Log: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		m, err := mediator.New(mediator.Config{ContainerDir: filepath.Join(dir, "c"), StateDir: dir, Log: quietLog(),
			Cluster: &mediator.ClusterConfig{Session: s, ID: "m1", WaitNodes: 5 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		return m, s
	}
	usage := func() cluster.Reservation {
		u, err := admin.Usage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return u["t"]
	}
	m, s := start()
	if _, err := m.Register(api.Register{Container: "c1", Tenant: "t", Memory: 48 << 20, Devices: 1, Pid: uint32(os.Getpid())}); err != nil {
		t.Fatal(err)
	}
	m.Close()
	s.Close()
	if u := usage(); u != (cluster.Reservation{}) {
		t.Fatalf("after the mediator stopped: %+v, want its lease's reservations gone", u)
	}
	m, s = start()
	defer s.Close()
	defer m.Close()
	eventually(t, 5*time.Second, "the restored container's reservation back in etcd", func() bool {
		return usage() == cluster.Reservation{Memory: 48 << 20, Containers: 1}
	})
	other, _ := clusterMediator(t, etcd.Endpoints(), "m2")
	if _, err := other.Register(api.Register{Container: "c2", Tenant: "t", Memory: 32 << 20, Devices: 1, Pid: uint32(os.Getpid())}); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("32MiB more with 48MiB restored under a 64MiB cap: %v, want quota exceeded", err)
	}
}

// Three mediators register and release one tenant's containers at once,
// from several goroutines each; the recorded history shows the tenant
// never certainly held more than its cap, while the cap was contended.
// With each mediator on a registry of its own (mediators that do not share
// reservations), the same check finds the over-admission.
func TestClusterConcurrentAdmission(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	const limit = 256 << 20
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("planted=%v", planted), func(t *testing.T) {
			n, addr, err := accelerator.StartSim("127.0.0.1:0", 1, 1<<30, quietLog())
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			var ms []*mediator.Mediator
			for i := range 3 {
				prefix := "/concurrent/"
				if planted {
					prefix = fmt.Sprintf("/planted%d/", i)
				}
				// A generous op timeout: an unavailable answer would be
				// load on this machine, not the protocol under test.
				s, err := cluster.Connect(cluster.Options{Endpoints: etcd.Endpoints(), TTL: 2 * time.Second, OpTimeout: 10 * time.Second, Prefix: prefix, Log: quietLog()})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if i == 0 || planted {
					if _, err := s.PutTenants(context.Background(), []byte("[tenants.t]\nmemory = \"256MiB\"\n")); err != nil {
						t.Fatal(err)
					}
					ns := cluster.NodeInfo{Addr: addr.String(), Backend: "sim", Devices: []cluster.DeviceInfo{{Name: "sim0", Memory: 1 << 30}}}
					if _, err := s.RegisterNode(ns); err != nil && !errors.Is(err, api.ErrInvalidArgument) {
						t.Fatal(err)
					}
				}
				dir := t.TempDir()
				m, err := mediator.New(mediator.Config{ContainerDir: filepath.Join(dir, "c"), StateDir: dir, Log: quietLog(),
					Cluster: &mediator.ClusterConfig{Session: s, ID: fmt.Sprintf("m%d", i), WaitNodes: 5 * time.Second}})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				ms = append(ms, m)
			}
			var mu sync.Mutex
			var history []capcheck.Event
			refused := 0
			stop := time.Now().Add(3 * time.Second)
			var wg sync.WaitGroup
			for g := range 12 {
				m := ms[g%3]
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 2))
					for i := 0; time.Now().Before(stop); i++ {
						id := fmt.Sprintf("g%d-%d", g, i)
						mem := uint64(16+r.IntN(48)) << 20
						_, err := m.Register(api.Register{Container: id, Tenant: "t", Memory: mem, Devices: 1, Pid: uint32(os.Getpid())})
						got := time.Now()
						if errors.Is(err, api.ErrQuotaExceeded) {
							mu.Lock()
							refused++
							mu.Unlock()
							continue
						}
						if err != nil {
							t.Error(err)
							return
						}
						time.Sleep(time.Duration(10+r.IntN(20)) * time.Millisecond)
						put := time.Now()
						if err := m.Release("", id); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						history = append(history, capcheck.Event{Tenant: "t", Memory: mem, Got: got, Put: put})
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			capcheck.Require(t, history, limit, refused, planted)
		})
	}
}
