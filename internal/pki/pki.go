// Package pki makes and loads the cluster's certificates for the
// mediator↔node link: a cluster CA, node certificates (server auth) and
// mediator certificates (client auth), and the mutual-TLS configurations
// each side uses.
//
// Roles are part of a certificate, not of where it came from: a node
// certificate has OU "vgpu-node" and only the server-auth usage; a mediator
// certificate has OU "vgpu-mediator", only the client-auth usage and a URI
// SAN vgpu://mediator/<name>. A node accepts a client only if its certificate
// chains to the cluster CA *and* carries the mediator role, so a node's
// certificate, or any other certificate the CA signed, is refused as a
// client; a mediator accepts a server only with the node role and a SAN that
// matches the address it dialled. Both sides speak TLS 1.3 only.
//
// Files: private keys are written 0600, certificates 0644; nothing existing
// is overwritten unless asked (Force).
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Names of the files Init writes into its directory.
const (
	CAFile           = "ca.pem"
	CAKeyFile        = "ca-key.pem"
	NodeCertFile     = "node.pem"
	NodeKeyFile      = "node-key.pem"
	MediatorCertFile = "mediator.pem"
	MediatorKeyFile  = "mediator-key.pem"
)

// Role markers in certificates.
const (
	NodeOU     = "vgpu-node"
	MediatorOU = "vgpu-mediator"
	// URIScheme and mediatorHost form a mediator's URI SAN,
	// vgpu://mediator/<name>.
	URIScheme    = "vgpu"
	mediatorHost = "mediator"
)

// Validity of what Init issues.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	LeafValidity = 5 * 365 * 24 * time.Hour
	// backdate covers clocks a little behind the issuer's.
	backdate = time.Hour
)

// DefaultNodeHosts are the names a node certificate carries when none are given.
var DefaultNodeHosts = []string{"127.0.0.1", "::1", "localhost"}

// ErrExists is wrapped by Init when it would overwrite a file.
var ErrExists = errors.New("file exists")

// Pair is a PEM certificate and its PEM private key.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// TLSCertificate parses the pair for a tls.Config.
func (p Pair) TLSCertificate() (tls.Certificate, error) {
	return tls.X509KeyPair(p.CertPEM, p.KeyPEM)
}

// CA is a certificate authority that can issue node and mediator certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	Pair Pair
}

// NewCA creates a self-signed cluster CA (ECDSA P-256) valid for CAValidity.
func NewCA(name string) (*CA, error) {
	if name == "" {
		name = "vgpu cluster CA"
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"vgpu"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, Pair: Pair{CertPEM: encodeCert(der), KeyPEM: keyPEM}}, nil
}

// LoadCA reads a CA certificate and its key, as Init wrote them.
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("CA %s, key %s: %w", certFile, keyFile, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("CA %s: certificate %q is not a CA", certFile, cert.Subject.CommonName)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key %s: not a signing key", keyFile)
	}
	certPEM, _ := os.ReadFile(certFile)
	keyPEM, _ := os.ReadFile(keyFile)
	return &CA{Cert: cert, Key: key, Pair: Pair{CertPEM: certPEM, KeyPEM: keyPEM}}, nil
}

