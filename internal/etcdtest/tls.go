package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// tlsFiles are the PEM files of a TLS cluster: a CA, the members' serving
// certificate (for 127.0.0.1), and a client certificate, all signed by it.
type tlsFiles struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

// TLSFiles names the client certificate, its key and the CA of a cluster
// started with StartTLS; all "" for a plain one.
func (c *Cluster) TLSFiles() (cert, key, ca string) {
	if c.tls == nil {
		return "", "", ""
	}
	return c.tls.clientCert, c.tls.clientKey, c.tls.ca
}

func (f *tlsFiles) client() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(f.clientCert, f.clientKey)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(f.ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}, nil
}

// writeTLSFiles makes a CA and the certificates it signs, in dir.
func writeTLSFiles(dir string) (*tlsFiles, error) {
	f := &tlsFiles{ca: filepath.Join(dir, "ca.pem"),
		serverCert: filepath.Join(dir, "server.pem"), serverKey: filepath.Join(dir, "server-key.pem"),
		clientCert: filepath.Join(dir, "client.pem"), clientKey: filepath.Join(dir, "client-key.pem")}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdtest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := writePEM(f.ca, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	for i, leaf := range []struct {
		cert, key string
		usage     x509.ExtKeyUsage
	}{{f.serverCert, f.serverKey, x509.ExtKeyUsageServerAuth}, {f.clientCert, f.clientKey, x509.ExtKeyUsageClientAuth}} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: "etcdtest"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{leaf.usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return nil, err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := writePEM(leaf.cert, "CERTIFICATE", der); err != nil {
			return nil, err
		}
		if err := writePEM(leaf.key, "EC PRIVATE KEY", kder); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
