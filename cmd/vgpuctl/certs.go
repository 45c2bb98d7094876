package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/pki"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

const certsUsage = `usage: vgpuctl certs init --dir DIR [--node-host H]... [--mediator NAME] [--force]
       vgpuctl certs issue --dir DIR (--node NAME --host H [--host H]... | --mediator NAME) [--force]

init creates the cluster CA and a node and a mediator certificate for mutual
TLS between mediators and nodes: ca.pem, ca-key.pem, node.pem, node-key.pem,
mediator.pem, mediator-key.pem (keys 0600).

issue signs one more certificate with the CA that init wrote in DIR: a node
certificate naming its hosts (node-NAME.pem, node-NAME-key.pem) or a mediator
certificate (mediator-NAME.pem, mediator-NAME-key.pem).

Existing files are kept unless --force. The flags of each: vgpuctl certs
init --help, vgpuctl certs issue --help.
`

// certsCmd is "vgpuctl certs": it needs no mediator (socket is unused).
func certsCmd(_ string, args []string) error {
	return certs(os.Stdout, args)
}

func certs(w io.Writer, args []string) error {
	sub := map[string]func(io.Writer, []string) error{"init": certsInit, "issue": certsIssue}
	if len(args) == 0 || sub[args[0]] == nil {
		if len(args) == 0 {
			return fmt.Errorf("certs: missing subcommand (init, issue)")
		}
		return fmt.Errorf("certs: unknown subcommand %q (init, issue)", args[0])
	}
	return sub[args[0]](w, args[1:])
}

// certsOptions are the flags of "certs init" and "certs issue", and their
// flag set.
type certsOptions struct {
	fs    *flag.FlagSet
	dir   string
	force bool
	node  string     // issue: --node
	hosts stringList // init: --node-host; issue: --host
	med   string     // --mediator
}

// newCertsOptions defines the flags of "certs SUB" (init or issue).
func newCertsOptions(sub string) *certsOptions {
	o := &certsOptions{fs: flag.NewFlagSet("certs "+sub, flag.ContinueOnError)}
	fs := o.fs
	fs.SetOutput(io.Discard) // the error says what is wrong; help is vgpuctl's
	fs.StringVar(&o.dir, "dir", "", "directory of the certificates (init creates it 0700)")
	fs.BoolVar(&o.force, "force", false, "replace existing files")
	switch sub {
	case "init":
		fs.Var(&o.hosts, "node-host", "address or DNS name mediators dial the node by, a SAN of the node certificate; repeat for several (default 127.0.0.1, ::1, localhost)")
		fs.StringVar(&o.med, "mediator", "mediator", "the mediator's name in its certificate (CN mediator:NAME, URI vgpu://mediator/NAME)")
	case "issue":
		fs.StringVar(&o.node, "node", "", "issue a node certificate for the node NAME (CN node:NAME)")
		fs.Var(&o.hosts, "host", "with --node: address or DNS name mediators dial the node by, a SAN of its certificate; at least one, repeat for several")
		fs.StringVar(&o.med, "mediator", "", "issue a mediator certificate for the mediator NAME (CN mediator:NAME, URI vgpu://mediator/NAME)")
	}
	return o
}

// parse parses args and returns --dir made absolute.
func (o *certsOptions) parse(args []string) (string, error) {
	if err := o.fs.Parse(args); err != nil {
		return "", err
	}
	if o.fs.NArg() > 0 {
		return "", fmt.Errorf("%s: unexpected argument %q", o.fs.Name(), o.fs.Arg(0))
	}
	if o.dir == "" {
		return "", fmt.Errorf("%s: --dir is required", o.fs.Name())
	}
	return filepath.Abs(o.dir)
}

// certsSubFlags is the flag set of "certs SUB", for help: none for certs
// alone, whose usage sends the operator to each subcommand's.
func certsSubFlags(sub string) *flag.FlagSet {
	switch sub {
	case "init", "issue":
		return newCertsOptions(sub).fs
	}
	return nil
}

func certsInit(w io.Writer, args []string) error {
	o := newCertsOptions("init")
	abs, err := o.parse(args)
	if err != nil {
		return err
	}
	f, err := pki.Init(pki.InitOptions{Dir: abs, NodeHosts: o.hosts, Mediator: o.med, Force: o.force})
	if err != nil {
		return fmt.Errorf("certs init: %w", err)
	}
	shown := []string(o.hosts)
	if len(shown) == 0 {
		shown = pki.DefaultNodeHosts
	}
	fmt.Fprintf(w, `wrote a cluster CA and certificates to %s
  node certificate for: %s
  mediator certificate: mediator:%s

`, abs, strings.Join(shown, ", "), o.med)
	printNodeFlags(w, "each node host", f.NodeCert, f.NodeKey, f.CA)
	fmt.Fprintln(w)
	printMediatorFlags(w, "each mediator host", f.MediatorCert, f.MediatorKey, f.CA)
	fmt.Fprintln(w)
	printHostNote(w, f.CAKey)
	return nil
}

