// Package cluster is vgpu's cluster mode: membership, leases and
// cluster-wide quota reservations, kept in etcd (go.etcd.io/etcd/client/v3)
// when a daemon is given --etcd.
//
// Every process that joins holds one Session: an etcd client and a lease it
// keeps alive. What it registers lives under that lease, so that a process
// that dies, or is cut off from etcd for longer than the lease's TTL,
// vanishes from the cluster without anyone cleaning up after it:
//
//	<prefix>nodes/<addr>               NodeInfo (JSON), under the node's lease
//	<prefix>mediators/<id>             MediatorInfo (JSON), under the mediator's lease
//	<prefix>reserve/<tenant>/<id>      Reservation (JSON) of mediator id for tenant, under its lease
//	<prefix>tenants                    the quota file (TOML), without lease
//
// The prefix is "/vgpu/" unless Options says otherwise.
//
// Invariants:
//   - A tenant's reservations (the sum of its reserve/<tenant>/ keys) never
//     pass its caps: a reservation grows only by a transaction that compares
//     the mod revision of every key under the tenant's prefix with the
//     revision its sum was read at (Quotas.Reserve), so two mediators
//     growing at once cannot both succeed on the same sum. Shrinking and
//     expiry only lower the sum.
//   - A mediator admits from its own reservation without asking etcd only
//     while its lease is certainly alive on the server: until the send time
//     of its last acknowledged keepalive plus the TTL granted then, less a
//     margin (Session.Valid). Past that, each admission goes to etcd, and
//     fails with api.ErrUnavailable within Options.OpTimeout when etcd
//     cannot be reached.
//   - Every error this package returns for etcd trouble wraps
//     api.ErrUnavailable; a quota refusal wraps api.ErrQuotaExceeded; bad
//     input wraps api.ErrInvalidArgument. A malformed registry entry (by
//     hand, by an older version) is logged and skipped, never fatal.
//
// Lock order: Quotas' per-tenant lock (tenantState.mu), then Session.mu.
// No lock but tenantState.mu is held across an etcd round trip.
package cluster

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vgpu/vgpu/api"
)

// Defaults of Options.
const (
	DefaultTTL       = 10 * time.Second
	DefaultOpTimeout = 3 * time.Second
	DefaultPrefix    = "/vgpu/"
)

// Options say how to reach etcd and how long a member may stay silent.
type Options struct {
	Endpoints []string // client URLs, e.g. http://10.0.0.1:2379
	// TTL is the lease's time to live: how long after a process dies, or
	// loses etcd, its registrations and reservations remain. Default
	// DefaultTTL; at least 2s (etcd's own minimum is about 1.5s).
	TTL time.Duration
	// OpTimeout bounds each etcd operation, and so how long an admission
	// waits for an etcd that cannot be reached. Default DefaultOpTimeout.
	OpTimeout time.Duration
	Prefix    string // key prefix; default DefaultPrefix
	// TLS, when set, is the client configuration for https endpoints
	// (TLSFiles); nil: plain http.
	TLS *tls.Config
	Log logrus.FieldLogger
}

