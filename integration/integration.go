// Package integration is the glue between vgpu and the container engines of
// a host. It owns two jobs:
//
//   - install: add vgpu's OCI runtimes to Docker's daemon.json
//     (InstallDocker) or to containerd's config.toml (InstallContainerd),
//     write vgpu-runtime's settings file by runtime name (tenant, socket,
//     state directory) and make the tenants' runtime links, which
//     containerd runs because its runc.v2 options cannot pass arguments;
//   - watch: follow containerd's events (WatchContainerd) so the mediator
//     reclaims, within seconds, what containers that vanished without a
//     poststop hook still hold.
//
// Invariants of an install:
//   - it never loses a setting it does not own: other runtimes, unknown keys
//     and their values survive (Docker: semantically, and in their order;
//     containerd: byte for byte when the new tables can be appended as text,
//     semantically when the file must be rewritten, which the Result says);
//   - it is idempotent: when everything is in place it writes nothing (not
//     the engine's file, not the settings file, not a link);
//   - what stands in its way (a file it cannot parse, a file where a link
//     goes) is found before anything is written;
//   - it writes atomically (a temporary file in the same directory, fsync,
//     rename) with the mode and owner of the file it replaces, so a failed
//     or interrupted install leaves the old file whole;
//   - a dry run writes nothing at all;
//   - a file it cannot parse is an error (*ConfigError, which matches
//     api.ErrInvalidArgument) naming the file and, where the parser gives
//     one, the line; the file is left alone.
//
// Nothing in this package holds a lock.
package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

// Defaults an operator gets without flags.
const (
	// DefaultRuntimePath is where vgpu-runtime, the OCI runtime wrapper, lives.
	DefaultRuntimePath = "/usr/local/bin/vgpu-runtime"
	// DefaultDockerConfig is dockerd's default --config-file.
	DefaultDockerConfig = "/etc/docker/daemon.json"
	// DefaultContainerdConfig is containerd's default --config.
	DefaultContainerdConfig = "/etc/containerd/config.toml"
	// RuntimeName is the name of the runtime without a fixed tenant.
	RuntimeName = "vgpu"
	// TenantFlag is the vgpu-runtime argument that fixes the tenant of every
	// container the runtime creates (Docker passes it through runtimeArgs).
	TenantFlag = "--vgpu-tenant"
)

// Runtime is one OCI runtime that an install adds.
type Runtime struct {
	// Name is the runtime's name in the engine: "vgpu" or "vgpu-<tenant>".
	Name string
	// Tenant is the tenant the runtime fixes; "" for the plain runtime.
	Tenant string
	// Path and Args are what Docker runs (daemon.json "path" and
	// "runtimeArgs"): vgpu-runtime, with "--vgpu-tenant <tenant>" for a
	// tenant's runtime.
	Path string
	Args []string
	// Binary is what containerd's runc shim runs (options.BinaryName). The
	// runc.v2 options cannot carry arguments, so a tenant's runtime runs
	// "<Path>-<tenant>", a symlink to (or wrapper of) vgpu-runtime that takes
	// the tenant from its own name.
	Binary string
}