func certsIssue(w io.Writer, args []string) error {
	o := newCertsOptions("issue")
	abs, err := o.parse(args)
	if err != nil {
		return err
	}
	hosts, node, med := o.hosts, o.node, o.med
	var role, name string
	switch {
	case node != "" && med != "":
		return fmt.Errorf("certs issue: both --node %q and --mediator %q given; issue one certificate at a time: %w", node, med, api.ErrInvalidArgument)
	case node != "":
		role, name = "node", node
		if len(hosts) == 0 {
			return fmt.Errorf("certs issue: node %q: give at least one --host that mediators dial it by: %w", name, api.ErrInvalidArgument)
		}
	case med != "":
		role, name = "mediator", med
		if len(hosts) > 0 {
			return fmt.Errorf("certs issue: --host %q is for a node certificate, not a mediator's: %w", hosts[0], api.ErrInvalidArgument)
		}
	default:
		return fmt.Errorf("certs issue: say what to issue: --node NAME --host H, or --mediator NAME: %w", api.ErrInvalidArgument)
	}
	if err := checkCertName(role, name); err != nil {
		return fmt.Errorf("certs issue: %w", err)
	}
	f := pki.Paths(abs)
	ca, err := pki.LoadCA(f.CA, f.CAKey)
	if err != nil {
		return fmt.Errorf("certs issue: %w (run vgpuctl certs init --dir %s first)", err, abs)
	}
	var pair pki.Pair
	var cert, key string
	if role == "node" {
		pair, err = ca.IssueNode(name, hosts)
		cert, key = pki.NodeFiles(abs, name)
	} else {
		pair, err = ca.IssueMediator(name)
		cert, key = pki.MediatorFiles(abs, name)
	}
	if err != nil {
		return fmt.Errorf("certs issue: %w", err)
	}
	if err := pki.WritePair(cert, key, pair, o.force); err != nil {
		return fmt.Errorf("certs issue: %w", err)
	}
	if role == "node" {
		fmt.Fprintf(w, "wrote node certificate node:%s for: %s\n\n", name, strings.Join(hosts, ", "))
		printNodeFlags(w, "node "+name, cert, key, f.CA)
		fmt.Fprintln(w)
		printHostNote(w, f.CAKey)
	} else {
		fmt.Fprintf(w, "wrote mediator certificate mediator:%s\n\n", name)
		printMediatorFlags(w, "mediator "+name, cert, key, f.CA)
	}
	return nil
}

// certName is what a node or mediator name in a file name may be: a plain
// single path component.
var certName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// checkCertName refuses a name that is not certName, or that would make
// another certificate's file name: "key" (node-key.pem is init's key) or a
// name ending in "-key" (node-a-key.pem is node a's key).
func checkCertName(role, name string) error {
	low := strings.ToLower(name)
	if !certName.MatchString(name) || low == "key" || strings.HasSuffix(low, "-key") {
		return fmt.Errorf("%s name %q: want 1-128 of A-Z a-z 0-9 _ . -, starting with a letter or digit, not \"key\" nor ending in \"-key\": %w", role, name, api.ErrInvalidArgument)
	}
	return nil
}

// printNodeFlags says which files go where and the vgpu-node flags for them.
func printNodeFlags(w io.Writer, where, cert, key, ca string) {
	fmt.Fprintf(w, "on %s (%s, %s, %s):\n  vgpu-node --listen HOST:7070 --tls-cert %s --tls-key %s --tls-ca %s\n",
		where, filepath.Base(cert), filepath.Base(key), filepath.Base(ca), cert, key, ca)
}

// printMediatorFlags is printNodeFlags for vgpu-mediator.
func printMediatorFlags(w io.Writer, where, cert, key, ca string) {
	fmt.Fprintf(w, "on %s (%s, %s, %s):\n  vgpu-mediator --node HOST:7070 --node-tls-cert %s --node-tls-key %s --node-tls-ca %s\n",
		where, filepath.Base(cert), filepath.Base(key), filepath.Base(ca), cert, key, ca)
}

func printHostNote(w io.Writer, caKey string) {
	fmt.Fprintf(w, `HOST must be one of the node certificate's names. Keep %s off every daemon's host:
it signs certificates and is needed only to make more.
`, caKey)
}
