// Command vgpu-mediator is the per-host vGPU hypervisor: it serves tenants
// on a Unix socket and runs their work on remote vgpu-node accelerators.
// With no --node it embeds a simulated node, a complete one-machine system.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/cluster"
	"github.com/vgpu/vgpu/integration"
	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/internal/pki"
	"github.com/vgpu/vgpu/internal/upgrade"
	"github.com/vgpu/vgpu/internal/version"
	"github.com/vgpu/vgpu/isolation"
	"github.com/vgpu/vgpu/mediator"
	"github.com/vgpu/vgpu/metrics"
	"github.com/vgpu/vgpu/statuspage"
)

type nodeList []string

func (n *nodeList) String() string     { return strings.Join(*n, ",") }
func (n *nodeList) Set(v string) error { *n = append(*n, v); return nil }

// options is vgpu-mediator's command line, one field per flag.
type options struct {
	socket, socketMode, socketGroup string
	nodes                           nodeList
	embeddedMemory                  string
	embeddedDevices                 int
	tenantMemory                    string
	quota                           string
	containerDir                    string
	containerd                      string
	oversubscribe                   float64
	hostMemory                      string
	stateDir                        string
	tlsCert, tlsKey, tlsCA          string
	level                           string
	cacheMemory                     string
	nodeTimeout, dropGrace          time.Duration
	dedup                           bool
	weightSums, versionCopies       bool
	tenantBandwidth                 uint64
	page                            statuspage.Config // --http, --http-remote
	metricsAddr                     string
	etcd                            *cluster.Flags // --etcd, --etcd-*
	clusterID                       string
	version                         bool
}

// addFlags defines vgpu-mediator's flags on fs, returning the options they
// fill in when fs is parsed.
func addFlags(fs *flag.FlagSet) *options {
	o := &options{}
	fs.StringVar(&o.socket, "socket", client.DefaultSocket, "Unix socket to serve tenants and operators on")
	fs.StringVar(&o.socketMode, "socket-mode", "0666", "permissions of --socket, in octal: who may connect at all (who may act as which tenant is the quota file's [host] table)")
	fs.StringVar(&o.socketGroup, "socket-group", "", "group of --socket, a name or a gid, for a --socket-mode such as 0660 (\"\": the mediator's)")
	fs.Var(&o.nodes, "node", "vgpu-node address (host:port); repeat for several; none: run an embedded sim node")
	fs.StringVar(&o.embeddedMemory, "embedded-memory", "8GiB", "memory per device of the embedded sim node")
	fs.IntVar(&o.embeddedDevices, "embedded-devices", 1, "devices of the embedded sim node")
	fs.StringVar(&o.tenantMemory, "tenant-memory", "0", "cap on each host-socket session's device memory (0: none)")
	fs.StringVar(&o.quota, "quota", "/etc/vgpu/tenants.toml", "tenant quota file (missing: one tenant \"default\" without caps, and any local user may act as any tenant on --socket); reloaded on SIGHUP")
	fs.StringVar(&o.containerDir, "container-dir", mediator.DefaultContainerDir, "directory of the containers' socket directories")
	fs.StringVar(&o.containerd, "containerd", "/run/containerd/containerd.sock", "containerd socket to watch for vanished containers (\"\": don't)")
	fs.Float64Var(&o.oversubscribe, "oversubscribe", 1, "host-socket sessions may allocate this many times --tenant-memory, evicting cold memory to the host; 1 to 16, as the quota file's oversubscribe (1: off)")
	fs.StringVar(&o.hostMemory, "host-memory", "2GiB", "host RAM for evicted device memory, divided among oversubscribing containers")
	fs.StringVar(&o.stateDir, "state-dir", defaultStateDir(),
		"where evicted memory spills past --host-memory and container registrations are kept across restarts, one mediator's alone (\"\": neither; a restarted mediator forgets every container)")
	fs.StringVar(&o.tlsCert, "node-tls-cert", "", "mediator certificate (PEM, from vgpuctl certs init) for mutual TLS to the --node nodes; with --node-tls-key and --node-tls-ca")
	fs.StringVar(&o.tlsKey, "node-tls-key", "", "mediator certificate's private key (PEM)")
	fs.StringVar(&o.tlsCA, "node-tls-ca", "", "cluster CA certificate (PEM): nodes must present a node certificate it signed, for the host dialled")
	fs.StringVar(&o.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&o.cacheMemory, "cache-memory", "256MiB", "host memory for copies of shared buffers' pages, split among the nodes")
	fs.DurationVar(&o.nodeTimeout, "node-timeout", mediator.DefaultNodeTimeout,
		"fail the calls on a node, as unavailable, once its host has been silent this long (no TCP acknowledgement, no keepalive answer; a busy node is not silent); at least 2s")
	fs.DurationVar(&o.dropGrace, "drop-grace", mediator.DefaultDropGrace,
		"how long a node keeps the device memory of a session this mediator does not journal after its connection drops, for the session to reclaim it (shorter than the node's --reattach-grace, which a journaled session gets: nothing reclaims it once this mediator dies); at least 1ms")
	fs.BoolVar(&o.dedup, "dedup", true, "send a sealed weight's 2 MiB pieces a node already holds as references, not bytes (a tenant can then tell that contents it has exist on the node)")
	fs.BoolVar(&o.versionCopies, "version-copies", false, "keep a host copy of each exported versioned buffer's latest published version (read back at the export and at each publish), so that after its node restarts the version is restored there and importers read on (costs one transfer of the buffer per publish, and the copy's host memory)")
	fs.BoolVar(&o.weightSums, "weight-sums", false, "read each sealed weight back once, at its seal, to learn its SHA-256, so that after its node restarts it is restored from another node's sealed copy (costs one transfer of the weight; needs --dedup)")
	fs.Func("tenant-bandwidth", "bytes per second each tenant not in the quota file may copy, e.g. 1GiB (0: no cap)", func(v string) (err error) { o.tenantBandwidth, err = api.ParseSize(v); return err })
	fs.StringVar(&o.page.Addr, "http", "", "serve the operator's status page (nodes, devices, tenants, sessions, charts; /status.json) on this address, such as 127.0.0.1:8080 (\"\": don't)")
	fs.BoolVar(&o.page.AllowRemote, "http-remote", false, "let --http listen beyond loopback: the page has no authentication and shows every tenant and container")
	fs.StringVar(&o.metricsAddr, "metrics", "", "serve Prometheus metrics at /metrics on this address, such as 127.0.0.1:9400 (\"\": don't)")
	o.addClusterFlags(fs)
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	return o
}

