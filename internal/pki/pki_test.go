package pki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/pki/pkitest"
)

func initDir(t *testing.T, opt InitOptions) Files {
	t.Helper()
	if opt.Dir == "" {
		opt.Dir = filepath.Join(t.TempDir(), "certs")
	}
	f, err := Init(opt)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestInitWritesAVerifyingSet(t *testing.T) {
	f := initDir(t, InitOptions{Mediator: "host-a"})
	for path, mode := range map[string]os.FileMode{
		f.CA: 0o644, f.CAKey: 0o600, f.NodeCert: 0o644, f.NodeKey: 0o600, f.MediatorCert: 0o644, f.MediatorKey: 0o600,
	} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), mode)
		}
	}
	st, err := os.Stat(filepath.Dir(f.CA))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("directory: %v, mode %v, want 0700", err, st.Mode().Perm())
	}
	srv, err := NodeConfig(f.NodeCert, f.NodeKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := MediatorConfig(f.MediatorCert, f.MediatorKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	if cli.MinVersion != tls.VersionTLS13 || srv.MinVersion != tls.VersionTLS13 || srv.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("configs: min versions %x/%x, client auth %v", cli.MinVersion, srv.MinVersion, srv.ClientAuth)
	}
	if se, ce := pkitest.Handshake(t, srv, cli, "127.0.0.1"); se != nil || ce != nil {
		t.Fatalf("mediator to node: server %v, client %v", se, ce)
	}
	if se, ce := pkitest.Handshake(t, srv, cli, "localhost"); se != nil || ce != nil {
		t.Fatalf("mediator to node by name: server %v, client %v", se, ce)
	}
	// The node certificate names the default hosts; the mediator's its name.
	node, _ := tls.LoadX509KeyPair(f.NodeCert, f.NodeKey)
	leaf, _ := x509.ParseCertificate(node.Certificate[0])
	for _, h := range []string{"127.0.0.1", "::1", "localhost"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("node certificate: %v", err)
		}
	}
	med, _ := tls.LoadX509KeyPair(f.MediatorCert, f.MediatorKey)
	mleaf, _ := x509.ParseCertificate(med.Certificate[0])
	if name, ok := MediatorName(mleaf); !ok || name != "host-a" || mleaf.Subject.CommonName != "mediator:host-a" {
		t.Errorf("mediator certificate: name %q %v, CN %q", name, ok, mleaf.Subject.CommonName)
	}
	ca, err := LoadCA(f.CA, f.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	if d := ca.Cert.NotAfter.Sub(ca.Cert.NotBefore); d < CAValidity {
		t.Errorf("CA valid for %v, want at least %v", d, CAValidity)
	}
}

func TestInitDoesNotOverwrite(t *testing.T) {
	f := initDir(t, InitOptions{})
	before := map[string][]byte{}
	for _, p := range []string{f.CA, f.CAKey, f.NodeCert, f.NodeKey, f.MediatorCert, f.MediatorKey} {
		before[p], _ = os.ReadFile(p)
	}
	_, err := Init(InitOptions{Dir: filepath.Dir(f.CA)})
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), f.CA) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("second init: %v, want ErrExists naming %s and --force", err, f.CA)
	}
	for p, b := range before {
		if now, _ := os.ReadFile(p); string(now) != string(b) {
			t.Errorf("%s changed without --force", p)
		}
	}
	// One file in the way is enough to write nothing.
	dir := filepath.Join(t.TempDir(), "c")
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, MediatorKeyFile), []byte("mine"), 0o600)
	if _, err := Init(InitOptions{Dir: dir}); !errors.Is(err, ErrExists) {
		t.Fatalf("init over a mediator key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, CAFile)); err == nil {
		t.Fatal("init wrote a CA although it refused")
	}
	// Force replaces them all, keeping the modes.
	os.Chmod(f.CAKey, 0o644)
	if _, err := Init(InitOptions{Dir: filepath.Dir(f.CA), Force: true}); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.ReadFile(f.CAKey); string(now) == string(before[f.CAKey]) {
		t.Error("--force kept the old CA key")
	}
	if st, _ := os.Stat(f.CAKey); st.Mode().Perm() != 0o600 {
		t.Errorf("forced CA key mode %v", st.Mode().Perm())
	}
	if err := WriteFile(f.CA, []byte("x"), 0o644, false); !errors.Is(err, ErrExists) {
		t.Errorf("WriteFile over %s: %v", f.CA, err)
	}
}

