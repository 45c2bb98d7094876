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
	etcdBin := etcdtest.Binary()
	if etcdBin == "" {
		testenv.Missing(t, "no etcd binary (apt-get install etcd-server)")
	}
	lab := netlab.New(t, "etcd", "node", "m")
	bin := netlabBinaries(t)
	dir := t.TempDir()
	client2379, peer := "http://"+lab.Addr("etcd", 2379), "http://"+lab.Addr("etcd", 2380)
	etcd := lab.Start("etcd", etcdBin, "--name", "e0", "--data-dir", filepath.Join(dir, "e0"),
		"--listen-client-urls", client2379, "--advertise-client-urls", client2379,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "e0="+peer,
		"--heartbeat-interval", "50", "--election-timeout", "500")
	if err := etcd.WaitUp(20*time.Second, func() bool {
		c, err := lab.Dial(context.Background(), "m", "tcp", lab.Addr("etcd", 2379), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}); err != nil {
		t.Fatal(err)
	}
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