// config reads the flags that are wrong whatever the host (exit status 2)
// into the mediator's configuration and its host socket; its errors name
// the flag and its value and wrap api.ErrInvalidArgument.
func (o *options) config() (mediator.Config, hostSocket, error) {
	cfg := mediator.Config{Nodes: o.nodes, Quota: o.quota, ContainerDir: o.containerDir, Oversubscribe: o.oversubscribe, StateDir: o.stateDir,
		TenantBandwidth: o.tenantBandwidth, NoDedup: !o.dedup, WeightSums: o.weightSums, VersionCopies: o.versionCopies, NodeTimeout: o.nodeTimeout,
		DropGrace: o.dropGrace}
	sock, err := hostSocketFlags(o.socket, o.socketMode, o.socketGroup)
	if err != nil {
		return cfg, sock, err
	}
	if err := wire.CheckPeerTimeout(o.nodeTimeout); err != nil {
		return cfg, sock, fmt.Errorf("--node-timeout: %w", err)
	}
	if o.dropGrace < time.Millisecond {
		return cfg, sock, fmt.Errorf("--drop-grace %v: want at least 1ms: %w", o.dropGrace, api.ErrInvalidArgument)
	}
	if cfg.TenantMemory, err = hostSessionMemory(o.tenantMemory, o.oversubscribe); err != nil {
		return cfg, sock, err
	}
	if cfg.NodeTLS, err = nodeTLS(o.tlsCert, o.tlsKey, o.tlsCA, len(o.nodes) > 0 || o.etcd.Enabled()); err != nil {
		return cfg, sock, err
	}
	if cfg.HostMemory, err = api.ParseSize(o.hostMemory); err != nil {
		return cfg, sock, fmt.Errorf("--host-memory: %w", err)
	}
	n, err := api.ParseSize(o.cacheMemory)
	if err == nil && n == 0 {
		err = api.ErrInvalidArgument
	}
	if err != nil {
		return cfg, sock, fmt.Errorf("--cache-memory %q: want a positive size: %w", o.cacheMemory, err)
	}
	cfg.CacheMemory = int64(n)
	return cfg, sock, nil
}

func main() {
	o := addFlags(flag.CommandLine)
	flag.Parse()
	if o.version {
		fmt.Println(version.String("vgpu-mediator"))
		return
	}
	pred, err := upgrade.Inherited() // started by a mediator that upgrades
	if err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-mediator:", err)
		os.Exit(2)
	}
	cfg, sock, err := o.config()
	if err != nil {
		if pred != nil {
			pred.Done(err)
		}
		fmt.Fprintln(os.Stderr, "vgpu-mediator:", err)
		os.Exit(2)
	}
	if err := run(o, cfg, sock, pred); err != nil {
		if pred != nil {
			pred.Done(err)
		}
		fmt.Fprintln(os.Stderr, "vgpu-mediator:", err)
		os.Exit(1)
	}
}

