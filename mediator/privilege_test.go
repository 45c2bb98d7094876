package mediator

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

func TestStateChangesNeedAPrivilegedPeer(t *testing.T) {
	m := &Mediator{}
	for _, op := range []wire.Op{api.OpRegister, api.OpRelease, api.OpReload} {
		_, err := m.operate(op, nil, false)
		if !errors.Is(err, api.ErrPermissionDenied) || !strings.Contains(err.Error(), op.String()) {
			t.Errorf("%v from an unprivileged peer: %v", op, err)
		}
	}
	_, err := m.operate(api.OpMalloc, nil, true)
	if !errors.Is(err, api.ErrPermissionDenied) {
		t.Errorf("malloc as operator: %v", err)
	}
}

func TestPrivilegedSeesPeerCredentials(t *testing.T) {
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := net.Dial("unix", l.Addr().String())
		if err == nil {
			defer c.Close()
			c.Read(make([]byte, 1))
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !privileged(c) {
		t.Error("a peer of our own user is not privileged")
	}
	tc1, tc2 := net.Pipe()
	defer tc1.Close()
	defer tc2.Close()
	if privileged(tc1) {
		t.Error("a connection without peer credentials is privileged")
	}
}
