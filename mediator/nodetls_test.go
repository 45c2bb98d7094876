package mediator

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/pki"
)

// A mediator without TLS settings that dials a node serving TLS is told
// that the node may want TLS, and which flags give it.
func TestPlainDialOfATLSNodeSaysTLS(t *testing.T) {
	nodeCfg, _, err := pki.Ephemeral("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	n, addr, err := accelerator.StartSimWith("127.0.0.1:0", 1, 64<<20, accelerator.SimOptions{TLS: nodeCfg}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	rpc, _, err := dialNode(addr.String(), nodeTenant{name: "t"}, nil, nil)
	if err == nil {
		rpc.Close()
		t.Fatal("a plain hello to a TLS node succeeded")
	}
	if !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("%v, want api.ErrUnavailable", err)
	}
	for _, w := range []string{addr.String(), "TLS", "--node-tls-cert"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not say %q", err, w)
		}
	}
}