func TestNodeRefusesAllButMediators(t *testing.T) {
	f := initDir(t, InitOptions{})
	srv, err := NodeConfig(f.NodeCert, f.NodeKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := certPool(f.CA)
	ca, err := LoadCA(f.CA, f.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, _ := tls.LoadX509KeyPair(f.NodeCert, f.NodeKey)
	// A certificate of this CA with the client usage but no mediator role.
	other, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "someone", OrganizationalUnit: []string{"tenants"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		t.Fatal(err)
	}
	otherCert, _ := other.TLSCertificate()
	// A mediator certificate of another CA.
	foreignCA, _ := NewCA("foreign")
	fm, _ := foreignCA.IssueMediator("mallory")
	foreignCert, _ := fm.TLSCertificate()

	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		want  string // in the server's error
	}{
		{"no client certificate", nil, "certificate"},
		{"node certificate as client", []tls.Certificate{nodeCert}, "key usage"},
		{"client certificate without the mediator role", []tls.Certificate{otherCert}, "not a mediator certificate"},
		{"mediator certificate of another CA", []tls.Certificate{foreignCert}, "unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}
			// Present the certificate even where the node's list of
			// acceptable CAs does not name its issuer, as an attacker would.
			cli.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				if len(tc.certs) == 0 {
					return &tls.Certificate{}, nil
				}
				return &tc.certs[0], nil
			}
			se, ce := pkitest.Handshake(t, srv, cli, "127.0.0.1")
			if se == nil || ce == nil || !strings.Contains(se.Error(), tc.want) {
				t.Fatalf("server error %v (want %q), client error %v", se, tc.want, ce)
			}
		})
	}
	// Plain TCP gets no further than the TLS handshake.
	l, _ := tls.Listen("tcp", "127.0.0.1:0", srv)
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("VGPU hello in the clear, 32 bytes"))
	b, _ := io.ReadAll(c)
	c.Close()
	if strings.Contains(string(b), "VGPU") {
		t.Fatalf("plain client got %q", b)
	}
}

func TestMediatorRefusesWrongServers(t *testing.T) {
	f := initDir(t, InitOptions{NodeHosts: []string{"10.9.8.7", "node.example"}})
	cli, err := MediatorConfig(f.MediatorCert, f.MediatorKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NodeConfig(f.NodeCert, f.NodeKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	// The node's certificate does not name 127.0.0.1.
	if _, ce := pkitest.Handshake(t, srv, cli, "127.0.0.1"); ce == nil || !strings.Contains(ce.Error(), "127.0.0.1") {
		t.Fatalf("node certificate without the dialled host: client error %v", ce)
	}
	// A node of another CA.
	foreignSrv, _, err := Ephemeral()
	if err != nil {
		t.Fatal(err)
	}
	if _, ce := pkitest.Handshake(t, foreignSrv, cli, "127.0.0.1"); ce == nil || !strings.Contains(ce.Error(), "unknown authority") {
		t.Fatalf("node of another CA: client error %v", ce)
	}
	// A mediator certificate presented as a server.
	ca, _ := LoadCA(f.CA, f.CAKey)
	mp, _ := ca.IssueMediator("imposter")
	mc, _ := mp.TLSCertificate()
	imp := NodeConfigFor(mc, ca.Pool())
	if _, ce := pkitest.Handshake(t, imp, cli, "127.0.0.1"); ce == nil {
		t.Fatal("mediator accepted a mediator certificate as a node")
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	f := initDir(t, InitOptions{})
	missing := filepath.Join(t.TempDir(), "nope.pem")
	for _, tc := range []struct {
		name string
		load func() error
		want []string
	}{
		{"missing CA", func() error { _, err := NodeConfig(f.NodeCert, f.NodeKey, missing); return err }, []string{"TLS", missing}},
		{"CA not PEM", func() error { _, err := NodeConfig(f.NodeCert, f.NodeKey, f.NodeKey); return err }, []string{"TLS", f.NodeKey}},
		{"missing key", func() error { _, err := MediatorConfig(f.MediatorCert, missing, f.CA); return err }, []string{"TLS", missing}},
		{"key of another certificate", func() error { _, err := MediatorConfig(f.MediatorCert, f.NodeKey, f.CA); return err }, []string{"TLS", f.NodeKey}},
		{"node certificate for a mediator", func() error { _, err := MediatorConfig(f.NodeCert, f.NodeKey, f.CA); return err }, []string{"TLS", f.NodeCert, "not a mediator"}},
		{"mediator certificate for a node", func() error { _, err := NodeConfig(f.MediatorCert, f.MediatorKey, f.CA); return err }, []string{"TLS", f.MediatorCert, "not a node"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.load()
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
	// A certificate set of another CA does not load against this CA.
	g := initDir(t, InitOptions{})
	if _, err := NodeConfig(g.NodeCert, g.NodeKey, f.CA); err == nil || !strings.Contains(err.Error(), g.NodeCert) {
		t.Fatalf("node certificate of another CA: %v", err)
	}
}

func TestIssueRefusesBadNames(t *testing.T) {
	ca, err := NewCA("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.IssueMediator("a/b"); err == nil {
		t.Error("mediator name with a slash issued")
	}
	if _, err := ca.IssueNode("", []string{""}); err == nil {
		t.Error("empty node host issued")
	}
}

func TestWritePairWritesNeitherIfEitherExists(t *testing.T) {
	dir := t.TempDir()
	cert, key := NodeFiles(dir, "n1")
	if err := os.WriteFile(key, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := Pair{CertPEM: []byte("cert"), KeyPEM: []byte("key")}
	if err := WritePair(cert, key, p, false); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), key) {
		t.Fatalf("WritePair over an existing key: %v", err)
	}
	if _, err := os.Stat(cert); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("certificate written although the key exists: %v", err)
	}
	if err := WritePair(cert, key, p, true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(key); string(b) != "key" {
		t.Fatalf("key after force: %q", b)
	}
}
