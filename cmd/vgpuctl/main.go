// Command vgpuctl is the operator's tool for a vgpu mediator: status, the
// kernel catalog, a self-checking demo and the benchmark.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/bench"
	"github.com/vgpu/vgpu/internal/version"
)

const usage = `usage: vgpuctl [--socket PATH] [--timeout DURATION] COMMAND [flags]
       vgpuctl help [COMMAND [SUBCOMMAND]]
       vgpuctl COMMAND [SUBCOMMAND] --help
       vgpuctl --version

commands:
  status [-o wide] [--json]
                    nodes, devices, containers with their reservations, and
                    tenant sessions of the mediator (-o wide: every column)
  tenants [--json]  tenants: every limit from the quota file and current use
  tenants reload    re-read the quota file (the old one stays if the new one is invalid)
  tenants apply [--etcd ENDPOINTS] FILE
                    cluster mode: validate FILE and store it in etcd for every mediator
  kernels [--json]  the kernel catalog
  top [--interval DURATION]
                    live view: devices, tenants' memory, share and bandwidth, sessions (q quits)
  install docker|containerd [--config PATH] [--runtime-path PATH] [--tenant NAME]... [--dry-run]
                    add the vgpu runtimes to Docker or containerd; prints what to restart
  certs init --dir DIR [--node-host H]... [--mediator NAME] [--force]
                    create the cluster CA and node/mediator certificates for mutual TLS
  certs issue --dir DIR (--node NAME --host H [--host H]... | --mediator NAME) [--force]
                    one more node or mediator certificate from the CA in DIR
  demo [--json]     four tenants compute at once; every result is checked
  bench [--json] [--out DIR] [--max-size SIZE] [--tenants 1,2,4,8] ...
                    data path against raw baselines measured in the same run, as
                    ratios; --out writes JSON, markdown and an SVG chart (bench --help)
  upgrade [--binary PATH] [--upgrade-timeout DURATION] [--json]
                    live upgrade: the mediator hands its sockets, containers and
                    sessions over to the new binary (default: its own path, re-read)

global flags (before or after the command):
`

// command is one vgpuctl command. Help for it, and for each of its
// subcommands, comes from here and never from run, so that asking for help
// cannot dial the mediator, write a file or start work.
type command struct {
	name  string
	usage string   // what help prints before the flags
	subs  []string // subcommands, each with its own help
	// flags returns the flag set of the command (sub "") or of one of its
	// subcommands, for help to list; nil: it has none.
	flags func(sub string) *flag.FlagSet
	run   func(socket string, args []string) error
}

// commands is every vgpuctl command; help and its tests walk this table.
var commands = []command{
	{name: "status", usage: statusUsage, flags: func(string) *flag.FlagSet { fs, _ := statusFlags(); return fs }, run: status},
	{name: "tenants", usage: tenantsUsage, subs: []string{"reload", "apply"}, flags: tenantsSubFlags, run: tenants},
	{name: "kernels", usage: kernelsUsage, flags: jsonFlagsOnly("kernels"), run: kernelList},
	{name: "top", usage: topUsage, flags: func(string) *flag.FlagSet { fs, _, _ := topFlags(); return fs }, run: topCmd},
	{name: "install", usage: installUsage, subs: []string{"docker", "containerd"},
		flags: func(string) *flag.FlagSet { fs, _ := installFlags(); return fs }, run: installCmd},
	{name: "certs", usage: certsUsage, subs: []string{"init", "issue"}, flags: certsSubFlags, run: certsCmd},
	{name: "demo", usage: demoUsage, flags: jsonFlagsOnly("demo"), run: demo},
	{name: "bench", usage: benchUsage, flags: func(string) *flag.FlagSet { fs, _ := benchFlags(); return fs }, run: benchCmd},
	{name: "upgrade", usage: upgradeUsage, flags: func(string) *flag.FlagSet { fs, _, _ := upgradeFlags(); return fs }, run: upgradeCmd},
}

// globals are vgpuctl's own flags. Those that take a value are also
// accepted after the command, where an operator adds them last.
type globals struct {
	fs      *flag.FlagSet
	socket  string
	timeout time.Duration
	version bool
}

func newGlobals() *globals {
	g := &globals{fs: flag.NewFlagSet("vgpuctl", flag.ContinueOnError)}
	g.fs.SetOutput(io.Discard) // main says what went wrong, and help goes to stdout
	g.fs.StringVar(&g.socket, "socket", "", "mediator socket (default $VGPU_SOCKET, else "+client.DefaultSocket+")")
	g.fs.DurationVar(&g.timeout, "timeout", client.DefaultOperatorTimeout,
		"how long status, tenants and kernels wait for each answer of the mediator")
	g.fs.BoolVar(&g.version, "version", false, "print vgpuctl's version and exit")
	return g
}