// TLSFiles is the client TLS configuration towards etcd from PEM files:
// the CA that signed etcd's serving certificate, and a client certificate
// and key where etcd asks for one (--client-cert-auth). All empty: nil,
// plain http. It fails with api.ErrInvalidArgument naming the file at fault.
func TLSFiles(cert, key, ca string) (*tls.Config, error) {
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	if ca == "" || (cert == "") != (key == "") {
		return nil, fmt.Errorf("etcd TLS: want a CA, and a certificate and its key together or neither (got cert %q, key %q, CA %q): %w", cert, key, ca, api.ErrInvalidArgument)
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("etcd TLS CA: %v: %w", err, api.ErrInvalidArgument)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("etcd TLS CA %s: no PEM certificate in it: %w", ca, api.ErrInvalidArgument)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("etcd TLS certificate %s, key %s: %v: %w", cert, key, err, api.ErrInvalidArgument)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// ParseEndpoints reads a --etcd flag: comma-separated URLs or host:port
// pairs (taken as http://).
func ParseEndpoints(v string) ([]string, error) {
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if !strings.Contains(e, "://") {
			e = "http://" + e
		}
		if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
			return nil, fmt.Errorf("etcd endpoint %q: want http://host:port or host:port: %w", e, api.ErrInvalidArgument)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("etcd endpoints %q: none given: %w", v, api.ErrInvalidArgument)
	}
	return out, nil
}

// Session is one process's membership: an etcd client and a lease kept
// alive. When the lease is lost (etcd unreachable past the TTL), a new one
// is granted as soon as etcd answers again, and the functions given to
// OnNewLease put back what the process had registered.
type Session struct {
	cli  *clientv3.Client
	opts Options
	log  logrus.FieldLogger

	mu sync.Mutex // guards the fields below
	// lease is the current lease; 0 while none is granted.
	lease clientv3.LeaseID
	// validUntil is when lease may have expired on the server at the
	// earliest, less a margin: the send time of the last acknowledged
	// grant or keepalive plus the TTL it granted.
	validUntil time.Time
	renew      []func(ctx context.Context, lease clientv3.LeaseID) error

	// ctx ends when the session closes, and with it every operation in
	// flight: a daemon stopping while etcd is unreachable does not wait
	// for their timeouts.
	ctx      context.Context
	cancel   context.CancelFunc
	stopOnce sync.Once
	done     chan struct{} // closed when the keepalive has stopped
}

// Connect connects to etcd and grants the session's lease. It fails with
// api.ErrInvalidArgument for bad options and api.ErrUnavailable when etcd
// does not answer within OpTimeout.
func Connect(opts Options) (*Session, error) {
	if len(opts.Endpoints) == 0 {
		return nil, fmt.Errorf("cluster: no etcd endpoints: %w", api.ErrInvalidArgument)
	}
	opts.TTL = cmp.Or(opts.TTL, DefaultTTL)
	opts.OpTimeout = cmp.Or(opts.OpTimeout, DefaultOpTimeout)
	opts.Prefix = cmp.Or(opts.Prefix, DefaultPrefix)
	if opts.TTL < 2*time.Second {
		return nil, fmt.Errorf("cluster: lease TTL %v: want at least 2s: %w", opts.TTL, api.ErrInvalidArgument)
	}
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: opts.Endpoints, DialTimeout: opts.OpTimeout,
		// A dead connection is noticed by keepalive within about the op
		// timeout, and the client moves to another endpoint.
		DialKeepAliveTime: opts.OpTimeout, DialKeepAliveTimeout: opts.OpTimeout,
		TLS: opts.TLS, Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: etcd %v: %v: %w", opts.Endpoints, err, api.ErrInvalidArgument)
	}
	s := &Session{cli: cli, opts: opts, log: opts.Log, done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := s.grant(); err != nil {
		cli.Close()
		return nil, err
	}
	go s.keepAlive()
	return s, nil
}

// Client is the etcd client, for callers' own reads.
func (s *Session) Client() *clientv3.Client { return s.cli }

// Options are the session's options, defaults filled in.
func (s *Session) Options() Options { return s.opts }

// key is the prefixed key of parts joined by "/".
func (s *Session) key(parts ...string) string { return s.opts.Prefix + strings.Join(parts, "/") }

// opContext bounds one etcd operation, ended early by Close.
func (s *Session) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, s.opts.OpTimeout)
}

// unavailable wraps an etcd error as api.ErrUnavailable, saying what failed.
func (s *Session) unavailable(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no answer within %v", s.opts.OpTimeout)
	}
	return fmt.Errorf("cluster: %s: etcd %s: %v: %w", what, strings.Join(s.opts.Endpoints, ","), err, api.ErrUnavailable)
}

// margin is how long before the server's earliest expiry the session stops
// counting on its lease: clocks of client and server run at slightly
// different rates, and the server may be behind by a heartbeat.
func (s *Session) margin() time.Duration { return s.opts.TTL / 10 }

