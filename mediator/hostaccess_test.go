package mediator

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/isolation"
)

// hostPeer reads the peer's uid, effective gid and supplementary groups
// from the kernel, through the reply-timeout wrapper of a tenant's
// connection too. (Other users' peers: e2e/hostaccess_test.go.)
func TestHostAccessPeer(t *testing.T) {
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	groups, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, nc := range []net.Conn{c, &replyConn{Conn: c}} {
		p, err := hostPeer(nc)
		if err != nil {
			t.Fatal(err)
		}
		if int(p.UID) != os.Getuid() || len(p.GIDs) == 0 || int(p.GIDs[0]) != os.Getegid() || !p.Operator {
			t.Fatalf("peer %+v: want uid %d, gid %d first, an operator", p, os.Getuid(), os.Getegid())
		}
		for _, g := range groups {
			if !slices.Contains(p.GIDs, uint32(g)) {
				t.Errorf("peer %+v lacks supplementary group %d", p, g)
			}
		}
	}
}

// Where the peer cannot be told, a mapped host socket refuses: a
// connection without credentials is nobody's; an open one admits.
func TestHostAccessWithoutCredentials(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	mapped, err := isolation.Parse("tenants.toml", []byte("[tenants.alice]\n[host.users]\n1000 = [\"alice\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := &Mediator{admission: isolation.NewAdmission(mapped)}
	if err := m.admitHost(a, "alice"); !errors.Is(err, api.ErrPermissionDenied) {
		t.Errorf("mapped, no credentials: %v, want permission denied", err)
	}
	m.admission.SetConfig(isolation.Default())
	if err := m.admitHost(a, "alice"); err != nil {
		t.Errorf("open, no credentials: %v", err)
	}
}
