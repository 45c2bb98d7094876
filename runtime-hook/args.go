package runtimehook

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

// Defaults of the wrapper's flags.
const (
	DefaultOperatorSocket = vocab.DefaultSocket
	DefaultStateDir       = vocab.DefaultContainerDir
)

// DefaultRuntimes are where the wrapper looks for runc, in order, when
// --vgpu-runtime is not given. A fixed list, not $PATH.
var DefaultRuntimes = []string{"/usr/bin/runc", "/usr/sbin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc"}

// Invocation is one call of the wrapper: its own settings, and what the
// real runtime is to be called with.
type Invocation struct {
	// Args are the arguments for the real runtime: all of the wrapper's
	// but its --vgpu-* flags, unchanged and in order.
	Args []string

	Command   string // runc's subcommand: create, start, state …; "" if none
	Root      string // runc's global --root
	Log       string // runc's global --log
	LogFormat string // runc's global --log-format
	Bundle    string // FromBundle: --bundle as given; "" means the current directory
	ID        string // FromBundle: the container id, the last positional argument

	// The wrapper's flags. Empty ones take their defaults.
	Tenant   string // --vgpu-tenant: the tenant of every container this runtime creates
	Runtime  string // --vgpu-runtime: the real runtime
	Socket   string // --vgpu-socket: the mediator's operator socket
	Hook     string // --vgpu-hook: vgpu-hook
	StateDir string // --vgpu-state: where containers' socket directories go
	Config   string // --vgpu-config: the runtime settings file (Resolve)
	Smi      string // --vgpu-smi: vgpu-smi, mounted into each container it attaches (smi.go)

	// RuntimeName is the settings file's runtime the wrapper was run as
	// (Resolve); "" when its name resolved without the file.
	RuntimeName string
}

// Namespace is the containerd namespace: the base name of runc's --root
// ("moby" for Docker, "k8s.io" for the CRI), or "" without one.
func (inv *Invocation) Namespace() string {
	if inv.Root == "" {
		return ""
	}
	return filepath.Base(filepath.Clean(inv.Root))
}

// FromBundle reports whether the call makes a container from a bundle:
// create and run, and restore (from a checkpoint), which runs the hooks of
// the bundle's config.json as create does.
func (inv *Invocation) FromBundle() bool {
	return inv.Command == "create" || inv.Command == "run" || inv.Command == "restore"
}

// wrapperFlags are the wrapper's own flags, by name, and where each goes.
var wrapperFlags = map[string]func(*Invocation) *string{
	"--vgpu-tenant":  func(i *Invocation) *string { return &i.Tenant },
	"--vgpu-runtime": func(i *Invocation) *string { return &i.Runtime },
	"--vgpu-socket":  func(i *Invocation) *string { return &i.Socket },
	"--vgpu-hook":    func(i *Invocation) *string { return &i.Hook },
	"--vgpu-state":   func(i *Invocation) *string { return &i.StateDir },
	"--vgpu-config":  func(i *Invocation) *string { return &i.Config },
	"--vgpu-smi":     func(i *Invocation) *string { return &i.Smi },
}

// valueFlags lists, for runc's global flags ("") and for the subcommands
// whose arguments the wrapper reads, the flags that take a value. Flags not
// listed are taken as booleans.
var valueFlags = map[string]map[string]bool{
	"":       set("log", "log-format", "root", "criu", "rootless"),
	"create": set("bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"),
	"run":    set("bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"),
	"restore": set("bundle", "b", "console-socket", "pid-file", "image-path", "work-path", "manage-cgroups-mode",
		"empty-ns", "lsm-profile", "lsm-mount-context"),
	"exec": set("console-socket", "pidfd-socket", "cwd", "env", "e", "user", "u", "additional-gids", "g",
		"process", "p", "pid-file", "process-label", "apparmor", "cap", "c", "preserve-fds", "cgroup"),
}

func set(names ...string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// flagName splits "-x", "--name" or "--name=value" into its name and value.
// It reports false for arguments that are not flags ("-" and "--" included).
func flagName(arg string) (name, value string, hasValue, ok bool) {
	if len(arg) < 2 || arg[0] != '-' || arg == "--" {
		return "", "", false, false
	}
	name = strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
	name, value, hasValue = strings.Cut(name, "=")
	return name, value, hasValue, name != ""
}

// ParseArgs reads the wrapper's arguments (without the program name), in
// the shapes Docker and the containerd shim use:
//
//	[--vgpu-* …] [global flags] create [--bundle B] [flags] ID
//
// It takes out --vgpu-* flags ("--vgpu-x v" and "--vgpu-x=v") wherever
// they appear (but in the command an exec runs, after its container id, or
// after "--"), finds the subcommand, runc's --root, --log and
// --log-format, and for create, run and restore the bundle and the
// container id.
func ParseArgs(args []string) (*Invocation, error) {
	inv := &Invocation{Args: make([]string, 0, len(args))}
	scope := ""       // "" while reading global flags, then the subcommand
	verbatim := false // after "--", or in exec's command: pass everything on
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if verbatim {
			inv.Args = append(inv.Args, arg)
			if inv.FromBundle() {
				inv.ID = arg
			}
			continue
		}
		if strings.HasPrefix(arg, "--vgpu-") {
			name, value, hasValue := strings.Cut(arg, "=")
			dst, known := wrapperFlags[name]
			if !known {
				return nil, fmt.Errorf("unknown wrapper flag %s (have --vgpu-tenant, --vgpu-runtime, --vgpu-socket, --vgpu-hook, --vgpu-state, --vgpu-config, --vgpu-smi): %w",
					name, api.ErrInvalidArgument)
			}
			if !hasValue {
				if i+1 >= len(args) {
					return nil, fmt.Errorf("wrapper flag %s needs a value: %w", name, api.ErrInvalidArgument)
				}
				i++
				value = args[i]
			}
			*dst(inv) = value
			continue
		}
		inv.Args = append(inv.Args, arg)
		if arg == "--" {
			verbatim = true
			continue
		}
		name, value, hasValue, isFlag := flagName(arg)
		if !isFlag {
			if scope == "" {
				scope, inv.Command = arg, arg
				continue
			}
			// runc reorders flags after positional arguments to the
			// front (create ID --bundle B works), except for exec.
			if inv.FromBundle() {
				inv.ID = arg
			}
			if scope == "exec" {
				verbatim = true // the rest is the command to run in the container
			}
			continue
		}
		if !hasValue && valueFlags[scope][name] && i+1 < len(args) {
			i++
			value, hasValue = args[i], true
			inv.Args = append(inv.Args, value)
		}
		if !hasValue {
			continue
		}
		switch {
		case scope == "" && name == "root":
			inv.Root = value
		case scope == "" && name == "log":
			inv.Log = value
		case scope == "" && name == "log-format":
			inv.LogFormat = value
		case inv.FromBundle() && (name == "bundle" || name == "b"):
			inv.Bundle = value
		}
	}
	return inv, nil
}