// grant grants a new lease and runs the OnNewLease functions under it.
func (s *Session) grant() error {
	ctx, cancel := s.opContext()
	defer cancel()
	sent := time.Now()
	resp, err := s.cli.Grant(ctx, int64((s.opts.TTL+time.Second-1)/time.Second))
	if err != nil {
		return s.unavailable("grant lease", err)
	}
	s.mu.Lock()
	s.lease = resp.ID
	s.validUntil = sent.Add(time.Duration(resp.TTL)*time.Second - s.margin())
	renew := append([]func(context.Context, clientv3.LeaseID) error(nil), s.renew...)
	s.mu.Unlock()
	for _, f := range renew {
		if err := f(ctx, resp.ID); err != nil {
			s.log.WithError(err).Warn("cluster: putting back an entry under the new lease failed; retried at the next lease")
			return err
		}
	}
	return nil
}

// OnNewLease adds f to what runs after a new lease replaces a lost one; f
// puts back, under lease, what the lost lease's expiry deleted.
func (s *Session) OnNewLease(f func(ctx context.Context, lease clientv3.LeaseID) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renew = append(s.renew, f)
}

// Lease is the current lease, 0 while none is granted.
func (s *Session) Lease() clientv3.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease
}

// Valid says whether the lease is certainly still alive on the server now:
// what was put under it is still there.
func (s *Session) Valid() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease != 0 && time.Now().Before(s.validUntil)
}

// keepAlive renews the lease every third of its TTL until Close, and when
// the lease is found lost, grants a new one as soon as etcd answers. A
// renewal that fails for want of an answer (a member killed, a leader being
// elected), or a lease found lost, is retried after a tenth of the TTL
// rather than a third: the lease lives on in etcd through a failover, and
// the sooner a renewal gets through, the shorter the time Valid reports it
// uncertain; a lost lease's entries come back the sooner.
func (s *Session) keepAlive() {
	defer close(s.done)
	next := time.NewTimer(s.opts.TTL / 3)
	defer next.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-next.C:
		}
		wait := s.opts.TTL / 3
		if !s.renewOnce() {
			wait = s.opts.TTL / 10
		}
		if s.ctx.Err() != nil {
			return
		}
		next.Reset(wait)
	}
}

// renewOnce keeps the lease alive once, or grants a new one when it was
// lost, reporting whether the session holds a renewed lease afterwards.
func (s *Session) renewOnce() bool {
	s.mu.Lock()
	lease := s.lease
	s.mu.Unlock()
	if lease == 0 {
		if err := s.grant(); err != nil {
			return false
		}
		s.log.Warn("cluster: the lease was lost and a new one granted: registrations and reservations are back")
		return true
	}
	ctx, cancel := s.opContext()
	sent := time.Now()
	resp, err := s.cli.KeepAliveOnce(ctx, lease)
	cancel()
	switch {
	case s.ctx.Err() != nil:
		return true
	case err == nil && resp.TTL > 0:
		s.mu.Lock()
		if s.lease == lease {
			s.validUntil = sent.Add(time.Duration(resp.TTL)*time.Second - s.margin())
		}
		s.mu.Unlock()
		return true
	case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
		s.log.WithField("lease", fmt.Sprintf("%x", lease)).Error("cluster: lease expired: this process's registrations and reservations were dropped")
		s.mu.Lock()
		s.lease = 0
		s.mu.Unlock()
		return false
	default:
		s.log.WithError(err).Warn("cluster: lease keepalive failed; retrying")
		return false
	}
}

// stopKeepAlive stops the keepalive, reporting false if it was stopped already.
func (s *Session) stopKeepAlive() bool {
	first := false
	s.stopOnce.Do(func() { s.cancel(); first = true })
	<-s.done
	return first
}

// Close stops the keepalive and revokes the lease, so that what this
// process registered goes at once rather than after the TTL.
func (s *Session) Close() error {
	if !s.stopKeepAlive() {
		return nil
	}
	s.mu.Lock()
	lease := s.lease
	s.mu.Unlock()
	if lease != 0 {
		// Briefly: an etcd that does not answer lets the lease expire
		// after its TTL anyway.
		ctx, cancel := context.WithTimeout(context.Background(), min(s.opts.OpTimeout, time.Second))
		_, _ = s.cli.Revoke(ctx, lease)
		cancel()
	}
	return s.cli.Close()
}