// Runtimes returns the runtimes to install for the vgpu-runtime at path:
// "vgpu" first, then "vgpu-<t>" for each tenant t, in the order given.
// Errors match api.ErrInvalidArgument.
func Runtimes(path string, tenants []string) ([]Runtime, error) {
	if path == "" {
		path = DefaultRuntimePath
	}
	if !filepath.IsAbs(path) || strings.ContainsFunc(path, isControl) {
		return nil, fmt.Errorf("runtime path %q: must be an absolute path without control characters: %w", path, api.ErrInvalidArgument)
	}
	path = filepath.Clean(path)
	rts := []Runtime{{Name: RuntimeName, Path: path, Binary: path}}
	seen := map[string]bool{}
	for _, t := range tenants {
		// The name becomes part of a runtime name, a TOML key and a file
		// name, all of which the tenant rule allows.
		if _, err := vocab.ParseTenant(t); err != nil {
			return nil, err
		}
		if seen[t] {
			return nil, fmt.Errorf("tenant %q given twice: %w", t, api.ErrInvalidArgument)
		}
		seen[t] = true
		rts = append(rts, Runtime{
			Name:   RuntimeName + "-" + t,
			Tenant: t,
			Path:   path,
			Args:   []string{TenantFlag, t},
			Binary: path + "-" + t,
		})
	}
	return rts, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// InstallOptions says what to install where.
type InstallOptions struct {
	// ConfigPath is the engine's configuration file; "" means the default
	// (DefaultDockerConfig or DefaultContainerdConfig). A symlink is
	// followed: its target is what gets rewritten.
	ConfigPath string
	// RuntimePath is vgpu-runtime's path; "" means DefaultRuntimePath.
	RuntimePath string
	// Tenants each get a runtime "vgpu-<tenant>" bound to that tenant.
	Tenants []string
	// DryRun computes the result but writes nothing.
	DryRun bool
	// SettingsPath is the runtime settings file vgpu-runtime reads
	// (runtimehook.DefaultSettingsFile for vgpuctl install): the install
	// writes there, by runtime name, each runtime's tenant, socket and state
	// directory, and makes the tenants' runtime links "<RuntimePath>-<tenant>".
	// "" leaves the settings file and the links alone.
	SettingsPath string
	// Socket and StateDir are the mediator's socket and the containers'
	// state directory the runtimes use ("" keeps what the settings file
	// says, else vgpu-runtime's defaults). Only with SettingsPath.
	Socket, StateDir string
}

// Result is what an install did, or, for a dry run, would do.
type Result struct {
	// Path is the file edited (after following symlinks).
	Path string
	// Existed tells whether the file was there before.
	Existed bool
	// Before and After are the file's contents before and after the install.
	Before, After []byte
	// Changed tells whether After differs from Before (for a dry run: would).
	Changed bool
	// Written tells whether the file was written (never on a dry run).
	Written bool
	// Rewritten tells that the file was parsed and marshalled again instead
	// of edited as text: settings are kept, comments and layout are not.
	Rewritten bool
	// Backup names the copy of the old file kept when it was Rewritten.
	Backup string
	// Actions says, one line per runtime, whether it was added, updated
	// (and from what) or already in place.
	Actions []string
	// Notes are what the operator must do or know besides restarting.
	Notes []string
	// Restart is the command that makes the engine load the change, with
	// what it does to running containers; "" when nothing changed.
	Restart string
	// Also are the runtime settings file and the tenants' runtime links
	// (with InstallOptions.SettingsPath), changed or in place. vgpu-runtime
	// reads them on every call: they need no restart.
	Also []Change
}

// Diff returns the change as a unified diff of the file ("" when unchanged).
func (r *Result) Diff() string {
	if !r.Changed {
		return ""
	}
	from := r.Path
	if !r.Existed {
		from = "/dev/null"
	}
	return unifiedDiff(from, r.Path, r.Before, r.After)
}

// ConfigError is a configuration file that cannot be used as it is: it does
// not parse, or a setting vgpu must edit has an unexpected type. It matches
// api.ErrInvalidArgument.
type ConfigError struct {
	Path   string
	Line   int // 1-based; 0 when unknown
	Column int // 1-based; 0 when unknown
	Msg    string
}

func (e *ConfigError) Error() string {
	switch {
	case e.Line > 0 && e.Column > 0:
		return fmt.Sprintf("%s:%d:%d: %s", e.Path, e.Line, e.Column, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.Path, e.Msg)
}

// Unwrap makes errors.Is(err, api.ErrInvalidArgument) true.
func (e *ConfigError) Unwrap() error { return api.ErrInvalidArgument }

// fileError wraps an I/O error on path; a permission problem also matches
// api.ErrPermissionDenied.
func fileError(op, path string, err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%s %s: %w: %w", op, path, err, api.ErrPermissionDenied)
	}
	return fmt.Errorf("%s %s: %w", op, path, err)
}

// readConfig resolves symlinks in path and reads the file; a missing file
// reads as empty with existed == false.
// loadInstall resolves the runtimes to install and reads the configuration
// file they go into (defaultPath unless opts names one).
func loadInstall(opts InstallOptions, defaultPath string) (rts []Runtime, real string, before []byte, existed bool, err error) {
	if rts, err = Runtimes(opts.RuntimePath, opts.Tenants); err != nil {
		return nil, "", nil, false, err
	}
	path := opts.ConfigPath
	if path == "" {
		path = defaultPath
	}
	real, before, existed, err = readConfig(path)
	return rts, real, before, existed, err
}

func readConfig(path string) (real string, data []byte, existed bool, err error) {
	real = path
	if r, err := filepath.EvalSymlinks(path); err == nil {
		real = r
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", nil, false, fileError("resolve", path, err)
	}
	data, err = os.ReadFile(real)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return real, nil, false, nil
	case err != nil:
		return "", nil, false, fileError("read", real, err)
	}
	return real, data, true, nil
}

// writeFileAtomic replaces path with data: a temporary file in the same
// directory gets the data, the old file's mode and owner (mode for a new
// file), is synced and renamed over path; the directory is synced last.
// On error the old file is untouched and the temporary file removed.
func writeFileAtomic(path string, data []byte, mode fs.FileMode) (err error) {
	dir := filepath.Dir(path)
	uid, gid := -1, -1
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(sys.Uid), int(sys.Gid)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fileError("stat", path, err)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fileError("create directory", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".vgpu-*")
	if err != nil {
		return fileError("create temporary file in", dir, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fileError("write", tmp, err)
	}
	if err := f.Chmod(mode); err != nil {
		return fileError("chmod", tmp, err)
	}
	if uid >= 0 {
		if st, err := f.Stat(); err == nil {
			if sys, ok := st.Sys().(*syscall.Stat_t); ok && (int(sys.Uid) != uid || int(sys.Gid) != gid) {
				if err := f.Chown(uid, gid); err != nil {
					return fileError("chown", tmp, err)
				}
			}
		}
	}
	if err := f.Sync(); err != nil {
		return fileError("sync", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fileError("close", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fileError("rename over", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // best effort: the rename is done; a failed sync loses nothing we could save
		d.Close()
	}
	return nil
}

// missingBinary tells whether nothing exists at path (a runtime binary the
// operator has yet to install).
func missingBinary(path string) bool {
	_, err := os.Stat(path)
	return errors.Is(err, fs.ErrNotExist)
}