// RuntimeName is the wrapper's installed name: run as RuntimeName it is the
// plain runtime, as RuntimeName-<tenant> (a symlink) that tenant's, when
// the settings file does not say otherwise (Resolve).
const RuntimeName = "vgpu-runtime"

// Settings fills in the defaults of the wrapper's flags and checks them:
// the real runtime (found, and not this wrapper), the hook (absolute and
// there), and absolute socket and state paths. self is the wrapper's own
// executable ("" if unknown).
func (inv *Invocation) Settings(self string) error {
	if inv.Tenant != "" {
		if _, err := vocab.ParseTenant(inv.Tenant); err != nil {
			return fmt.Errorf("--vgpu-tenant: %w", err)
		}
	}
	if inv.Socket == "" {
		inv.Socket = DefaultOperatorSocket
	}
	if inv.StateDir == "" {
		inv.StateDir = DefaultStateDir
	}
	for _, p := range []struct{ flag, v string }{{"--vgpu-socket", inv.Socket}, {"--vgpu-state", inv.StateDir}} {
		if !filepath.IsAbs(p.v) {
			return fmt.Errorf("%s %q: want an absolute path: %w", p.flag, p.v, api.ErrInvalidArgument)
		}
	}
	inv.Socket, inv.StateDir = filepath.Clean(inv.Socket), filepath.Clean(inv.StateDir)
	rt, err := findRuntime(inv.Runtime, self)
	if err != nil {
		return err
	}
	inv.Runtime = rt
	if inv.Hook == "" && self != "" {
		inv.Hook = filepath.Join(filepath.Dir(self), "vgpu-hook")
	}
	if !filepath.IsAbs(inv.Hook) {
		return fmt.Errorf("--vgpu-hook %q: want an absolute path: %w", inv.Hook, api.ErrInvalidArgument)
	}
	inv.Hook = filepath.Clean(inv.Hook)
	return inv.smiSetting(self)
}

// CheckHook checks that the hook is an executable file; the wrapper does so
// before it installs it, for a clearer message than the runtime's.
func (inv *Invocation) CheckHook() error {
	fi, err := os.Stat(inv.Hook)
	if err != nil {
		return fmt.Errorf("vgpu-hook: %v (set --vgpu-hook): %w", err, api.ErrUnavailable)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("vgpu-hook %s is not an executable file (set --vgpu-hook): %w", inv.Hook, api.ErrUnavailable)
	}
	return nil
}

// findRuntime resolves --vgpu-runtime: an absolute path, a relative one, or
// a bare name looked up in $PATH (the caller's, the daemon's: trusted); by
// default the first of DefaultRuntimes that exists. It refuses the wrapper
// itself, which would exec itself forever.
func findRuntime(flag, self string) (string, error) {
	var candidates []string
	switch {
	case flag == "":
		candidates = DefaultRuntimes
	case !strings.Contains(flag, "/"):
		p, err := exec.LookPath(flag)
		if err != nil {
			return "", fmt.Errorf("--vgpu-runtime %q: %v: %w", flag, err, api.ErrUnavailable)
		}
		candidates = []string{p}
	default:
		candidates = []string{flag}
	}
	for _, c := range candidates {
		abs, err := filepath.Abs(c)
		if err != nil {
			continue
		}
		fi, err := os.Stat(abs)
		if err != nil || fi.IsDir() {
			continue
		}
		if self != "" {
			if me, err := os.Stat(self); err == nil && os.SameFile(fi, me) {
				return "", fmt.Errorf("runtime %s is this wrapper itself; set --vgpu-runtime to the real runtime: %w", abs, api.ErrInvalidArgument)
			}
		}
		return abs, nil
	}
	if flag != "" {
		return "", fmt.Errorf("--vgpu-runtime %q: no such file: %w", flag, api.ErrUnavailable)
	}
	return "", fmt.Errorf("no runc at %s; set --vgpu-runtime: %w", strings.Join(DefaultRuntimes, ", "), api.ErrUnavailable)
}
