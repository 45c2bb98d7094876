package integration

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

// installHost is a host's files in a temporary directory: vgpu-runtime,
// the engine's configuration and the runtime settings file.
type installHost struct {
	bin, runtime, config, settings string
}

func newInstallHost(t *testing.T, config string) *installHost {
	t.Helper()
	d := t.TempDir()
	h := &installHost{
		bin:      filepath.Join(d, "bin"),
		config:   filepath.Join(d, config),
		settings: filepath.Join(d, "etc", "vgpu", "runtime.toml"),
	}
	h.runtime = filepath.Join(h.bin, "vgpu-runtime")
	if err := os.MkdirAll(h.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.runtime, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *installHost) opts(socket, state string, tenants ...string) InstallOptions {
	return InstallOptions{ConfigPath: h.config, RuntimePath: h.runtime, Tenants: tenants, SettingsPath: h.settings, Socket: socket, StateDir: state}
}

var engines = []struct {
	name    string
	config  string
	install func(InstallOptions) (*Result, error)
}{
	{"docker", "daemon.json", InstallDocker},
	{"containerd", "config.toml", InstallContainerd},
}

// snapshot is what the install may touch: file contents and mtimes, and
// links' targets and inodes.
func snapshot(t *testing.T, paths ...string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			m[p] = "absent"
			continue
		}
		target, _ := os.Readlink(p)
		b, _ := os.ReadFile(p)
		m[p] = fi.ModTime().Format(time.RFC3339Nano) + "|" + target + "|" + string(b)
	}
	return m
}

// TestInstallSettingsAndLinks: install writes, by runtime name, what
// vgpu-runtime needs in the settings file, makes the tenants' links, and
// vgpu-runtime run through a link resolves to its tenant and socket. A
// second run changes nothing at all; a run without --mediator-socket keeps
// the socket; another socket updates the file, not the links.
func TestInstallSettingsAndLinks(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			h := newInstallHost(t, eng.config)
			r, err := eng.install(h.opts("/run/v/m.sock", "/run/v/c", "team-a", "team-b"))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Also) != 3 || r.Also[0].Path != h.settings || !r.Also[0].Changed || !strings.Contains(r.Also[0].Action, "created") {
				t.Fatalf("Also %+v, want the settings file created and two links", r.Also)
			}
			for i, tn := range []string{"team-a", "team-b"} {
				link := h.runtime + "-" + tn
				if c := r.Also[1+i]; c.Path != link || !c.Changed || !strings.Contains(c.Action, "created: link to "+h.runtime) {
					t.Errorf("Also[%d] = %+v, want the link %s created", 1+i, c, link)
				}
				if target, err := os.Readlink(link); err != nil || target != h.runtime {
					t.Errorf("link %s -> %q, %v; want -> %s", link, target, err, h.runtime)
				}
				inv := &runtimehook.Invocation{Config: h.settings}
				if err := inv.Resolve(link, os.Getenv); err != nil || inv.Tenant != tn || inv.RuntimeName != "vgpu-"+tn || inv.Socket != "/run/v/m.sock" || inv.StateDir != "/run/v/c" {
					t.Errorf("runtime run as %s: tenant %q, runtime %q, socket %q, state %q, %v", link, inv.Tenant, inv.RuntimeName, inv.Socket, inv.StateDir, err)
				}
			}
			f, ok, err := runtimehook.LoadSettingsFile(h.settings)
			if err != nil || !ok {
				t.Fatalf("settings file: %v", err)
			}
			if plain := f.Runtimes["vgpu"]; plain != (runtimehook.RuntimeSettings{Binary: h.runtime, Socket: "/run/v/m.sock", StateDir: "/run/v/c"}) {
				t.Errorf("runtime vgpu: %+v", plain)
			}
			if !strings.Contains(strings.Join(r.Notes, "\n"), runtimehook.SettingsFileEnv+"="+h.settings) {
				t.Errorf("notes %q do not say how vgpu-runtime finds %s", r.Notes, h.settings)
			}
			checkMode(t, h.settings, 0o644)
			checkNoTemp(t, h.bin)
			checkNoTemp(t, filepath.Dir(h.settings))

			paths := []string{h.config, h.settings, h.runtime + "-team-a", h.runtime + "-team-b"}
			before := snapshot(t, paths...)
			for _, socket := range []string{"/run/v/m.sock", ""} {
				r, err = eng.install(h.opts(socket, "", "team-a", "team-b"))
				if err != nil {
					t.Fatal(err)
				}
				if r.Changed || r.Written {
					t.Errorf("run again (socket %q): the engine's file changed", socket)
				}
				for _, c := range r.Also {
					if c.Changed || !strings.Contains(c.Action, "already in place") {
						t.Errorf("run again (socket %q): %s: %s", socket, c.Path, c.Action)
					}
				}
				if after := snapshot(t, paths...); !equalMaps(before, after) {
					t.Errorf("run again (socket %q) touched files:\nbefore %q\nafter  %q", socket, before, after)
				}
			}

			r, err = eng.install(h.opts("/run/other.sock", "", "team-a", "team-b"))
			if err != nil {
				t.Fatal(err)
			}
			if !r.Also[0].Changed || !strings.Contains(r.Also[0].Action, "updated") || r.Also[1].Changed || r.Also[2].Changed {
				t.Errorf("new socket: %+v", r.Also)
			}
			inv := &runtimehook.Invocation{Config: h.settings}
			if err := inv.Resolve(h.runtime+"-team-b", os.Getenv); err != nil || inv.Socket != "/run/other.sock" || inv.StateDir != "/run/v/c" {
				t.Errorf("after the new socket: socket %q, state %q, %v", inv.Socket, inv.StateDir, err)
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// The settings file keeps the runtimes another install wrote (Docker's and
// containerd's installs share it), and a link that points elsewhere is
// moved to this vgpu-runtime.
func TestInstallSettingsMerge(t *testing.T) {
	h := newInstallHost(t, "config.toml")
	if _, err := InstallDocker(InstallOptions{ConfigPath: filepath.Join(filepath.Dir(h.config), "daemon.json"), RuntimePath: h.runtime,
		Tenants: []string{"team-d"}, SettingsPath: h.settings}); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/old/vgpu-runtime", h.runtime+"-team-c"); err != nil {
		t.Fatal(err)
	}
	r, err := InstallContainerd(h.opts("", "", "team-c"))
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Also[1]; !c.Changed || !strings.Contains(c.Action, "was to /old/vgpu-runtime") {
		t.Errorf("link: %+v", c)
	}
	if target, _ := os.Readlink(h.runtime + "-team-c"); target != h.runtime {
		t.Errorf("link -> %q", target)
	}
	f, _, err := runtimehook.LoadSettingsFile(h.settings)
	if err != nil {
		t.Fatal(err)
	}
	if f.Runtimes["vgpu-team-d"].Tenant != "team-d" || f.Runtimes["vgpu-team-c"].Tenant != "team-c" {
		t.Errorf("settings %+v, want both installs' runtimes", f.Runtimes)
	}
}

