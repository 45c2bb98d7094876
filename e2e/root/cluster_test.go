package root

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/etcdtest"
	"github.com/vgpu/vgpu/internal/netlab"
	"github.com/vgpu/vgpu/internal/testenv"
)

// TestNetlabEtcdPartition cuts the etcd host off the network (packets
// vanish: nothing is refused, every call must time out) under a cluster-mode
// mediator: a session placed before goes on computing; registrations fail
// unavailable within a bounded time, before and after the mediator's lease
// has surely expired; once healed, registrations succeed again and etcd
// holds again every container the mediator runs, the lease lost during the
// partition notwithstanding.
func TestNetlabEtcdPartition(t *testing.T) {
	lab := netlab.New(t, "etcd", "node", "m")
	bin := netlabBinaries(t)
	dir := t.TempDir()
	client2379 := startLabEtcd(t, lab, "etcd", "m")
	startLabNode(t, lab, bin, "node", lab.Addr("node", 7070), "m", "--devices", "1", "--memory", "256MiB",
		"--etcd", client2379, "--etcd-ttl", "2s")
	sock := filepath.Join(dir, "m.sock")
	startLabMediator(t, lab, bin, "m", sock, dir, "--etcd", client2379, "--etcd-ttl", "2s", "--cluster-id", "m")

	register := func(id string) error {
		op, err := client.DialOperator(sock)
		if err != nil {
			return err
		}
		defer op.Close()
		_, err = op.Register(api.Register{Container: id, Memory: 8 << 20, Devices: 1, Pid: uint32(os.Getpid())})
		return err
	}
	containers := func() (int, error) {
		op, err := client.DialOperator(sock)
		if err != nil {
			return 0, err
		}
		defer op.Close()
		st, err := op.Status()
		if err != nil {
			return 0, err
		}
		if st.Cluster == nil || st.Cluster.Error != "" {
			return 0, fmt.Errorf("cluster status %+v", st.Cluster)
		}
		n := 0
		for _, tn := range st.Cluster.Tenants {
			n += tn.Containers
		}
		return n, nil
	}
	if err := register("c1"); err != nil {
		t.Fatal(err)
	}
	s, err := openNetlabSession(sock, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer s.c.Close()
	if _, err := s.fastest(3); err != nil {
		t.Fatal(err)
	}

	lab.Cut("etcd")
	for i, wait := range []time.Duration{0, 3 * time.Second} { // before and after the 2s lease
		time.Sleep(wait)
		start := time.Now()
		err := register(fmt.Sprintf("cut%d", i))
		took := time.Since(start)
		t.Logf("registration %d with etcd cut off: %v after %v", i, err, took)
		if !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("registration with etcd cut off: %v, want unavailable", err)
		}
		if took > 8*time.Second {
			t.Errorf("refused after %v, want within the hook's 8s", took)
		}
		if _, err := s.fastest(3); err != nil {
			t.Fatalf("the session with etcd cut off: %v", err)
		}
	}

	lab.Heal("etcd")
	healed := time.Now()
	waitFor(t, 20*time.Second, "a registration after the heal", func() bool { return register("c2") == nil })
	t.Logf("registrations work again %v after the heal", time.Since(healed))
	waitFor(t, 10*time.Second, "etcd to hold both containers again", func() bool { n, err := containers(); return err == nil && n == 2 })
}

// startLabEtcd starts a one-member etcd on host and returns its client URL.
func startLabEtcd(t *testing.T, lab *netlab.Lab, host, from string) string {
	t.Helper()
	etcdBin := etcdtest.Binary()
	if etcdBin == "" {
		testenv.Missing(t, "no etcd binary (apt-get install etcd-server)")
	}
	url, peer := "http://"+lab.Addr(host, 2379), "http://"+lab.Addr(host, 2380)
	p := lab.Start(host, etcdBin, "--name", "e0", "--data-dir", filepath.Join(t.TempDir(), "e0"),
		"--listen-client-urls", url, "--advertise-client-urls", url,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "e0="+peer,
		"--heartbeat-interval", "50", "--election-timeout", "500")
	if err := p.WaitUp(20*time.Second, func() bool {
		c, err := lab.Dial(context.Background(), from, "tcp", lab.Addr(host, 2379), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}); err != nil {
		t.Fatal(err)
	}
	return url
}

// TestNetlabNodePartitionCluster cuts off the host of the node a session
// is placed on, in cluster mode: the session's call fails unavailable
// after the node timeout; the node's lease expires, so the mediator stops
// placing on it: new sessions go to the other node and two devices are
// refused; once healed, the node registers again and both are used.
func TestNetlabNodePartitionCluster(t *testing.T) {
	lab := netlab.New(t, "etcd", "n1", "n2", "m")
	bin := netlabBinaries(t)
	url := startLabEtcd(t, lab, "etcd", "m")
	for _, n := range []string{"n1", "n2"} {
		startLabNode(t, lab, bin, n, lab.Addr(n, 7070), "m", "--devices", "1", "--memory", "64MiB",
			"--etcd", url, "--etcd-ttl", "2s", "--mediator-timeout", "2s")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "m.sock")
	startLabMediator(t, lab, bin, "m", sock, dir, "--etcd", url, "--etcd-ttl", "2s", "--cluster-id", "m", "--node-timeout", "2s")
	nodeOf := func(s *netlabSession) string { return s.c.Devices()[0].Node }
	registered := func() int {
		op, err := client.DialOperator(sock)
		if err != nil {
			return -1
		}
		defer op.Close()
		st, err := op.Status()
		if err != nil || st.Cluster == nil {
			return -1
		}
		return len(st.Cluster.Nodes)
	}
	waitFor(t, 10*time.Second, "both nodes registered", func() bool { return registered() == 2 })

	a, err := openNetlabSession(sock, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.c.Close()
	cut := "n1"
	if nodeOf(a) == lab.Addr("n2", 7070) {
		cut = "n2"
	}
	other := map[string]string{"n1": "n2", "n2": "n1"}[cut]
	lab.Cut(cut)
	start := time.Now()
	if _, err := a.fastest(1); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a session on the cut-off node: %v, want unavailable", err)
	}
	t.Logf("the session on the cut-off node failed after %v", time.Since(start))
	waitFor(t, 10*time.Second, "the cut-off node's lease to expire", func() bool { return registered() == 1 })
	for range 3 {
		b, err := openNetlabSession(sock, "b")
		if err != nil {
			t.Fatalf("a new session with %s cut off: %v", cut, err)
		}
		if got := nodeOf(b); got != lab.Addr(other, 7070) {
			t.Fatalf("a new session placed on %s, want %s", got, lab.Addr(other, 7070))
		}
		if _, err := b.fastest(1); err != nil {
			t.Fatal(err)
		}
		b.c.Close()
	}
	if c, err := client.Dial(client.Options{Socket: sock, Tenant: "two", Devices: 2}); err == nil {
		c.Close()
		t.Fatal("two devices granted with one node cut off")
	}

	lab.Heal(cut)
	waitFor(t, 15*time.Second, "the healed node registered again", func() bool { return registered() == 2 })
	waitFor(t, 15*time.Second, "a 2-device session over both nodes", func() bool {
		c, err := client.Dial(client.Options{Socket: sock, Tenant: "two", Devices: 2})
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}
