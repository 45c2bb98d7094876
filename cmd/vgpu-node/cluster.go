package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/cluster"
	"github.com/vgpu/vgpu/internal/version"
)

// addClusterFlags defines cluster mode's flags on fs, kept here with the
// code they drive.
func (o *options) addClusterFlags(fs *flag.FlagSet) {
	o.etcd = cluster.AddFlags(fs,
		"etcd endpoints, comma-separated (host:port or URLs): register this node and its devices there, under a lease kept alive, for mediators started with --etcd (\"\": no cluster mode)",
		"with --etcd: how long after this node dies, or loses etcd, mediators stop placing on it")
	fs.StringVar(&o.advertise, "advertise", "", "with --etcd: the host:port mediators dial (\"\": the --listen address, which must then not be 0.0.0.0 or [::])")
}

// refreshInterval is how often a registered node's free memory and
// connections are written again, when they changed.
const refreshInterval = 2 * time.Second

// joinCluster registers node, serving on addr, in etcd when --etcd is
// given, and keeps its entry current until the returned function is
// called. Without --etcd it does nothing.
func (o *options) joinCluster(node *accelerator.Node, addr net.Addr, tlsCfg *tls.Config, log logrus.FieldLogger) (leave func(), err error) {
	if !o.etcd.Enabled() {
		return func() {}, nil
	}
	at, err := advertised(o.advertise, addr)
	if err != nil {
		return nil, err
	}
	s, err := o.etcd.Connect(log)
	if err != nil {
		return nil, err
	}
	stop, err := s.KeepNode(func() cluster.NodeInfo { return nodeInfo(node, at, tlsCfg) }, refreshInterval)
	if err != nil {
		s.Close()
		return nil, err
	}
	log.WithFields(map[string]any{"etcd": s.Options().Endpoints, "advertise": at, "ttl": s.Options().TTL.String()}).Info("registered in the cluster")
	return func() {
		stop()
		s.Close() // revokes the lease: mediators see the node go at once
	}, nil
}

// advertised is the address mediators dial: flag, else the bound address,
// which must then name a host.
func advertised(flagValue string, bound net.Addr) (string, error) {
	if flagValue != "" {
		if _, _, err := net.SplitHostPort(flagValue); err != nil {
			return "", fmt.Errorf("--advertise %q: want host:port: %v: %w", flagValue, err, api.ErrInvalidArgument)
		}
		return flagValue, nil
	}
	if ta, ok := bound.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		return "", fmt.Errorf("--etcd: the node listens on %s, which mediators cannot dial: give --advertise host:port: %w", bound, api.ErrInvalidArgument)
	}
	return bound.String(), nil
}

// nodeInfo is node's registry entry now.
func nodeInfo(node *accelerator.Node, addr string, tlsCfg *tls.Config) cluster.NodeInfo {
	st := node.Status()
	info := cluster.NodeInfo{Addr: addr, Backend: st.Backend, Connections: st.Connections, Version: version.String("vgpu-node")}
	if tlsCfg != nil && len(tlsCfg.Certificates) > 0 && tlsCfg.Certificates[0].Leaf != nil {
		info.TLS = tlsCfg.Certificates[0].Leaf.Subject.String()
	}
	for _, d := range st.Devices {
		info.Devices = append(info.Devices, cluster.DeviceInfo{Index: d.Index, Name: d.Name, Memory: d.Memory, Free: uint64(d.Free) * accelerator.FrameSize})
	}
	return info
}