// hostSocket is where and how the mediator listens for host programs and
// operators.
type hostSocket struct {
	path string
	mode os.FileMode
	gid  int // -1: the mediator's group
}

// hostSocketFlags reads --socket-mode (octal permission bits, 0 to 0777)
// and --socket-group (a group name, or a gid; "" for the mediator's own).
func hostSocketFlags(path, mode, group string) (hostSocket, error) {
	s := hostSocket{path: path, gid: -1}
	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || m > 0o777 {
		return s, fmt.Errorf("--socket-mode %q: want permission bits in octal, 0 to 0777, such as 0660: %w", mode, api.ErrInvalidArgument)
	}
	s.mode = os.FileMode(m)
	if group == "" {
		return s, nil
	}
	if g, err := strconv.ParseUint(group, 10, 32); err == nil && g < math.MaxUint32 {
		s.gid = int(g)
		return s, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return s, fmt.Errorf("--socket-group %q: want a group name or a gid: %v: %w", group, err, api.ErrInvalidArgument)
	}
	s.gid, err = strconv.Atoi(g.Gid)
	if err != nil {
		return s, fmt.Errorf("--socket-group %q: gid %q: %v: %w", group, g.Gid, err, api.ErrInvalidArgument)
	}
	return s, nil
}

// hostSessionMemory reads --tenant-memory and checks --oversubscribe
// against the quota file's range for a tenant's oversubscribe, and what a
// host-socket session may then allocate, the one times the other, against
// the file's bound for a tenant's: a factor of NaN or infinity would lift
// the cap, and one too large would overflow the mediator's sizes.
func hostSessionMemory(tenantMem string, factor float64) (uint64, error) {
	n, err := api.ParseSize(tenantMem)
	if err != nil {
		return 0, fmt.Errorf("--tenant-memory: %w", err)
	}
	if err := isolation.CheckOversubscribe(factor); err != nil {
		return 0, fmt.Errorf("--oversubscribe: %w", err)
	}
	if err := isolation.CheckVirtualMemory(n, factor); err != nil {
		return 0, fmt.Errorf("--tenant-memory × --oversubscribe: %w", err)
	}
	return n, nil
}

// nodeTLS returns the client configuration towards nodes, or nil when no
// TLS flag is set. Some but not all of them, or TLS for the embedded node
// (which is plain loopback), is an error: the mediator never falls back to
// plain TCP by accident.
func nodeTLS(cert, key, ca string, remote bool) (*tls.Config, error) {
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	if cert == "" || key == "" || ca == "" {
		return nil, fmt.Errorf("node TLS: --node-tls-cert, --node-tls-key and --node-tls-ca go together (got cert %q, key %q, CA %q): %w", cert, key, ca, api.ErrInvalidArgument)
	}
	if !remote {
		return nil, fmt.Errorf("node TLS: --node-tls-* need --node; the embedded node is plain loopback: %w", api.ErrInvalidArgument)
	}
	return pki.MediatorConfig(cert, key, ca)
}

// defaultStateDir is /var/lib/vgpu for root, a directory of the user's
// in the temporary directory for anyone else.
func defaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/vgpu"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("vgpu-%d", os.Geteuid()))
}