// afterCommand moves the value-taking global flags found among a command's
// arguments (vgpuctl status --socket S) into g, and returns the rest.
// Arguments after "--" are the command's alone.
func (g *globals) afterCommand(args []string) ([]string, error) {
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(rest, args[i:]...), nil
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || (name != "socket" && name != "timeout") {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag %s needs a value", a)
			}
			i++
			value = args[i]
		}
		if err := g.fs.Set(name, value); err != nil {
			return nil, fmt.Errorf("--%s %q: %w", name, value, err)
		}
	}
	return rest, nil
}

// socketPath is --socket, else $VGPU_SOCKET, else the default: the order
// the SDK's tenants follow, so that vgpuctl looks where they connect.
func (g *globals) socketPath() string {
	if g.socket != "" {
		return g.socket
	}
	if s := os.Getenv("VGPU_SOCKET"); s != "" {
		return s
	}
	return client.DefaultSocket
}

func main() {
	bench.ServePeerIfAsked() // a baseline peer process of vgpuctl bench
	os.Exit(vgpuctl(os.Args[1:], os.Stdout, os.Stderr))
}

// vgpuctl runs one command line and returns the exit status.
func vgpuctl(argv []string, stdout, stderr io.Writer) int {
	g := newGlobals()
	if err := g.fs.Parse(argv); errors.Is(err, flag.ErrHelp) {
		topHelp(stdout, g)
		return 0
	} else if err != nil {
		return usageError(stderr, g, err)
	}
	if g.version {
		fmt.Fprintln(stdout, version.String("vgpuctl"))
		return 0
	}
	args := g.fs.Args()
	if len(args) == 0 {
		return usageError(stderr, g, errors.New("no command"))
	}
	if args[0] == "help" {
		return help(stdout, stderr, g, args[1:])
	}
	c, ok := lookup(args[0])
	if !ok {
		return usageError(stderr, g, fmt.Errorf("unknown command %q", args[0]))
	}
	rest, err := g.afterCommand(args[1:])
	if err != nil {
		return usageError(stderr, g, err)
	}
	if wantsHelp(rest) {
		commandHelp(stdout, c, subOf(c, rest))
		return 0
	}
	if g.timeout <= 0 {
		fmt.Fprintf(stderr, "vgpuctl: --timeout %v: want a duration above 0\n", g.timeout)
		return 2
	}
	operatorTimeout = g.timeout
	if err := c.run(g.socketPath(), rest); err != nil {
		fmt.Fprintln(stderr, "vgpuctl:", err)
		if e, ok := errors.AsType[exitCoder](err); ok {
			return e.exitCode()
		}
		return 1
	}
	return 0
}

// exitCoder is an error of a command that exits with a status of its own
// rather than 1 (vgpuctl status with a node down).
type exitCoder interface {
	error
	exitCode() int
}

func lookup(name string) (command, bool) {
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands[i], true
}

// wantsHelp says whether a command's arguments ask for help anywhere before
// "--": help wins over everything else on the line, as with any flag
// parser, and before the command has done anything.
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// subOf is the subcommand args name first, if c has it.
func subOf(c command, args []string) string {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		if slices.Contains(c.subs, a) {
			return a
		}
		return ""
	}
	return ""
}

// help is "vgpuctl help [COMMAND [SUBCOMMAND]]".
func help(stdout, stderr io.Writer, g *globals, args []string) int {
	if len(args) == 0 {
		topHelp(stdout, g)
		return 0
	}
	c, ok := lookup(args[0])
	if !ok {
		return usageError(stderr, g, fmt.Errorf("help: unknown command %q", args[0]))
	}
	sub := subOf(c, args[1:])
	if len(args) > 1 && sub == "" {
		return usageError(stderr, g, fmt.Errorf("help: %s has no subcommand %q", c.name, args[1]))
	}
	commandHelp(stdout, c, sub)
	return 0
}

func topHelp(w io.Writer, g *globals) {
	fmt.Fprint(w, usage)
	g.fs.SetOutput(w)
	g.fs.PrintDefaults()
	g.fs.SetOutput(io.Discard)
}

func commandHelp(w io.Writer, c command, sub string) {
	fmt.Fprint(w, c.usage)
	if c.flags != nil {
		if fs := c.flags(sub); fs != nil {
			fmt.Fprintln(w, "\nflags:")
			fs.SetOutput(w)
			fs.PrintDefaults()
		}
	}
	fmt.Fprintln(w, "\nglobal flags --socket PATH and --timeout DURATION go before or after the command (vgpuctl --help).")
}

func usageError(stderr io.Writer, g *globals, err error) int {
	fmt.Fprintf(stderr, "vgpuctl: %v\n\n", err)
	topHelp(stderr, g)
	return 2
}
