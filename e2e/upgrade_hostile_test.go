package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/etcdtest"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
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
	p := sleeping(t)
	if _, err := register(t, r.socket, api.Register{Container: "job", Namespace: "moby", Memory: 32 << 20, Devices: 1, Pid: uint32(p.Process.Pid)}); err != nil {
		t.Fatal(err)
	}
	reserved := func() []api.ClusterTenant {
		if cs := status(t, r.socket).Cluster; cs != nil {
			return cs.Tenants
		}
		return nil
	}
	before := reserved()
	rep, out, err := r.upgradeTo("", "--upgrade-timeout", "30s")
	if err != nil || rep.RolledBack || rep.NewPid == 0 {
		t.Fatalf("vgpuctl upgrade in cluster mode: %v, report %+v\n%s\nmediator log:\n%s", err, rep, out, r.med.out)
	}
	checkBuffers(t, c, ws, "after the upgrade in cluster mode")
	// "default": the container's tenant; "t": the host session's chunk.
	if after := reserved(); !slices.Contains(before, api.ClusterTenant{Name: "default", Reserved: 32 << 20, Containers: 1}) || !reflect.DeepEqual(after, before) {
		t.Fatalf("cluster-wide reservations %+v before the upgrade, %+v after; want the container's 32MiB among them, the same", before, after)
	}
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

// TestLiveUpgradeWhileRegistering: containers register one after another,
// as the runtime hook does, while an upgrade runs. None fails — the one
// whose connection the handover closed registers again, with the
// successor — and every registration is the new mediator's afterwards,
// its socket taking connections.
func TestLiveUpgradeWhileRegistering(t *testing.T) {
	r := newRestartable(t)
	r.start()
	p := sleeping(t)
	dial := func(socket string) (runtimehook.Mediator, error) { return client.DialOperator(socket) }
	stop := make(chan struct{})
	type result struct {
		name, socket string
		err          error
	}
	results := make(chan result, 100)
	go func() {
		defer close(results)
		for i := 0; i < 60; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("c%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), runtimehook.HookDeadline)
			reply, err := runtimehook.Register(ctx, r.socket, dial, api.Register{Container: name, Namespace: "moby", Memory: 1 << 20, Devices: 1, Pid: uint32(p.Process.Pid)})
			cancel()
			if err != nil {
				results <- result{name, "", err}
				continue
			}
			results <- result{name, reply.Socket, nil}
			time.Sleep(3 * time.Millisecond) // 60 of them span the upgrade
		}
	}()
	for range 2 { // each upgrade catches a registration in flight about 3 times in 4 here
		time.Sleep(50 * time.Millisecond)
		if rep, out, err := r.upgradeTo(""); err != nil {
			close(stop)
			t.Fatalf("vgpuctl upgrade: %v, report %+v\n%s", err, rep, out)
		}
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	var acked []result
	for res := range results {
		if res.err != nil {
			t.Errorf("registration %s failed during the upgrade: %v", res.name, res.err)
		} else {
			acked = append(acked, res)
		}
	}
	st := status(t, r.socket)
	have := map[string]bool{}
	for _, c := range st.Containers {
		have[c.Container] = true
	}
	for _, a := range acked {
		if !have[a.name] {
			t.Errorf("acknowledged registration %s is not the new mediator's", a.name)
		}
		c, err := net.Dial("unix", a.socket)
		if err != nil {
			t.Errorf("acknowledged registration %s: socket %s: %v", a.name, a.socket, err)
		} else {
			c.Close()
		}
	}
	if len(st.Containers) != len(acked) || len(acked) < 10 {
		t.Errorf("%d registrations acknowledged, the new mediator has %d containers; want the same, and at least 10", len(acked), len(st.Containers))
	}
	t.Logf("%d registrations across the upgrade", len(acked))
}
