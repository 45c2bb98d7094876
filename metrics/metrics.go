// Package metrics exports what vgpu-node and vgpu-mediator know about their
// tenants, devices and requests as Prometheus metrics, served over HTTP at
// /metrics when a daemon is started with --metrics ADDR.
//
// It owns the metric names, labels and units (docs/metrics.md lists them)
// and the HTTP listener that serves them. It reads the daemons' state
// through the status snapshots they already compute for operators
// (api.Status, api.NodeStatus, api.TenantInfo), at scrape time: the
// collectors (node.go, mediator.go) keep no state of their own and add
// nothing to a request's path. The exceptions are request latency and
// errors by operation and code, and container admissions (requests.go),
// which no snapshot holds: a Requests is a wire.ReplyObserver that each
// served connection tells of every reply, at the cost of one histogram
// observation.
//
// Invariants: a scrape never changes what it reads; a failure of the
// metrics listener is logged and never stops the daemon serving tenants;
// label values come from the operator's configuration, from the host's
// hardware (a cuda device's GPU: UUID, PCI bus id) or from bounded sets
// (operations, codes), never from an unbounded value a tenant
// chooses, except tenant names the mediator has admitted.
//
// It imports api only; cmd/vgpu-node and cmd/vgpu-mediator wire it.
package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
)

// Path is where the metrics are served.
const Path = "/metrics"

// scrapeTimeout bounds one scrape. A mediator's status asks its nodes, each
// for at most 5 s (an unreachable one), at once.
const scrapeTimeout = 15 * time.Second

// Server serves one daemon's metrics.
type Server struct {
	addr net.Addr
	srv  *http.Server
	done chan struct{} // closed when Serve returned
}

// Start listens on addr (host:port; port 0 picks one) and serves, on its
// own goroutine, the metrics of the given collectors at Path, with the Go
// runtime's and the process's. An address that cannot be listened on (in
// use, not local, malformed) is an error that names it, so that the daemon
// refuses to start rather than run without the metrics asked for. Once
// started, a failure to serve is logged; the daemon goes on serving its
// tenants.
func Start(addr string, log logrus.FieldLogger, cs ...prometheus.Collector) (*Server, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	if ta, ok := l.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
		// Not refused: Prometheus scrapes from another host. Said, because
		// the metrics name every tenant and container of the host.
		log.WithField("addr", l.Addr().String()).Warn("serving metrics beyond loopback, without authentication: " +
			"whoever reaches the address reads every tenant's and container's names and use; keep it on a trusted network")
	}
	mux := http.NewServeMux()
	mux.Handle(Path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      errorLog{log},
		ErrorHandling: promhttp.ContinueOnError, // a collector's error costs its metric, not the scrape
		Timeout:       scrapeTimeout,
		// Scrapes run the status queries; a burst of them must not pile up.
		MaxRequestsInFlight: 4,
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "vgpu metrics: %s\n", Path)
	})
	s := &Server{addr: l.Addr(), done: make(chan struct{}),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: scrapeTimeout + 5*time.Second}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.WithError(err).WithField("addr", s.addr.String()).Error("metrics listener stopped; still serving tenants")
		}
	}()
	return s, nil
}

// Addr is the address served on.
func (s *Server) Addr() net.Addr { return s.addr }

// Close stops serving and waits for the server's goroutine.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	return err
}

// errorLog is promhttp's error log on the daemon's logger.
type errorLog struct{ log logrus.FieldLogger }

func (e errorLog) Println(v ...any) { e.log.Warn(append([]any{"metrics: "}, v...)...) }