// run serves until stopped. With pred, this process takes over from the
// mediator that started it (a live upgrade): it gets the sockets from it
// once it has handed over, and tells it when it serves.
func run(o *options, cfg mediator.Config, sock hostSocket, pred *upgrade.Predecessor) error {
	signals := daemon.CatchSignals() // before the socket is bound
	log, err := daemon.Logger("vgpu-mediator", o.level)
	if err != nil {
		return err
	}
	cfg.Log = log
	var host *net.UnixListener // the host socket, when passed on by pred
	if pred != nil {
		if host, err = takeOver(pred, &cfg, sock.path); err != nil {
			return fmt.Errorf("taking over: %w", err)
		}
		log.WithField("sockets", len(cfg.Inherited)+1).Info("upgrade: took over the previous mediator's sockets; restoring")
	}
	var page *statuspage.Server
	if o.page.Addr != "" {
		// Before anything starts, so that a taken port stops the mediator at once.
		if page, err = listenStatusPage(o.page, sock.path, log); err != nil {
			return err
		}
		defer page.Close()
	}
	var requests *metrics.Requests // latency and errors of tenants' and operators' requests
	var metricsSrv io.Closer
	if o.metricsAddr != "" {
		requests = metrics.NewRequests(true)
		cfg.Requests = requests
	}
	leave, err := o.joinCluster(&cfg, log)
	if err != nil {
		return err
	}
	defer leave()
	if len(cfg.Nodes) == 0 && cfg.Cluster == nil {
		size, err := api.ParseSize(o.embeddedMemory)
		if err != nil {
			return fmt.Errorf("--embedded-memory: %w", err)
		}
		// StartSim checks the devices (1 to 64) and their memory.
		node, addr, err := accelerator.StartSim("127.0.0.1:0", o.embeddedDevices, size, log.WithField("component", "embedded-node"))
		if err != nil {
			return fmt.Errorf("embedded node (--embedded-devices %d, --embedded-memory %s): %w", o.embeddedDevices, o.embeddedMemory, err)
		}
		defer node.Close()
		cfg.Nodes = []string{addr.String()}
	}
	m, err := mediator.New(cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	if o.metricsAddr != "" {
		srv, err := metrics.Start(o.metricsAddr, log.WithField("component", "metrics"), metrics.NewMediatorCollector(m), requests)
		if err != nil {
			return err
		}
		defer srv.Close()
		metricsSrv = srv
		log.WithField("addr", srv.Addr().String()).Info("serving metrics")
	}
	if host == nil {
		l, err := daemon.ListenUnix(sock.path, sock.mode, sock.gid)
		if err != nil {
			return fmt.Errorf("--socket: %w", err)
		}
		host = l.(*net.UnixListener)
	}
	go func() {
		if err := m.Serve(host); err != nil {
			log.WithError(err).Error("stopped serving")
		}
	}()
	if page != nil {
		page.Serve()
	}
	if pred != nil {
		pred.Done(nil)
	}
	sdNotify(log, "READY=1")
	u := &upgrader{o: o, m: m, host: host, log: log, leaveCluster: leave, stopSelf: signals.Stop, stopServices: func() {
		if page != nil {
			page.Close()
		}
		if metricsSrv != nil {
			metricsSrv.Close()
		}
	}}
	if ctl, err := upgrade.ListenControl(sock.path); err != nil {
		log.WithError(err).Warn("no control socket: vgpuctl upgrade cannot reach this mediator")
	} else {
		defer ctl.Close()
		u.ctl, u.served = ctl, make(chan struct{})
		go u.serveUpgrades()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.containerd != "" {
		go integration.WatchContainerd(ctx, o.containerd, log.WithField("component", "containerd-watch"), func(g integration.Gone) {
			if m.ContainerGone(g.Namespace, g.ID, g.Pid) == nil {
				log.WithFields(map[string]any{"container": g.ID, "namespace": g.Namespace}).Info("reclaimed a container containerd reports gone")
			}
		})
	}
	log.WithFields(map[string]any{"socket": sock.path, "nodes": cfg.Nodes, "node_tls": cfg.NodeTLS != nil, "node_timeout": cfg.NodeTimeout.String()}).Info("serving")
	u.handOverOnSIGUSR2()
	u.stop(signals.RunUntilStopped(log, u.reload))
	if u.orphaned.Load() {
		// Exit 1, so that a service manager restarts the mediator, which
		// restores from --state-dir.
		return fmt.Errorf("upgrade: handed over, and neither the new binary nor this one could take over: nothing serves; the state is kept in %s", o.stateDir)
	}
	if page != nil {
		page.Close() // before the mediator: the page asks it until then
	}
	return nil
}

// listenStatusPage listens for --http; the page's snapshots come from the
// mediator's own operator socket, what vgpuctl status reads.
func listenStatusPage(cfg statuspage.Config, socket string, log *logrus.Entry) (*statuspage.Server, error) {
	// Twice the longest a status waits for a node (5s): a wedged mediator
	// leaves the page's "sampled at" time behind, not a hung sampler. Its
	// connection ends with the mediator.
	cfg.Source = statuspage.NewOperatorSource(socket, 10*time.Second)
	cfg.Log = log.WithField("component", "statuspage")
	page, err := statuspage.Listen(cfg)
	if errors.Is(err, api.ErrPermissionDenied) {
		return nil, fmt.Errorf("--http %s (--http-remote allows it): %w", cfg.Addr, err)
	} else if err != nil {
		return nil, fmt.Errorf("--http %s: %w", cfg.Addr, err)
	}
	log.WithField("address", page.Addr().String()).Info("serving the status page")
	return page, nil
}
