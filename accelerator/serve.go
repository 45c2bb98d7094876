package accelerator

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator/sim"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// DefaultMediatorTimeout is how long a mediator's host may stay silent
// before the node drops its connection (ListenTimeout).
const DefaultMediatorTimeout = wire.DefaultPeerTimeout

// StartSim starts a node with n simulated devices of size bytes each,
// serving plain TCP on addr (host:port; port 0 picks one). It is the
// embedded default of a mediator with no --node, and the test harness's
// node. Stop it with Close.
func StartSim(addr string, n int, size uint64, log logrus.FieldLogger) (*Node, net.Addr, error) {
	return StartSimWith(addr, n, size, SimOptions{}, log)
}

// SimOptions are StartSimWith's choices beyond the devices.
type SimOptions struct {
	// TLS, when set (a node configuration from internal/pki: mutual TLS,
	// mediators only), is the only protocol served. A client that does
	// not complete the TLS handshake within HandshakeTimeout, or whose
	// certificate the configuration refuses, is dropped before it can
	// send a request.
	TLS *tls.Config
	// MediatorTimeout bounds a mediator host's silence (ListenTimeout; 0:
	// DefaultMediatorTimeout).
	MediatorTimeout time.Duration
	// NoRetention scrubs every frame as it is freed: no sealed frame is
	// retained (SetRetention).
	NoRetention bool
	// RetainMax bounds the bytes of sealed frames retained per device
	// (LimitRetention); 0: as many as free memory holds.
	RetainMax uint64
	// ReattachGrace is how long the frames of an attached mediator
	// connection that dropped wait for a reclaim (SetReattachGrace; 0:
	// DefaultReattachGrace, a negative value: no wait, freed at once).
	ReattachGrace time.Duration
	// Requests, when set, is told of every reply to a mediator's request
	// (metrics of latency and errors by operation).
	Requests wire.ReplyObserver
}

// StartSimWith is StartSim with options.
func StartSimWith(addr string, n int, size uint64, o SimOptions, log logrus.FieldLogger) (*Node, net.Addr, error) {
	mediatorTimeout := o.MediatorTimeout
	if mediatorTimeout == 0 {
		mediatorTimeout = DefaultMediatorTimeout
	}
	if err := wire.CheckPeerTimeout(mediatorTimeout); err != nil {
		return nil, nil, fmt.Errorf("mediator timeout: %w", err)
	}
	devs, err := sim.NewDevices(n, size)
	if err != nil {
		return nil, nil, err
	}
	ds := make([]Device, len(devs))
	for i, d := range devs {
		ds[i] = d
	}
	return StartWith(addr, "sim", ds, o, log)
}

// StartWith is StartSimWith for devices of any backend (backend names them
// in status: "sim", "cuda"). On an error the devices are closed.
func StartWith(addr, backend string, devs []Device, o SimOptions, log logrus.FieldLogger) (*Node, net.Addr, error) {
	mediatorTimeout := o.MediatorTimeout
	if mediatorTimeout == 0 {
		mediatorTimeout = DefaultMediatorTimeout
	}
	node, err := New(backend, devs, log)
	if err != nil {
		for _, d := range devs {
			d.Close()
		}
		return nil, nil, err
	}
	node.SetRetention(!o.NoRetention)
	node.LimitRetention(o.RetainMax)
	if o.ReattachGrace != 0 {
		node.SetReattachGrace(max(o.ReattachGrace, 0))
	}
	node.requests = o.Requests
	l, err := ListenTimeout(addr, o.TLS, mediatorTimeout)
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

// Listen is ListenTimeout with DefaultMediatorTimeout.
func Listen(addr string, tlsCfg *tls.Config) (net.Listener, error) {
	return ListenTimeout(addr, tlsCfg, DefaultMediatorTimeout)
}

// ListenTimeout listens on addr (host:port) for mediators: plain TCP when
// tlsCfg is nil, else TLS only. The TLS handshake runs on a connection's
// first read, which the node bounds with HandshakeTimeout, so a slow or
// silent client holds up no one else. A mediator whose host stays silent
// for timeout (at least wire.MinPeerTimeout) loses its connection
// (wire.WatchPeer), and with it the frames the connection held and its
// coherence leases; one that is merely quiet keeps it.
func ListenTimeout(addr string, tlsCfg *tls.Config, timeout time.Duration) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("node listen on %s: %w", addr, err)
	}
	wl, err := Watch(l, tlsCfg, timeout)
	if err != nil {
		l.Close()
		return nil, err
	}
	return wl, nil
}

// Watch is ListenTimeout on a TCP listener already made, such as one in
// another network namespace.
func Watch(l net.Listener, tlsCfg *tls.Config, timeout time.Duration) (net.Listener, error) {
	if err := wire.CheckPeerTimeout(timeout); err != nil {
		return nil, fmt.Errorf("node listen on %s: %w", l.Addr(), err)
	}
	if tlsCfg != nil && (tlsCfg.ClientAuth != tls.RequireAndVerifyClientCert || tlsCfg.ClientCAs == nil) {
		return nil, fmt.Errorf("node listen on %s: TLS configuration does not require verified client certificates", l.Addr())
	}
	tl, ok := l.(*net.TCPListener)
	if !ok {
		return nil, fmt.Errorf("node listen on %s: a %T, not TCP: %w", l.Addr(), l, api.ErrInvalidArgument)
	}
	var wl net.Listener = &watchListener{TCPListener: tl, timeout: timeout}
	if tlsCfg == nil {
		return wl, nil
	}
	return tls.NewListener(wl, tlsCfg), nil
}

// watchListener accepts mediator connections watched for their peer's
// silence, below TLS if any.
type watchListener struct {
	*net.TCPListener
	timeout time.Duration
}

func (l *watchListener) Accept() (net.Conn, error) {
	for {
		tc, err := l.AcceptTCP()
		if err != nil {
			return nil, err
		}
		nc, err := wire.WatchPeer(tc, "mediator "+tc.RemoteAddr().String(), l.timeout)
		if err != nil {
			// Its socket refused the options: drop this one, serve on.
			tc.Close()
			continue
		}
		return nc, nil
	}
}