// IssueNode issues a node (server) certificate whose SANs are hosts: IP
// addresses become IP SANs, anything else a DNS SAN. No hosts means
// DefaultNodeHosts.
func (ca *CA) IssueNode(name string, hosts []string) (Pair, error) {
	if name == "" {
		name = "node"
	}
	if len(hosts) == 0 {
		hosts = DefaultNodeHosts
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "node:" + name, OrganizationalUnit: []string{NodeOU}, Organization: []string{"vgpu"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			return Pair{}, fmt.Errorf("node host: empty name")
		}
		if ip := net.ParseIP(strings.Trim(h, "[]")); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(tmpl)
}

// IssueMediator issues a mediator (client) certificate for name: CN
// "mediator:<name>", OU MediatorOU and URI SAN vgpu://mediator/<name>.
func (ca *CA) IssueMediator(name string) (Pair, error) {
	if name == "" {
		name = "mediator"
	}
	if strings.ContainsAny(name, "/?#% \t\n") {
		return Pair{}, fmt.Errorf("mediator name %q: use letters, digits, '.', '-' and '_'", name)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "mediator:" + name, OrganizationalUnit: []string{MediatorOU}, Organization: []string{"vgpu"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{{Scheme: URIScheme, Host: mediatorHost, Path: "/" + name}},
	}
	return ca.issue(tmpl)
}

func (ca *CA) issue(tmpl *x509.Certificate) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	if tmpl.SerialNumber, err = newSerial(); err != nil {
		return Pair{}, err
	}
	now := time.Now()
	tmpl.NotBefore = now.Add(-backdate)
	tmpl.NotAfter = now.Add(LeafValidity)
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return Pair{}, fmt.Errorf("issue %q: %w", tmpl.Subject.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// InitOptions says what Init makes.
type InitOptions struct {
	Dir       string
	NodeHosts []string // SANs of the node certificate; none: DefaultNodeHosts
	Mediator  string   // the mediator's name in its certificate; "": "mediator"
	Force     bool     // overwrite existing files
}

// Files are the paths Init wrote.
type Files struct {
	CA, CAKey, NodeCert, NodeKey, MediatorCert, MediatorKey string
}

// Paths returns the file names of a set in dir.
func Paths(dir string) Files {
	return Files{
		CA: filepath.Join(dir, CAFile), CAKey: filepath.Join(dir, CAKeyFile),
		NodeCert: filepath.Join(dir, NodeCertFile), NodeKey: filepath.Join(dir, NodeKeyFile),
		MediatorCert: filepath.Join(dir, MediatorCertFile), MediatorKey: filepath.Join(dir, MediatorKeyFile),
	}
}

// Init creates a CA, a node certificate and a mediator certificate in dir
// (created 0700 if missing). Without Force it writes nothing if any of the
// files exists.
func Init(opt InitOptions) (Files, error) {
	if opt.Dir == "" {
		return Files{}, fmt.Errorf("certificate directory: none given")
	}
	f := Paths(opt.Dir)
	if !opt.Force {
		if err := refuseExisting(f.CA, f.CAKey, f.NodeCert, f.NodeKey, f.MediatorCert, f.MediatorKey); err != nil {
			return f, err
		}
	}
	ca, err := NewCA("")
	if err != nil {
		return f, err
	}
	node, err := ca.IssueNode("", opt.NodeHosts)
	if err != nil {
		return f, err
	}
	med, err := ca.IssueMediator(opt.Mediator)
	if err != nil {
		return f, err
	}
	if err := os.MkdirAll(opt.Dir, 0o700); err != nil {
		return f, err
	}
	writes := []struct {
		cert, key string
		pair      Pair
	}{
		{f.CA, f.CAKey, ca.Pair}, {f.NodeCert, f.NodeKey, node}, {f.MediatorCert, f.MediatorKey, med},
	}
	for _, w := range writes {
		if err := WritePair(w.cert, w.key, w.pair, opt.Force); err != nil {
			return f, err
		}
	}
	return f, nil
}

// NodeFiles returns the certificate and key files of a node certificate
// issued for name into dir: node-NAME.pem and node-NAME-key.pem, beside
// Init's node.pem and node-key.pem. name must be a plain file-name part.
func NodeFiles(dir, name string) (cert, key string) {
	return named(dir, NodeCertFile, name)
}

// MediatorFiles is NodeFiles for a mediator certificate:
// mediator-NAME.pem and mediator-NAME-key.pem.
func MediatorFiles(dir, name string) (cert, key string) {
	return named(dir, MediatorCertFile, name)
}

// named turns "node.pem" into dir/node-NAME.pem and dir/node-NAME-key.pem.
func named(dir, certFile, name string) (cert, key string) {
	stem := strings.TrimSuffix(certFile, ".pem") + "-" + name
	return filepath.Join(dir, stem+".pem"), filepath.Join(dir, stem+"-key.pem")
}

// refuseExisting fails, naming them and wrapping ErrExists, if any of paths
// exists.
func refuseExisting(paths ...string) error {
	var exist []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			exist = append(exist, p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if len(exist) > 0 {
		return fmt.Errorf("%s: %w; not overwriting (use --force to replace them)", strings.Join(exist, ", "), ErrExists)
	}
	return nil
}

// WritePair writes p's certificate to certFile (0644) and its key to
// keyFile (0600), as WriteFile does. Without force it writes neither if
// either exists.
func WritePair(certFile, keyFile string, p Pair, force bool) error {
	if !force {
		if err := refuseExisting(certFile, keyFile); err != nil {
			return err
		}
	}
	if err := WriteFile(certFile, p.CertPEM, 0o644, force); err != nil {
		return err
	}
	return WriteFile(keyFile, p.KeyPEM, 0o600, force)
}

// WriteFile writes data to path with exactly mode. Without force it fails
// (wrapping ErrExists) if path exists; with force it replaces path
// atomically, so a key is never readable with a wider mode.
func WriteFile(path string, data []byte, mode os.FileMode, force bool) error {
	if !force {
		fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s: %w; not overwriting", path, ErrExists)
		}
		if err != nil {
			return err
		}
		return finish(fh, path, data, mode)
	}
	fh, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := fh.Name()
	if err := finish(fh, path, data, mode); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func finish(fh *os.File, path string, data []byte, mode os.FileMode) error {
	err := fh.Chmod(mode) // exact, whatever the umask
	if err == nil {
		_, err = fh.Write(data)
	}
	if err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// MediatorName returns the mediator name in cert and whether cert carries
// the mediator role: OU MediatorOU, the client-auth usage and a URI SAN
// vgpu://mediator/<name>.
func MediatorName(cert *x509.Certificate) (string, bool) {
	if !slices.Contains(cert.Subject.OrganizationalUnit, MediatorOU) || !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth) || cert.IsCA {
		return "", false
	}
	for _, u := range cert.URIs {
		if u.Scheme == URIScheme && u.Host == mediatorHost && len(u.Path) > 1 {
			return u.Path[1:], true
		}
	}
	return "", false
}

// IsNode says whether cert carries the node role: OU NodeOU and the
// server-auth usage.
func IsNode(cert *x509.Certificate) bool {
	return slices.Contains(cert.Subject.OrganizationalUnit, NodeOU) && slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) && !cert.IsCA
}

// certPool reads a PEM bundle of CA certificates.
func certPool(caFile string) (*x509.CertPool, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("TLS CA %s: no PEM certificate in it", caFile)
	}
	return pool, nil
}

// loadLeaf reads a certificate and its key, checks the key matches, that
// the certificate has the wanted role and that it chains to pool for usage.
func loadLeaf(what, certFile, keyFile string, pool *x509.CertPool, usage x509.ExtKeyUsage, role func(*x509.Certificate) bool, roleName string) (tls.Certificate, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS %s certificate %s, key %s: %w", what, certFile, keyFile, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS %s certificate %s: %w", what, certFile, err)
	}
	pair.Leaf = leaf
	if !role(leaf) {
		return tls.Certificate{}, fmt.Errorf("TLS %s certificate %s: %q is not a %s certificate (want OU %s)", what, certFile, leaf.Subject.CommonName, what, roleName)
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS %s certificate %s does not verify against the CA: %w", what, certFile, err)
	}
	return pair, nil
}

