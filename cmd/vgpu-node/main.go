// Command vgpu-node exports this host's accelerators to vgpu mediators.
package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/cluster"
	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/internal/pki"
	"github.com/vgpu/vgpu/internal/version"
	"github.com/vgpu/vgpu/metrics"
)

// options is vgpu-node's command line, one field per flag.
type options struct {
	listen, backend, devices, memory string
	tlsCert, tlsKey, tlsCA           string
	level                            string
	mediatorTimeout                  time.Duration
	retainWeights                    string
	metricsAddr                      string
	reattachGrace                    time.Duration
	etcd                             *cluster.Flags // --etcd, --etcd-*
	advertise                        string
	version                          bool
	kernels                          cudaKernels // --kernels, --kernel-cache, --nvrtc, --cublas

	retain retention // --retain-weights, as check read it
}

// addFlags defines vgpu-node's flags on fs, returning the options they fill
// in when fs is parsed.
func addFlags(fs *flag.FlagSet) *options {
	o := &options{}
	fs.StringVar(&o.listen, "listen", "127.0.0.1:7070", "address to serve mediators on (host:port)")
	fs.StringVar(&o.backend, "backend", "sim", "device backend: sim (memory in host RAM, kernels on CPU) or cuda (NVIDIA GPUs through the CUDA driver and NVML, docs/backends.md)")
	fs.StringVar(&o.devices, "devices", "", "sim: number of devices (default 1); cuda: the GPUs to serve, by index or UUID, comma-separated (default all)")
	fs.StringVar(&o.memory, "memory", "", "memory per device, a multiple of 2MiB (sim: default 16GiB, committed lazily; cuda: default all of each GPU's but 2GiB)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "node certificate (PEM, from vgpuctl certs init); with --tls-key and --tls-ca the node serves mutual TLS only")
	fs.StringVar(&o.tlsKey, "tls-key", "", "node certificate's private key (PEM)")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "cluster CA certificate (PEM): only mediator certificates it signed may connect")
	fs.StringVar(&o.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.DurationVar(&o.mediatorTimeout, "mediator-timeout", accelerator.DefaultMediatorTimeout,
		"drop a mediator's connection, freeing its memory, once its host has been silent this long (no TCP acknowledgement, no keepalive answer; a quiet mediator is not silent); at least 2s")
	fs.StringVar(&o.retainWeights, "retain-weights", "all",
		"keep sealed frames (weights) whose holders freed them, until an allocation needs the memory, so that a tenant loading the same weights again is not sent them: "+
			"all (as much as free memory holds), a size per device (the least recently used beyond it are scrubbed; on sim, retained frames hold host RAM), or off")
	fs.StringVar(&o.metricsAddr, "metrics", "", "serve Prometheus metrics at /metrics on this address, such as 127.0.0.1:9400 (\"\": don't)")
	fs.DurationVar(&o.reattachGrace, "reattach-grace", accelerator.DefaultReattachGrace,
		"how long the device memory of a mediator whose connection dropped (a crash, a restart) is kept for it to reclaim; then it is scrubbed and freed (0: at once)")
	fs.StringVar(&o.kernels.mode, "kernels", "gpu",
		"cuda: where kernels run: gpu (the catalog's CUDA C, compiled at start with NVRTC, which must be installed) or host (the catalog's Go code on CPU cores, over copies of the buffers; no NVRTC needed)")
	fs.StringVar(&o.kernels.cache, "kernel-cache", "",
		"cuda: directory caching the kernels compiled by NVRTC, by source hash and GPU architecture (default $XDG_CACHE_HOME/vgpu/kernels, else ~/.cache/vgpu/kernels, else none; off: compile at every start)")
	fs.StringVar(&o.kernels.nvrtc, "nvrtc", "", "cuda: path of libnvrtc (default: libnvrtc.so.13, .so.12 or .so, on the loader's path, then in /usr/local/cuda/lib64)")
	fs.StringVar(&o.kernels.cublas, "cublas", "", "cuda with --kernels gpu: path of libcublas, which matmul uses when it is found (default: libcublas.so.13, .so.12 or .so, searched as libnvrtc, if found; off: never, matmul runs the catalog's kernel)")
	o.addClusterFlags(fs)
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	return o
}

// check reads the flags that are wrong whatever the host (exit status 2);
// its errors name the flag and wrap api.ErrInvalidArgument.
func (o *options) check() error {
	if err := wire.CheckPeerTimeout(o.mediatorTimeout); err != nil {
		return fmt.Errorf("--mediator-timeout: %w", err)
	}
	retain, err := parseRetain(o.retainWeights)
	if err != nil {
		return fmt.Errorf("--retain-weights: %w", err)
	}
	o.retain = retain
	if o.kernels.mode != "gpu" && o.kernels.mode != "host" {
		return fmt.Errorf("--kernels: %q: want gpu or host: %w", o.kernels.mode, api.ErrInvalidArgument)
	}
	return nil
}

func main() {
	o := addFlags(flag.CommandLine)
	flag.Parse()
	if o.version {
		fmt.Println(version.String("vgpu-node"))
		return
	}
	if err := o.check(); err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-node:", err)
		os.Exit(2)
	}
	if err := run(*o); err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-node:", err)
		os.Exit(1)
	}
}

