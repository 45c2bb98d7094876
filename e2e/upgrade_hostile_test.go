package e2e

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/etcdtest"
)

// TestLiveUpgradeCluster: vgpuctl upgrade of a mediator in cluster mode.
// The successor registers under the same --cluster-id, which the old
// process's etcd lease holds until that process lets it go: the upgrade
// serves on the successor and the tenant's bytes read back intact, rather
// than the successor waiting out a lease the old process keeps alive and
// nothing serving after both binaries failed.
func TestLiveUpgradeCluster(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	eps := strings.Join(etcd.Endpoints(), ",")
	startNode(t, "--etcd", eps, "--etcd-ttl", "2s", "--memory", "256MiB")
	dir := t.TempDir()
	r := &restartable{t: t, dir: dir, socket: filepath.Join(dir, "m.sock")}
	r.med = startProc(t, "vgpu-mediator", "--socket", r.socket, "--etcd", eps, "--cluster-id", "m1", "--etcd-ttl", "2s",
		"--state-dir", filepath.Join(dir, "state"), "--container-dir", filepath.Join(dir, "c"), "--quota", "", "--containerd", "", "--log-level", "info")
	waitFor(t, "the mediator to serve with its node", func() bool {
		c, err := net.Dial("unix", r.socket)
		if err != nil {
			return false
		}
		c.Close()
		return len(status(t, r.socket).Nodes) == 1
	})
	c, err := client.Dial(client.Options{Socket: r.socket, Tenant: "t", Reconnect: 30e9})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ws := writeBuffers(t, c, 2<<20, 1000)
	rep, out, err := r.upgradeTo("", "--upgrade-timeout", "30s")
	if err != nil || rep.RolledBack || rep.NewPid == 0 {
		t.Fatalf("vgpuctl upgrade in cluster mode: %v, report %+v\n%s\nmediator log:\n%s", err, rep, out, r.med.out)
	}
	checkBuffers(t, c, ws, "after the upgrade in cluster mode")
}

// TestLiveUpgradeTwiceBeforeResume: two upgrades in a row while a tenant,
// idle, has not yet resumed its session on the first successor (it waits
// restored, its journal and frames kept): the second successor restores it
// again, and every byte reads back.
func TestLiveUpgradeTwiceBeforeResume(t *testing.T) {
	r := newRestartable(t)
	r.start()
	c := r.dial(30e9)
	ws := writeBuffers(t, c, 4<<20, 4000)
	for i := range 2 {
		if rep, out, err := r.upgradeTo(""); err != nil || rep.RolledBack {
			t.Fatalf("upgrade %d: %v, report %+v\n%s\nmediator log:\n%s", i+1, err, rep, out, r.med.out)
		}
	}
	if n := strings.Count(r.med.out.String(), "session resumed"); n != 0 {
		t.Fatalf("%d sessions resumed before the tenant called again: the upgrades did not find it waiting\n%s", n, r.med.out)
	}
	checkBuffers(t, c, ws, "after two upgrades with the session not resumed in between")
}
