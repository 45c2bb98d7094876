package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/cluster"
	"github.com/vgpu/vgpu/mediator"
)

// addClusterFlags defines cluster mode's flags on fs, kept here with the
// code they drive.
func (o *options) addClusterFlags(fs *flag.FlagSet) {
	o.etcd = cluster.AddFlags(fs,
		"etcd endpoints, comma-separated (host:port or URLs): cluster mode — nodes come from etcd's registry (no --node), tenants' caps hold across all mediators, the quota file stored by vgpuctl tenants apply replaces --quota (\"\": no cluster mode)",
		"with --etcd: how long after this mediator dies, or loses etcd, its cluster-wide reservations return")
	fs.StringVar(&o.clusterID, "cluster-id", "", "with --etcd: this mediator's name in the cluster, unique among live mediators; a mediator restarted with it takes back its reservations (\"\": the host name)")
}

// joinCluster fills in cfg.Cluster when --etcd is given, returning what
// closes the etcd session (revoking its lease) after the mediator closed.
func (o *options) joinCluster(cfg *mediator.Config, log logrus.FieldLogger) (leave func(), err error) {
	if !o.etcd.Enabled() {
		return func() {}, nil
	}
	id := o.clusterID
	if id == "" {
		if id, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("--cluster-id: none given and no host name: %v: %w", err, api.ErrInvalidArgument)
		}
	}
	if strings.Contains(id, "/") {
		return nil, fmt.Errorf("--cluster-id %q: want a name without '/': %w", id, api.ErrInvalidArgument)
	}
	s, err := o.etcd.Connect(log.WithField("component", "cluster"))
	if err != nil {
		return nil, err
	}
	cfg.Cluster = &mediator.ClusterConfig{Session: s, ID: id}
	log.WithFields(map[string]any{"etcd": s.Options().Endpoints, "id": id, "ttl": s.Options().TTL.String()}).Info("cluster mode")
	return func() { s.Close() }, nil
}
