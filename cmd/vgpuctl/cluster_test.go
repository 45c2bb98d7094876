package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/cluster"
	"github.com/vgpu/vgpu/internal/etcdtest"
)

// tenants apply refuses an invalid file before touching etcd, and stores a
// valid one where mediators read it.
func TestTenantsApply(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[tenants.a]\nmemory = \"12X\"\n"), 0o644)
	err := tenantsApply([]string{"--etcd", "127.0.0.1:1", bad})
	if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "12X") || !strings.Contains(err.Error(), "bad.toml") {
		t.Fatalf("invalid file: %v, want invalid argument naming the file and value", err)
	}
	if err := tenantsApply([]string{bad}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("no endpoints: %v", err)
	}

	etcd := etcdtest.Start(t, 1)
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte("[tenants.a]\nmemory = \"1GiB\"\n"), 0o644)
	if err := tenantsApply([]string{"--etcd", etcd.Endpoint(0), good}); err != nil {
		t.Fatal(err)
	}
	// And to an etcd that requires TLS client certificates.
	etls := etcdtest.StartTLS(t, 1)
	cert, key, ca := etls.TLSFiles()
	if err := tenantsApply([]string{"--etcd", etls.Endpoint(0), good}); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("to a TLS etcd without TLS flags: %v, want unavailable", err)
	}
	if err := tenantsApply([]string{"--etcd", etls.Endpoint(0), "--etcd-cert", cert, "--etcd-key", key, "--etcd-ca", ca, good}); err != nil {
		t.Fatalf("to a TLS etcd: %v", err)
	}
	s, err := cluster.Connect(cluster.Options{Endpoints: etcd.Endpoints(), TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := s.Client().Get(context.Background(), cluster.DefaultPrefix+"tenants")
	if err != nil || len(resp.Kvs) != 1 || !strings.Contains(string(resp.Kvs[0].Value), "1GiB") {
		t.Fatalf("stored file %v, %v", resp, err)
	}
}

func TestRenderCluster(t *testing.T) {
	var b bytes.Buffer
	if err := renderCluster(&b, nil); err != nil || b.Len() != 0 {
		t.Fatalf("outside cluster mode: %q, %v", b.String(), err)
	}
	renderCluster(&b, &api.ClusterStatus{ID: "m1",
		Nodes:     []api.ClusterNode{{Addr: "10.0.0.1:7070", Backend: "sim", Devices: 2, Memory: 2 << 30, Free: 1 << 30, Connected: true}},
		Mediators: []api.ClusterMediator{{ID: "m1", Host: "h1"}},
		Tenants:   []api.ClusterTenant{{Name: "a", Reserved: 64 << 20, Containers: 2}}})
	for _, want := range []string{"this mediator: m1", "10.0.0.1:7070", "2.0 GiB", "yes", "h1", "64.0 MiB"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("cluster section lacks %q:\n%s", want, b.String())
		}
	}
}

func TestRenderClusterUse(t *testing.T) {
	var b bytes.Buffer
	if err := renderClusterUse(&b, []api.TenantInfo{{Name: "a"}}); err != nil || b.Len() != 0 {
		t.Fatalf("outside cluster mode: %q, %v", b.String(), err)
	}
	renderClusterUse(&b, []api.TenantInfo{{Name: "a", Cluster: &api.ClusterUse{Reserved: 3 << 30, Containers: 7}}})
	for _, want := range []string{"RESERVED CLUSTER-WIDE", "3.0 GiB", "7"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("cluster use lacks %q:\n%s", want, b.String())
		}
	}
}
