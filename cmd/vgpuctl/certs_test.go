package main

import (
	"bytes"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/pki"
	"github.com/vgpu/vgpu/internal/pki/pkitest"
)

// runCerts runs "vgpuctl certs ARGS..." and returns what it printed.
func runCerts(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := certs(&out, args)
	return out.String(), err
}

// initCerts runs certs init into a new directory.
func initCerts(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if out, err := runCerts(t, "init", "--dir", dir); err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	return dir
}

func TestCertsIssue(t *testing.T) {
	dir := initCerts(t)
	f := pki.Paths(dir)
	out, err := runCerts(t, "issue", "--dir", dir, "--node", "gpu-2", "--host", "127.0.0.1", "--host", "gpu-2.example")
	if err != nil {
		t.Fatalf("issue node: %v\n%s", err, out)
	}
	nodeCert, nodeKey := pki.NodeFiles(dir, "gpu-2")
	if filepath.Base(nodeCert) != "node-gpu-2.pem" || filepath.Base(nodeKey) != "node-gpu-2-key.pem" {
		t.Fatalf("node files %s, %s", nodeCert, nodeKey)
	}
	if want := "vgpu-node --listen HOST:7070 --tls-cert " + nodeCert + " --tls-key " + nodeKey + " --tls-ca " + f.CA; !strings.Contains(out, want) {
		t.Errorf("issue node does not say %q:\n%s", want, out)
	}
	out, err = runCerts(t, "issue", "--dir", dir, "--mediator", "host-b")
	if err != nil {
		t.Fatalf("issue mediator: %v\n%s", err, out)
	}
	medCert, medKey := pki.MediatorFiles(dir, "host-b")
	if want := "vgpu-mediator --node HOST:7070 --node-tls-cert " + medCert + " --node-tls-key " + medKey + " --node-tls-ca " + f.CA; !strings.Contains(out, want) {
		t.Errorf("issue mediator does not say %q:\n%s", want, out)
	}
	for path, mode := range map[string]os.FileMode{nodeCert: 0o644, nodeKey: 0o600, medCert: 0o644, medKey: 0o600} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != mode {
			t.Fatalf("%s: %v, want mode %v", path, err, mode)
		}
	}

	// The new node and the new mediator trust each other, mutually, and
	// each works with init's certificates of the other role.
	srv, err := pki.NodeConfig(nodeCert, nodeKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := pki.MediatorConfig(medCert, medKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	if se, ce := pkitest.Handshake(t, srv, cli, "127.0.0.1"); se != nil || ce != nil {
		t.Fatalf("new mediator to new node: server %v, client %v", se, ce)
	}
	initSrv, _ := pki.NodeConfig(f.NodeCert, f.NodeKey, f.CA)
	initCli, _ := pki.MediatorConfig(f.MediatorCert, f.MediatorKey, f.CA)
	if se, ce := pkitest.Handshake(t, srv, initCli, "127.0.0.1"); se != nil || ce != nil {
		t.Fatalf("init's mediator to new node: server %v, client %v", se, ce)
	}
	if se, ce := pkitest.Handshake(t, initSrv, cli, "127.0.0.1"); se != nil || ce != nil {
		t.Fatalf("new mediator to init's node: server %v, client %v", se, ce)
	}
	// A node certificate is no client certificate.
	asClient, err := pki.MediatorConfig(nodeCert, nodeKey, f.CA)
	if err == nil {
		t.Fatalf("node certificate loaded as a mediator's: %v", asClient)
	}

	// The node certificate names its hosts, and only them.
	leaf := srv.Certificates[0].Leaf
	for _, h := range []string{"127.0.0.1", "gpu-2.example"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("node certificate: %v", err)
		}
	}
	if err := leaf.VerifyHostname("localhost"); err == nil {
		t.Error("node certificate names localhost, which was not asked for")
	}
	if leaf.Subject.CommonName != "node:gpu-2" {
		t.Errorf("node certificate CN %q", leaf.Subject.CommonName)
	}
	mleaf, _ := x509.ParseCertificate(cli.Certificates[0].Certificate[0])
	if name, ok := pki.MediatorName(mleaf); !ok || name != "host-b" {
		t.Errorf("mediator certificate: name %q %v", name, ok)
	}

	// Again: refused, naming the file, nothing changed; --force replaces.
	before, _ := os.ReadFile(nodeCert)
	args := []string{"issue", "--dir", dir, "--node", "gpu-2", "--host", "127.0.0.1"}
	if _, err := runCerts(t, args...); !errors.Is(err, pki.ErrExists) || !strings.Contains(err.Error(), nodeCert) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("second issue: %v, want ErrExists naming %s and --force", err, nodeCert)
	}
	if after, _ := os.ReadFile(nodeCert); !bytes.Equal(before, after) {
		t.Fatal("refused issue changed the certificate")
	}
	if _, err := runCerts(t, "issue", "--dir", dir, "--mediator", "host-b"); !errors.Is(err, pki.ErrExists) || !strings.Contains(err.Error(), medCert) {
		t.Fatalf("second mediator issue: %v", err)
	}
	if out, err := runCerts(t, append(args, "--force")...); err != nil {
		t.Fatalf("issue --force: %v\n%s", err, out)
	}
	if after, _ := os.ReadFile(nodeCert); bytes.Equal(before, after) {
		t.Fatal("issue --force kept the old certificate")
	}
	if st, err := os.Stat(nodeKey); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("replaced key: %v", err)
	}
	if _, err := pki.NodeConfig(nodeCert, nodeKey, f.CA); err != nil {
		t.Fatalf("replaced node certificate: %v", err)
	}
}

