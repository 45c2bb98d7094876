// Package statuspage serves a mediator's operator view over HTTP
// (vgpu-mediator --http): an HTML page with what vgpuctl status and vgpuctl
// tenants show — nodes, devices, the GPUs behind cuda devices as NVML reads
// them, memory, tenants, containers, sessions —
// and line charts of the last minutes, refreshed live, and the same
// snapshot as JSON (/status.json).
//
// It owns no state of the mediator's: it asks a Source, which in the
// mediator is the operator socket (OperatorSource), exactly what vgpuctl
// reads. A sampler asks once per interval and keeps the newest snapshot and
// a ring of Samples for the charts; requests are answered from those, so a
// browser's refreshes never reach the mediator or its nodes and a slow node
// slows the samples, not the page.
//
// The page is for operators, like the operator socket: Listen refuses an
// address that is not loopback unless Config.AllowRemote says the operator
// means it, and with a loopback address requests must name a loopback host
// (a DNS-rebinding page in the operator's browser names its own).
//
// Lock order: Server.mu is a leaf; the sampler asks the Source without it.
package statuspage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
)

// Defaults of Config.
const (
	DefaultInterval = time.Second
	DefaultWindow   = 5 * time.Minute
)

// shutdownTimeout bounds how long Close waits for requests in flight before
// it cuts their connections.
const shutdownTimeout = 2 * time.Second

// Source is where the page's snapshots come from: a *client.Operator or an
// OperatorSource.
type Source interface {
	Status() (*api.Status, error)
	Tenants() ([]api.TenantInfo, error)
}

// Config says where and what the status page serves.
type Config struct {
	Addr        string // host:port to listen on, loopback unless AllowRemote
	AllowRemote bool   // the operator means a non-loopback Addr
	Source      Source
	Interval    time.Duration // between samples and page refreshes; 0: DefaultInterval
	Window      time.Duration // of the charts; 0: DefaultWindow
	Log         logrus.FieldLogger
}

// Snapshot is one answer of the Source, as /status.json serves it with the
// samples of the charts.
type Snapshot struct {
	Time    time.Time        `json:"time"`
	Status  *api.Status      `json:"status"`
	Tenants []api.TenantInfo `json:"tenants"`
	// Error is why the Source did not answer at Time; Status and Tenants
	// are then the last ones it gave, if any.
	Error   string   `json:"error,omitempty"`
	History []Sample `json:"history,omitempty"`
}

// Server is a status page: listening after Listen, serving after Serve,
// until Close.
type Server struct {
	cfg    Config
	l      net.Listener
	srv    *http.Server
	served chan struct{} // closed when srv.Serve has returned
	stop   context.CancelFunc
	done   chan struct{} // closed when the sampler has returned

	serveOnce sync.Once // Serve's start, and stop's set
	closeOnce sync.Once
	closeErr  error // Close's result, set once

	mu   sync.Mutex
	last Snapshot      // guarded by mu: the newest, without History
	hist *Ring[Sample] // guarded by mu
}

