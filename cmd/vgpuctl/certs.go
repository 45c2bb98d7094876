package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vgpu/vgpu/internal/pki"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

const certsUsage = `usage: vgpuctl certs init --dir DIR [--node-host H]... [--mediator NAME] [--force]

Creates the cluster CA and a node and a mediator certificate for mutual TLS
between mediators and nodes: ca.pem, ca-key.pem, node.pem, node-key.pem,
mediator.pem, mediator-key.pem (keys 0600). Existing files are kept unless
--force.
`

// certsCmd is "vgpuctl certs": it needs no mediator (socket is unused).
func certsCmd(_ string, args []string) error {
	if len(args) == 0 || args[0] != "init" {
		fmt.Fprint(os.Stderr, certsUsage)
		if len(args) == 0 {
			return fmt.Errorf("certs: missing subcommand (init)")
		}
		return fmt.Errorf("certs: unknown subcommand %q (init)", args[0])
	}
	fs := flag.NewFlagSet("certs init", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), certsUsage); fs.PrintDefaults() }
	dir := fs.String("dir", "", "directory to write the certificates into (created 0700)")
	var hosts stringList
	fs.Var(&hosts, "node-host", "address or DNS name mediators dial the node by, a SAN of the node certificate; repeat for several (default 127.0.0.1, ::1, localhost)")
	med := fs.String("mediator", "mediator", "the mediator's name in its certificate (CN mediator:NAME, URI vgpu://mediator/NAME)")
	force := fs.Bool("force", false, "replace existing files")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("certs init: unexpected argument %q", fs.Arg(0))
	}
	if *dir == "" {
		return fmt.Errorf("certs init: --dir is required")
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	f, err := pki.Init(pki.InitOptions{Dir: abs, NodeHosts: hosts, Mediator: *med, Force: *force})
	if err != nil {
		return fmt.Errorf("certs init: %w", err)
	}
	shown := []string(hosts)
	if len(shown) == 0 {
		shown = pki.DefaultNodeHosts
	}
	fmt.Printf(`wrote a cluster CA and certificates to %s
  node certificate for: %s
  mediator certificate: mediator:%s

on each node host (node.pem, node-key.pem, ca.pem):
  vgpu-node --listen HOST:7070 --tls-cert %s --tls-key %s --tls-ca %s

on each mediator host (mediator.pem, mediator-key.pem, ca.pem):
  vgpu-mediator --node HOST:7070 --node-tls-cert %s --node-tls-key %s --node-tls-ca %s

HOST must be one of the node certificate's names. Keep %s off every daemon's host:
it signs certificates and is needed only to make more.
`, abs, strings.Join(shown, ", "), *med,
		f.NodeCert, f.NodeKey, f.CA, f.MediatorCert, f.MediatorKey, f.CA, f.CAKey)
	return nil
}