func TestCertsIssueBadInput(t *testing.T) {
	dir := initCerts(t)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--node", "n", "--host", "h", "--mediator", "m"}, "both"},
		{[]string{}, "--node NAME"},
		{[]string{"--node", "n"}, "--host"},
		{[]string{"--mediator", "m", "--host", "h"}, `"h"`},
		{[]string{"--node", "../x", "--host", "h"}, `"../x"`},
		{[]string{"--node", "a/b", "--host", "h"}, `"a/b"`},
		{[]string{"--node", "..", "--host", "h"}, `".."`},
		{[]string{"--node", ".hidden", "--host", "h"}, `".hidden"`},
		{[]string{"--node", "key", "--host", "h"}, `"key"`},
		{[]string{"--node", "a-KEY", "--host", "h"}, `"a-KEY"`},
		{[]string{"--mediator", "m 1"}, `"m 1"`},
		{[]string{"--mediator", strings.Repeat("m", 129)}, strings.Repeat("m", 129)},
	} {
		_, err := runCerts(t, append([]string{"issue", "--dir", dir}, c.args...)...)
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("issue %q: %v; want invalid argument saying %s", c.args, err, c.says)
		}
	}
	if _, err := runCerts(t, "issue", "--node", "n", "--host", "h"); err == nil || !strings.Contains(err.Error(), "--dir") {
		t.Errorf("issue without --dir: %v", err)
	}
	empty := t.TempDir()
	if _, err := runCerts(t, "issue", "--dir", empty, "--mediator", "m"); err == nil || !strings.Contains(err.Error(), filepath.Join(empty, pki.CAFile)) || !strings.Contains(err.Error(), "certs init") {
		t.Errorf("issue without a CA: %v", err)
	}
	if _, err := runCerts(t, "issue", "--dir", dir, "--node", "n", "--host", ""); err == nil {
		t.Error("empty --host issued")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 6 {
		t.Errorf("refused issues left files: %d in %s", len(ents), dir)
	}
	if _, err := runCerts(t, "revoke"); err == nil || !strings.Contains(err.Error(), `"revoke"`) {
		t.Errorf("unknown subcommand: %v", err)
	}
}