// NodeConfig is the server configuration of a node: it presents certFile
// (a node certificate), requires a client certificate that chains to the
// CA in caFile, and accepts only mediator certificates.
func NodeConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	pool, err := certPool(caFile)
	if err != nil {
		return nil, err
	}
	cert, err := loadLeaf("node", certFile, keyFile, pool, x509.ExtKeyUsageServerAuth, IsNode, NodeOU)
	if err != nil {
		return nil, err
	}
	return NodeConfigFor(cert, pool), nil
}

// NodeConfigFor is NodeConfig for a certificate and CA pool in memory.
func NodeConfigFor(cert tls.Certificate, clientCAs *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{cert},
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        clientCAs,
		VerifyConnection: requireMediator,
	}
}

// requireMediator refuses a client whose (already verified) certificate
// lacks the mediator role.
func requireMediator(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("vgpu node: client presented no certificate; only mediators may connect")
	}
	leaf := cs.PeerCertificates[0]
	if _, ok := MediatorName(leaf); !ok {
		return fmt.Errorf("vgpu node: client certificate %q is not a mediator certificate (want OU %s); only mediators may connect", leaf.Subject.CommonName, MediatorOU)
	}
	return nil
}

// requireNode refuses a server whose (already verified) certificate lacks
// the node role.
func requireNode(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("vgpu mediator: node presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	if !IsNode(leaf) {
		return fmt.Errorf("vgpu mediator: server certificate %q is not a node certificate (want OU %s)", leaf.Subject.CommonName, NodeOU)
	}
	return nil
}

// MediatorConfig is the client configuration of a mediator towards nodes:
// it presents certFile (a mediator certificate), trusts only the CA in
// caFile and accepts only node certificates. ServerName is left empty: the
// dialler (tls.Dial) sets it to the host of the node's address, so the
// node's certificate must name that host.
func MediatorConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	pool, err := certPool(caFile)
	if err != nil {
		return nil, err
	}
	cert, err := loadLeaf("mediator", certFile, keyFile, pool, x509.ExtKeyUsageClientAuth,
		func(c *x509.Certificate) bool { _, ok := MediatorName(c); return ok }, MediatorOU)
	if err != nil {
		return nil, err
	}
	return MediatorConfigFor(cert, pool), nil
}

// MediatorConfigFor is MediatorConfig for a certificate and CA pool in memory.
func MediatorConfigFor(cert tls.Certificate, rootCAs *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{cert},
		RootCAs:          rootCAs,
		VerifyConnection: requireNode,
	}
}

// Pool returns a pool holding the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Ephemeral makes a throw-away CA in memory and returns a node's server
// configuration (for hosts; none: DefaultNodeHosts) and a mediator's client
// configuration under it, as NodeConfig and MediatorConfig would: for
// benchmarks and tests.
func Ephemeral(hosts ...string) (node, mediator *tls.Config, err error) {
	ca, err := NewCA("vgpu ephemeral CA")
	if err != nil {
		return nil, nil, err
	}
	np, err := ca.IssueNode("", hosts)
	if err != nil {
		return nil, nil, err
	}
	mp, err := ca.IssueMediator("ephemeral")
	if err != nil {
		return nil, nil, err
	}
	nc, err := np.TLSCertificate()
	if err != nil {
		return nil, nil, err
	}
	mc, err := mp.TLSCertificate()
	if err != nil {
		return nil, nil, err
	}
	return NodeConfigFor(nc, ca.Pool()), MediatorConfigFor(mc, ca.Pool()), nil
}