// What stands in the way stops the install before it writes anything: a
// file where a tenant's link goes (a wrapper script that may lose
// argv[0]), a damaged settings file, a relative socket.
func TestInstallSettingsConflicts(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			h := newInstallHost(t, eng.config)
			script := h.runtime + "-team-b"
			if err := os.WriteFile(script, []byte("#!/bin/sh\nexec vgpu-runtime --vgpu-socket /s \"$@\"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := eng.install(h.opts("", "", "team-a", "team-b"))
			if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), script+" is a file, not a link") {
				t.Fatalf("install over a script: %v", err)
			}
			for _, p := range []string{h.config, h.settings, h.runtime + "-team-a"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s written by a refused install", p)
				}
			}
			os.Remove(script)

			if _, err := eng.install(h.opts("run/m.sock", "", "team-a")); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), `"run/m.sock"`) {
				t.Errorf("relative socket: %v", err)
			}

			os.MkdirAll(filepath.Dir(h.settings), 0o755)
			os.WriteFile(h.settings, []byte("[runtimes.vgpu]\nbinary = \"rel\"\n"), 0o644)
			if _, err := eng.install(h.opts("", "", "team-a")); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), `binary "rel"`) {
				t.Errorf("damaged settings file: %v", err)
			}
			if _, err := os.Lstat(h.config); err == nil {
				t.Errorf("%s written by a refused install", h.config)
			}
		})
	}
}

// A dry run says what it would write and writes nothing.
func TestInstallSettingsDryRun(t *testing.T) {
	h := newInstallHost(t, "config.toml")
	o := h.opts("/run/m.sock", "", "team-a")
	o.DryRun = true
	r, err := InstallContainerd(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Also) != 2 || !r.Also[0].Changed || !strings.Contains(r.Also[0].Diff(), `+  [runtimes.vgpu-team-a]`) || !r.Also[1].Changed {
		t.Fatalf("dry run: %+v\n%s", r.Also, r.Also[0].Diff())
	}
	for _, p := range []string{h.config, h.settings, h.runtime + "-team-a"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s written by a dry run", p)
		}
	}
}
