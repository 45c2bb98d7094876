package runtimehook

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

// The runtime settings file gives the wrapper, by the name it is run as,
// what containerd's runc.v2 options cannot pass it as arguments: its
// tenant, the mediator's socket and the state directory. vgpuctl install
// writes it, one table per runtime the engine knows:
//
//	[runtimes.vgpu-team-a]
//	  binary = "/usr/local/bin/vgpu-runtime-team-a"
//	  tenant = "team-a"
//	  socket = "/run/vgpu/mediator.sock"
//	  state_dir = "/run/vgpu/containers"
//
// Docker and containerd both reach it, as it sits on the host's disk, so no
// wrapper script is needed between the engine and vgpu-runtime (one that
// did not keep argv[0] would lose the tenant).
const (
	// DefaultSettingsFile is where vgpuctl install writes the settings and
	// the wrapper reads them.
	DefaultSettingsFile = "/etc/vgpu/runtime.toml"
	// SettingsFileEnv names another settings file (tests, unusual hosts);
	// the wrapper's --vgpu-config flag wins over it.
	SettingsFileEnv = "VGPU_RUNTIME_CONFIG"
	// maxSettingsFile bounds the file the wrapper reads: a few hundred
	// runtimes fit in a small part of it.
	maxSettingsFile = 1 << 20
)

// RuntimeSettings is one runtime's table in the settings file. Empty
// strings take the wrapper's defaults; its --vgpu-* flags win over them.
type RuntimeSettings struct {
	// Binary is what the engine runs: the runtime is recognised by its base
	// name, which is argv[0]'s (containerd's BinaryName, Docker's "path").
	Binary string `toml:"binary"`
	// Tenant is the tenant of every container the runtime creates; "" for
	// the plain runtime, whose tenant is the mediator's mapping of the
	// containerd namespace.
	Tenant   string `toml:"tenant,omitempty"`
	Socket   string `toml:"socket,omitempty"`
	StateDir string `toml:"state_dir,omitempty"`
}

// SettingsFile is the whole file: runtimes by the engine's name for them
// ("vgpu", "vgpu-<tenant>").
type SettingsFile struct {
	Runtimes map[string]RuntimeSettings `toml:"runtimes"`
}

// ParseSettingsFile decodes and checks a settings file's contents. Every
// mistake is an error that names the file, the runtime and the value, and
// matches api.ErrInvalidArgument: a key it does not know, a name or tenant
// outside a tenant name's syntax, a relative path, two runtimes with the
// same binary name (argv[0] could not tell them apart).
func ParseSettingsFile(path string, data []byte) (*SettingsFile, error) {
	f := &SettingsFile{}
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(f); err != nil {
		var se *toml.StrictMissingError
		if errors.As(err, &se) {
			var errs []error
			for _, e := range se.Errors {
				line, col := e.Position()
				errs = append(errs, fmt.Errorf("runtime settings %s:%d:%d: unknown key %s (have binary, tenant, socket, state_dir under [runtimes.NAME]): %w",
					path, line, col, strings.Join(e.Key(), "."), api.ErrInvalidArgument))
			}
			return nil, errors.Join(errs...)
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, col := de.Position()
			return nil, fmt.Errorf("runtime settings %s:%d:%d: %s: %w", path, line, col, strings.TrimPrefix(de.Error(), "toml: "), api.ErrInvalidArgument)
		}
		return nil, fmt.Errorf("runtime settings %s: %v: %w", path, err, api.ErrInvalidArgument)
	}
	byBinary := map[string]string{}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(f.Runtimes)) {
		rt := f.Runtimes[name]
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("runtime settings %s: runtime %q: %s: %w", path, name, fmt.Sprintf(format, a...), api.ErrInvalidArgument))
		}
		if _, err := vocab.ParseTenant(name); err != nil { // a runtime's name follows a tenant's rule
			bad("a runtime name is 1 to 63 of A-Z a-z 0-9 . _ -, starting with a letter or digit")
		}
		if !filepath.IsAbs(rt.Binary) {
			bad("binary %q: want an absolute path", rt.Binary)
		} else if other, dup := byBinary[filepath.Base(rt.Binary)]; dup {
			bad("binary %q has the same name as runtime %q's: argv[0] could not tell them apart", rt.Binary, other)
		} else {
			byBinary[filepath.Base(rt.Binary)] = name
		}
		if _, err := vocab.ParseTenant(rt.Tenant); rt.Tenant != "" && err != nil {
			bad("tenant %q: want 1 to 63 of A-Z a-z 0-9 . _ -, starting with a letter or digit", rt.Tenant)
		}
		for _, p := range []struct{ key, v string }{{"socket", rt.Socket}, {"state_dir", rt.StateDir}} {
			if p.v != "" && !filepath.IsAbs(p.v) {
				bad("%s %q: want an absolute path", p.key, p.v)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return f, nil
}

// LoadSettingsFile reads and checks the settings file at path. A file that
// is not there is no error: it reads as one without runtimes (a host where
// vgpuctl install has not run), and ok is false.
func LoadSettingsFile(path string) (f *SettingsFile, ok bool, err error) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &SettingsFile{}, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("runtime settings: %v: %w", err, api.ErrUnavailable)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxSettingsFile+1))
	if err != nil {
		return nil, false, fmt.Errorf("runtime settings: read %s: %v: %w", path, err, api.ErrUnavailable)
	}
	if len(data) > maxSettingsFile {
		return nil, false, fmt.Errorf("runtime settings %s: larger than %d bytes: %w", path, maxSettingsFile, api.ErrInvalidArgument)
	}
	f, err = ParseSettingsFile(path, data)
	return f, err == nil, err
}

