package accelerator

import (
	"crypto/tls"
	"fmt"
	"net"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator/sim"
)

// StartSim starts a node with n simulated devices of size bytes each,
// serving plain TCP on addr (host:port; port 0 picks one). It is the
// embedded default of a mediator with no --node, and the test harness's
// node. Stop it with Close.
func StartSim(addr string, n int, size uint64, log logrus.FieldLogger) (*Node, net.Addr, error) {
	return StartSimTLS(addr, n, size, nil, log)
}

// StartSimTLS is StartSim serving TLS only when tlsCfg is not nil (a node
// configuration from internal/pki: mutual TLS, mediators only). A client
// that does not complete the TLS handshake within HandshakeTimeout, or whose
// certificate the configuration refuses, is dropped before it can send a
// request.
func StartSimTLS(addr string, n int, size uint64, tlsCfg *tls.Config, log logrus.FieldLogger) (*Node, net.Addr, error) {
	devs, err := sim.NewDevices(n, size)
	if err != nil {
		return nil, nil, err
	}
	ds := make([]Device, len(devs))
	for i, d := range devs {
		ds[i] = d
	}
	node, err := New("sim", ds, log)
	if err != nil {
		for _, d := range devs {
			d.Close()
		}
		return nil, nil, err
	}
	l, err := Listen(addr, tlsCfg)
	if err != nil {
		node.Close()
		return nil, nil, err
	}
	go func() {
		if err := node.Serve(l); err != nil {
			log.WithError(err).Error("node stopped serving")
		}
	}()
	return node, l.Addr(), nil
}

// Listen listens on addr (host:port) for mediators: plain TCP when tlsCfg
// is nil, else TLS only. The TLS handshake runs on a connection's first read,
// which the node bounds with HandshakeTimeout, so a slow or silent client
// holds up no one else.
func Listen(addr string, tlsCfg *tls.Config) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("node listen on %s: %w", addr, err)
	}
	if tlsCfg == nil {
		return l, nil
	}
	if tlsCfg.ClientAuth != tls.RequireAndVerifyClientCert || tlsCfg.ClientCAs == nil {
		l.Close()
		return nil, fmt.Errorf("node listen on %s: TLS configuration does not require verified client certificates", addr)
	}
	return tls.NewListener(l, tlsCfg), nil
}
