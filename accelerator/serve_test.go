package accelerator

import (
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/pki"
)

// TestWatchRefuses checks that a node never serves on a listener it
// cannot watch, nor with TLS that lets any client in.
func TestWatchRefuses(t *testing.T) {
	ul, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	if _, err := Watch(ul, nil, DefaultMediatorTimeout); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "not TCP") {
		t.Errorf("Watch of a unix listener: %v, want invalid-argument naming it not TCP", err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	nodeCfg, _, err := pki.Ephemeral("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	open := nodeCfg.Clone()
	open.ClientAuth = tls.RequestClientCert
	if _, err := Watch(tl, open, DefaultMediatorTimeout); err == nil || !strings.Contains(err.Error(), "client certificates") {
		t.Errorf("Watch with TLS not requiring client certificates: %v, want refused", err)
	}
	if _, err := Watch(tl, nodeCfg, 0); err == nil {
		t.Error("Watch with a peer timeout of 0: nil error, want refused")
	}
	if _, err := Watch(tl, nodeCfg, DefaultMediatorTimeout); err != nil {
		t.Errorf("Watch with the node configuration: %v", err)
	}
}