// Match finds the runtime whose binary has argv0's base name.
func (f *SettingsFile) Match(argv0 string) (name string, rt RuntimeSettings, ok bool) {
	base := filepath.Base(argv0)
	for n, r := range f.Runtimes {
		if filepath.Base(r.Binary) == base {
			return n, r, true
		}
	}
	return "", RuntimeSettings{}, false
}

// Encode writes the file as vgpuctl install writes it: a header, then the
// runtimes in name order.
func (f *SettingsFile) Encode() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# vgpu-runtime's settings, by the name of the runtime in Docker and containerd.\n")
	b.WriteString("# Written by \"vgpuctl install\"; read by vgpu-runtime on every call (no restart needed).\n")
	b.WriteString("# vgpu-runtime recognises a runtime by the base name of its binary (argv[0]).\n\n")
	enc := toml.NewEncoder(&b)
	enc.SetIndentTables(true)
	if err := enc.Encode(f); err != nil {
		return nil, fmt.Errorf("encode runtime settings: %w", err)
	}
	return b.Bytes(), nil
}

// Resolve decides which runtime the wrapper is, from argv0, the name it
// was run as, and applies that runtime's
// settings under the --vgpu-* flags given. The settings file is
// --vgpu-config, else $VGPU_RUNTIME_CONFIG (getenv), else
// DefaultSettingsFile. In order:
//
//   - a runtime of the settings file whose binary has argv0's base name:
//     its tenant, socket and state directory (a --vgpu-tenant that names
//     another tenant is an error);
//   - "vgpu-runtime" itself: the plain runtime, no tenant;
//   - "vgpu-runtime-<tenant>" (a symlink made by hand): that tenant.
//
// Any other name is refused (ErrInvalidArgument, naming argv0): the
// wrapper would otherwise run the container as the tenant its namespace
// maps to, which is how a wrapper script that lost argv[0] or a link under
// a runtime's engine name (vgpu-team-b) turned one tenant's containers into
// another's.
func (inv *Invocation) Resolve(argv0 string, getenv func(string) string) error {
	path := inv.Config
	if path == "" {
		path = getenv(SettingsFileEnv)
	}
	if path == "" {
		path = DefaultSettingsFile
	}
	inv.Config = path
	f, found, err := LoadSettingsFile(path)
	if err != nil {
		return err
	}
	name := filepath.Base(argv0)
	if rtName, rt, ok := f.Match(argv0); ok {
		inv.RuntimeName = rtName
		if rt.Tenant != "" {
			if inv.Tenant != "" && inv.Tenant != rt.Tenant {
				return fmt.Errorf("runtime %s (%s in %s) serves tenant %q, but --vgpu-tenant says %q: %w",
					rtName, name, path, rt.Tenant, inv.Tenant, api.ErrInvalidArgument)
			}
			inv.Tenant = rt.Tenant
		}
		if inv.Socket == "" {
			inv.Socket = rt.Socket
		}
		if inv.StateDir == "" {
			inv.StateDir = rt.StateDir
		}
		return nil
	}
	if name == RuntimeName {
		return nil
	}
	if tenant, ok := strings.CutPrefix(name, RuntimeName+"-"); ok {
		if _, err := vocab.ParseTenant(tenant); err != nil {
			return fmt.Errorf("runtime %s: tenant %q in its name: want 1 to 63 of A-Z a-z 0-9 . _ -, starting with a letter or digit: %w",
				name, tenant, vocab.ErrInvalidArgument)
		}
		if inv.Tenant != "" && inv.Tenant != tenant {
			return fmt.Errorf("runtime %s serves tenant %q by its name, but --vgpu-tenant says %q: %w", name, tenant, inv.Tenant, api.ErrInvalidArgument)
		}
		inv.Tenant = tenant
		return nil
	}
	where := "no runtime in " + path + " has that binary name"
	if !found {
		where = path + " does not exist"
	}
	return fmt.Errorf("run as %q, a name it cannot resolve: %s, and it is neither %s nor %s-<tenant>; "+
		"refusing to create the container rather than run it as another tenant "+
		"(run vgpuctl install, or make a wrapper script keep argv[0]: exec -a): %w",
		argv0, where, RuntimeName, RuntimeName, api.ErrInvalidArgument)
}
