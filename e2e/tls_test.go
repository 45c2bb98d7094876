package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/internal/pki"
)

// certsInit runs vgpuctl certs init into a new directory and returns its
// files.
func certsInit(t *testing.T) pki.Files {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	out, err := run(t, "vgpuctl", "certs", "init", "--dir", dir, "--mediator", "e2e")
	if err != nil {
		t.Fatalf("vgpuctl certs init: %v\n%s", err, out)
	}
	f := pki.Paths(dir)
	for _, want := range []string{"--tls-cert " + f.NodeCert, "--tls-key " + f.NodeKey, "--tls-ca " + f.CA,
		"--node-tls-cert " + f.MediatorCert, "--node-tls-key " + f.MediatorKey, "--node-tls-ca " + f.CA} {
		if !strings.Contains(out, want) {
			t.Errorf("vgpuctl certs init does not say %q:\n%s", want, out)
		}
	}
	if st, err := os.Stat(f.MediatorKey); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mediator key: %v, mode %v", err, st.Mode().Perm())
	}
	out, err = run(t, "vgpuctl", "certs", "init", "--dir", dir)
	if err == nil || !strings.Contains(out, "--force") {
		t.Fatalf("second vgpuctl certs init: err %v, want a refusal naming --force:\n%s", err, out)
	}
	return f
}

func nodeTLSFlags(f pki.Files) []string {
	return []string{"--tls-cert", f.NodeCert, "--tls-key", f.NodeKey, "--tls-ca", f.CA}
}

func mediatorTLSFlags(f pki.Files) []string {
	return []string{"--node-tls-cert", f.MediatorCert, "--node-tls-key", f.MediatorKey, "--node-tls-ca", f.CA}
}

// A tenant works through a mediator that reaches its node over mutual TLS.
func TestTLSNodeLink(t *testing.T) {
	f := certsInit(t)
	socket := startSystem(t, append([]string{"--devices", "1", "--memory", "256MiB"}, nodeTLSFlags(f)...), mediatorTLSFlags(f))
	out, err := run(t, "tenant", "--socket", socket, "--tenant", "secure")
	if err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("tenant over TLS: %v\n%s", err, out)
	}
	// Bulk copies both ways over TLS come back byte for byte (bench checks),
	// and bench reports what TLS costs against plain TCP.
	out, err = run(t, "vgpuctl", "--socket", socket, "bench", "--json", "--size", "8MiB", "--rounds", "1", "--window", "20ms", "--ops", "20", "--tenants", "1", "--dlrm-steps", "2")
	if err != nil {
		t.Fatalf("vgpuctl bench over TLS: %v\n%s", err, out)
	}
	r := benchJSON(t, out)
	for _, k := range []string{"h2d_ratio", "d2h_ratio", "node_plain_mb_per_s", "node_tls_mb_per_s", "node_tls_ratio"} {
		if !(r[k] > 0) {
			t.Errorf("%s = %v, want a positive measurement", k, r[k])
		}
	}
	waitFor(t, "all memory released", func() bool { return idle(status(t, socket)) })
	st := status(t, socket)
	if len(st.Nodes) != 1 || st.Nodes[0].Error != "" || len(st.Nodes[0].Devices) != 1 {
		t.Fatalf("status over TLS: %+v", st.Nodes)
	}
}

