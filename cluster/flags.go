package cluster

import (
	"flag"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
)

// Flags are the command-line flags by which a daemon joins a cluster:
// --etcd, --etcd-ttl, and --etcd-cert, --etcd-key, --etcd-ca for https.
type Flags struct {
	endpoints, cert, key, ca *string
	ttl                      *time.Duration
}

// AddFlags defines the cluster flags on fs; etcdHelp and ttlHelp say what
// --etcd and --etcd-ttl mean to the daemon at hand.
func AddFlags(fs *flag.FlagSet, etcdHelp, ttlHelp string) *Flags {
	f := &Flags{
		endpoints: fs.String("etcd", "", etcdHelp),
		cert:      fs.String("etcd-cert", "", "with --etcd over https: client certificate (PEM) where etcd requires one; with --etcd-key and --etcd-ca"),
		key:       fs.String("etcd-key", "", "with --etcd-cert: its private key (PEM)"),
		ca:        fs.String("etcd-ca", "", "with --etcd over https: the CA (PEM) that signed etcd's serving certificate"),
		ttl:       fs.Duration("etcd-ttl", DefaultTTL, ttlHelp),
	}
	return f
}

// Enabled says whether --etcd was given.
func (f *Flags) Enabled() bool { return *f.endpoints != "" }

// Connect connects to the etcd the flags name, or returns nil, nil
// without --etcd. Bad flags fail with api.ErrInvalidArgument naming them.
func (f *Flags) Connect(log logrus.FieldLogger) (*Session, error) {
	if !f.Enabled() {
		return nil, nil
	}
	endpoints, err := ParseEndpoints(*f.endpoints)
	if err != nil {
		return nil, fmt.Errorf("--etcd: %w", err)
	}
	tlsCfg, err := TLSFiles(*f.cert, *f.key, *f.ca)
	if err != nil {
		return nil, err
	}
	return Connect(Options{Endpoints: endpoints, TTL: *f.ttl, TLS: tlsCfg, Log: log})
}