// nodeTLS returns the node's TLS configuration, or nil when no TLS flag is
// set. Setting some but not all of them is an error: a node never falls
// back to plain TCP by accident.
func nodeTLS(cert, key, ca string) (*tls.Config, error) {
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	if cert == "" || key == "" || ca == "" {
		return nil, fmt.Errorf("TLS: --tls-cert, --tls-key and --tls-ca go together (got cert %q, key %q, CA %q): %w", cert, key, ca, api.ErrInvalidArgument)
	}
	return pki.NodeConfig(cert, key, ca)
}

// warnIfExposed warns, and reports, when the node serves plain TCP on addr
// and addr is not a loopback address: a node trusts the tenant name its
// mediators give, so any host that can reach it can claim any tenant. Not
// refused: tests and demonstrations serve plain TCP, on loopback.
func warnIfExposed(log logrus.FieldLogger, addr net.Addr, tls bool) bool {
	if tls {
		return false
	}
	if ta, ok := addr.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return false
	}
	log.WithField("addr", addr.String()).Warn("serving plain TCP, without TLS, on an address that is not loopback: " +
		"any host that can reach it can connect as a mediator and claim any tenant (the node trusts the tenant a mediator names); " +
		"serve mutual TLS with --tls-cert, --tls-key and --tls-ca (vgpuctl certs init), or listen on loopback")
	return true
}

// graceOption is --reattach-grace as SimOptions.ReattachGrace says it: 0
// there is the default, a negative value none.
func graceOption(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// retention is what --retain-weights asks for.
type retention struct {
	off bool
	max uint64 // bytes per device; 0: no bound but free memory
}

// parseRetain reads --retain-weights: all, off, or a size of at least one
// frame, rounded down to whole frames.
func parseRetain(v string) (retention, error) {
	switch v {
	case "all":
		return retention{}, nil
	case "off":
		return retention{off: true}, nil
	}
	n, err := api.ParseSize(v)
	if err != nil {
		return retention{}, fmt.Errorf("%q: want all, off or a size: %w", v, err)
	}
	if n < accelerator.FrameSize {
		return retention{}, fmt.Errorf("%q is less than one %d-byte frame (off retains nothing): %w", v, accelerator.FrameSize, api.ErrInvalidArgument)
	}
	return retention{max: n / accelerator.FrameSize * accelerator.FrameSize}, nil // whole frames
}

// retainText is r as --retain-weights says it, for the log.
func retainText(r retention) string {
	switch {
	case r.off:
		return "off"
	case r.max == 0:
		return "all"
	}
	return api.FormatSize(r.max) + " per device"
}

func run(o options) error {
	signals := daemon.CatchSignals() // before the port is bound
	log, err := daemon.Logger("vgpu-node", o.level)
	if err != nil {
		return err
	}
	if o.backend != "sim" && o.backend != "cuda" {
		return fmt.Errorf("--backend %q: want sim or cuda: %w", o.backend, api.ErrInvalidArgument)
	}
	memory := o.memory
	if memory == "" && o.backend == "sim" {
		memory = "16GiB"
	}
	var size uint64 // 0: cuda's default
	if memory != "" {
		if size, err = api.ParseSize(memory); err != nil {
			return fmt.Errorf("--memory: %w", err)
		}
	}
	tlsCfg, err := nodeTLS(o.tlsCert, o.tlsKey, o.tlsCA)
	if err != nil {
		return err
	}
	opts := accelerator.SimOptions{TLS: tlsCfg, MediatorTimeout: o.mediatorTimeout, NoRetention: o.retain.off, RetainMax: o.retain.max,
		ReattachGrace: graceOption(o.reattachGrace)}
	var requests *metrics.Requests // latency and errors of the mediators' requests
	if o.metricsAddr != "" {
		requests = metrics.NewRequests(false)
		opts.Requests = requests
	}
	node, addr, err := o.startNode(size, opts, log)
	if err != nil {
		return err
	}
	if o.metricsAddr != "" {
		dedup := func() metrics.Dedup {
			c := node.ContentStats()
			return metrics.Dedup{Lookups: c.Lookups, Hits: c.Hits, Saved: c.Saved, Sealed: c.Sealed}
		}
		srv, err := metrics.Start(o.metricsAddr, log.WithField("component", "metrics"), metrics.NewNodeCollector(addr.String(), node.Status, dedup), requests)
		if err != nil {
			return errors.Join(err, node.Close())
		}
		defer srv.Close()
		log.WithField("addr", srv.Addr().String()).Info("serving metrics")
	}
	warnIfExposed(log, addr, tlsCfg != nil)
	leave, err := o.joinCluster(node, addr, tlsCfg, log)
	if err != nil {
		node.Close()
		return err
	}
	defer leave()
	log.WithFields(map[string]any{"addr": addr.String(), "devices": o.devices, "memory": api.FormatSize(size), "tls": tlsCfg != nil,
		"mediator_timeout": o.mediatorTimeout.String(), "retain_weights": retainText(o.retain), "reattach_grace": max(graceOption(o.reattachGrace), 0).String()}).Info("serving")
	signals.RunUntilStopped(log, func() error { return nil }) // a node has nothing to reload
	return node.Close()
}