// startTLSNode starts a vgpu-node serving TLS and returns its address.
func startTLSNode(t *testing.T, f pki.Files) string {
	t.Helper()
	addr := freePort(t)
	startProc(t, "vgpu-node", append([]string{"--listen", addr, "--log-level", "warn", "--memory", "64MiB"}, nodeTLSFlags(f)...)...)
	waitFor(t, "vgpu-node to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// A TLS node's mediators must hold a mediator certificate of the cluster CA;
// a mediator refuses to start without one.
func TestTLSMediatorNeedsItsCertificate(t *testing.T) {
	f := certsInit(t)
	addr := startTLSNode(t, f)
	mediator := func(flags ...string) (string, error) {
		dir := t.TempDir()
		return run(t, "vgpu-mediator", append([]string{"--socket", filepath.Join(dir, "m.sock"), "--node", addr,
			"--state-dir", "", "--quota", "", "--containerd", "", "--log-level", "warn"}, flags...)...)
	}
	for _, tc := range []struct {
		name  string
		flags []string
		want  []string
	}{
		{"plain TCP", nil, []string{"unavailable", "requires TLS", "--node-tls-cert"}},
		{"CA but no client certificate", []string{"--node-tls-ca", f.CA}, []string{"TLS", "--node-tls-cert"}},
		{"node certificate as client certificate", []string{"--node-tls-cert", f.NodeCert, "--node-tls-key", f.NodeKey, "--node-tls-ca", f.CA},
			[]string{"TLS", f.NodeCert, "not a mediator certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := mediator(tc.flags...)
			if err == nil {
				t.Fatalf("mediator started:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("mediator error does not name %q:\n%s", w, out)
				}
			}
		})
	}
	// The embedded node is plain loopback: TLS flags without --node are a mistake.
	out, err := run(t, "vgpu-mediator", "--socket", filepath.Join(t.TempDir(), "m.sock"), "--state-dir", "",
		"--quota", "", "--containerd", "", "--node-tls-cert", f.MediatorCert, "--node-tls-key", f.MediatorKey, "--node-tls-ca", f.CA)
	if err == nil || !strings.Contains(out, "TLS") || !strings.Contains(out, "embedded") {
		t.Fatalf("mediator with TLS flags and no --node: err %v\n%s", err, out)
	}
}

// hello says hello to a node over nc as a mediator and returns the error.
func hello(nc net.Conn) error {
	rpc := wire.NewRPC(wire.NewConn(nc), "node")
	defer rpc.Close()
	call := rpc.Go(api.OpHello, nil, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator, Tenant: "intruder"}))
	select {
	case <-call.Done():
		return call.Err
	case <-time.After(15 * time.Second):
		return fmt.Errorf("no answer to hello")
	}
}

// A TLS node answers only mediators with a mediator certificate of its CA:
// plain TCP, TLS without a client certificate, with the node's own
// certificate, or with a mediator certificate of another CA get nowhere.
func TestTLSNodeRejectsOtherClients(t *testing.T) {
	f := certsInit(t)
	addr := startTLSNode(t, f)
	good, err := pki.MediatorConfig(f.MediatorCert, f.MediatorKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, err := tls.LoadX509KeyPair(f.NodeCert, f.NodeKey)
	if err != nil {
		t.Fatal(err)
	}
	_, foreign, err := pki.Ephemeral()
	if err != nil {
		t.Fatal(err)
	}
	present := func(c *tls.Certificate) *tls.Config {
		cfg := good.Clone()
		cfg.Certificates = nil
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c, nil }
		return cfg
	}
	foreignCfg := present(&foreign.Certificates[0])
	foreignCfg.InsecureSkipVerify = true // trust the node, so only the node's check is tested
	foreignCfg.VerifyConnection = nil
	dialTLS := func(cfg *tls.Config) (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	}
	for _, tc := range []struct {
		name string
		dial func() (net.Conn, error)
		ok   bool
		want string // in the refusal
	}{
		{"mediator certificate", func() (net.Conn, error) { return dialTLS(good) }, true, ""},
		{"plain TCP", func() (net.Conn, error) { return net.Dial("tcp", addr) }, false, "unavailable"},
		{"TLS without a client certificate", func() (net.Conn, error) { return dialTLS(present(&tls.Certificate{})) }, false, "tls: certificate required"},
		{"node certificate as client", func() (net.Conn, error) { return dialTLS(present(&nodeCert)) }, false, "tls: bad certificate"},
		{"mediator certificate of another CA", func() (net.Conn, error) { return dialTLS(foreignCfg) }, false, "tls: unknown certificate authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := tc.dial()
			if err == nil {
				err = hello(nc)
			}
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("hello: %v, want a refusal with %q", err, tc.want)
			}
		})
	}
}