// Listen checks cfg and listens on cfg.Addr; Serve then serves. A taken
// port, or an address that is not loopback without AllowRemote, is an
// error that names the address. The mediator listens before it starts
// anything else, so that such a mistake stops it at once, and serves once
// its socket answers.
func Listen(cfg Config) (*Server, error) {
	if cfg.Source == nil {
		return nil, fmt.Errorf("status page: no source: %w", api.ErrInvalidArgument)
	}
	if cfg.Interval < 0 || cfg.Window < 0 {
		return nil, fmt.Errorf("status page: interval %v, window %v: want more than 0: %w", cfg.Interval, cfg.Window, api.ErrInvalidArgument)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Window < 2*cfg.Interval {
		return nil, fmt.Errorf("status page: window %v holds fewer than two samples %v apart: %w", cfg.Window, cfg.Interval, api.ErrInvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	l, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("status page: %w", err) // "listen tcp ADDR: bind: address already in use"
	}
	// The bound address, not the one asked for: "localhost" may resolve to
	// anything, and an empty host is every interface.
	if ip := l.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() && !cfg.AllowRemote {
		l.Close()
		return nil, fmt.Errorf("status page on %s: it would listen on %s, beyond this host; the page is for operators, like the operator socket, so it listens on loopback unless allowed explicitly: %w",
			cfg.Addr, l.Addr(), api.ErrPermissionDenied)
	}
	s := &Server{cfg: cfg, l: l, served: make(chan struct{}), done: make(chan struct{}),
		hist: NewRing[Sample](int(cfg.Window/cfg.Interval) + 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.page("page"))
	mux.HandleFunc("GET /live", s.page("live"))
	mux.HandleFunc("GET /status.json", s.statusJSON)
	s.srv = &http.Server{Handler: s.checkHost(mux), ReadHeaderTimeout: 10 * time.Second}
	return s, nil
}

// Serve takes a first sample, so that the first page has data, and serves
// until Close, in goroutines of its own. Later calls do nothing.
func (s *Server) Serve() {
	s.serveOnce.Do(func() {
		s.sample(time.Now())
		ctx, stop := context.WithCancel(context.Background())
		s.stop = stop
		go func() {
			defer close(s.served)
			if err := s.srv.Serve(s.l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.cfg.Log.WithError(err).Error("status page stopped serving")
			}
		}()
		go s.sampler(ctx)
	})
}

// Addr is the address the page is served on.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Close stops listening and serving: it lets requests in flight finish for
// a moment, then cuts them, and stops the sampler. The Source is the
// caller's. Later calls return the first one's result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		// Once this returns, a Serve before has finished starting and one
		// after does nothing.
		s.serveOnce.Do(func() {})
		if s.stop == nil { // never served
			s.closeErr = s.l.Close()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		err := s.srv.Shutdown(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			err = s.srv.Close()
		}
		<-s.served
		s.stop()
		<-s.done
		s.closeErr = err
	})
	return s.closeErr
}

// sampler samples every interval until ctx ends.
func (s *Server) sampler(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sample(now)
		}
	}
}

// sample asks the Source and records the answer. A failed answer keeps the
// last good status on the page, marked with the error, and adds no Sample:
// the charts show a gap's neighbours joined rather than a drop to zero
// that did not happen.
func (s *Server) sample(now time.Time) {
	st, err := s.cfg.Source.Status()
	var ts []api.TenantInfo
	if err == nil {
		ts, err = s.cfg.Source.Tenants()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.last.Error == "" {
			s.cfg.Log.WithError(err).Warn("status page: the mediator did not answer")
		}
		s.last.Time, s.last.Error = now, err.Error()
		return
	}
	var prev *Sample
	if p, ok := s.hist.Last(); ok {
		prev = &p
	}
	s.hist.Add(NewSample(now, st, prev))
	s.last = Snapshot{Time: now, Status: st, Tenants: ts}
}

// snapshot returns the newest snapshot and the samples of the charts.
func (s *Server) snapshot() (Snapshot, []Sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.hist.Values()
}

// page serves template name, the whole page or its live part.
func (s *Server) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		snap, hist := s.snapshot()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		noCache(w)
		if err := render(w, name, snap, hist, s.cfg.Window, s.cfg.Interval); err != nil {
			s.cfg.Log.WithError(err).Error("status page")
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}
}

// statusJSON serves the newest snapshot with the charts' samples.
func (s *Server) statusJSON(w http.ResponseWriter, r *http.Request) {
	snap, hist := s.snapshot()
	snap.History = hist
	b, err := json.Marshal(snap)
	if err != nil {
		http.Error(w, fmt.Sprintf("encode status: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	noCache(w)
	w.Write(b)
}

func noCache(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}

// checkHost refuses, on a loopback-only page, a request whose Host is not
// a loopback name or address: a page of another site that got the
// operator's browser to resolve its name to 127.0.0.1 (DNS rebinding)
// sends its own name, and must not read the status.
func (s *Server) checkHost(next http.Handler) http.Handler {
	if s.cfg.AllowRemote {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			http.Error(w, fmt.Sprintf("host %q: this status page answers only to a loopback name or address", r.Host), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether an HTTP Host (name or address, with or
// without a port) is "localhost" or a loopback address.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]") // "[::1]" without a port
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
