package runtimehook

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
)

const settingsTOML = `
[runtimes.vgpu]
  binary = "/usr/local/bin/vgpu-runtime"
  socket = "/run/vgpu/m.sock"
  state_dir = "/run/vgpu/c"

[runtimes.vgpu-team-a]
  binary = "/usr/local/bin/vgpu-runtime-team-a"
  tenant = "team-a"
  socket = "/run/vgpu/m.sock"
  state_dir = "/run/vgpu/c"

[runtimes.vgpu-team-b]
  binary = "/opt/vgpu/rt-b"
  tenant = "team-b"
`

func writeSettings(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runtime.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestResolve: the name the wrapper is run as picks its runtime in the
// settings file, else one of the two fixed forms; anything else is
// refused with argv[0] in the message, never resolved to "no tenant".
func TestResolve(t *testing.T) {
	file := writeSettings(t, settingsTOML)
	missing := filepath.Join(t.TempDir(), "absent.toml")
	for _, tc := range []struct {
		name         string
		config       string // "" = file
		argv0, flag  string // flag: --vgpu-tenant
		socket       string // --vgpu-socket
		wantTenant   string
		wantRuntime  string
		wantSocket   string
		wantStateDir string
		err          string
	}{
		{name: "plain, from the file", argv0: "/usr/local/bin/vgpu-runtime", wantRuntime: "vgpu", wantSocket: "/run/vgpu/m.sock", wantStateDir: "/run/vgpu/c"},
		{name: "plain with Docker's --vgpu-tenant", argv0: "/usr/local/bin/vgpu-runtime", flag: "team-a", wantTenant: "team-a", wantRuntime: "vgpu", wantSocket: "/run/vgpu/m.sock", wantStateDir: "/run/vgpu/c"},
		{name: "tenant link", argv0: "/usr/local/bin/vgpu-runtime-team-a", wantTenant: "team-a", wantRuntime: "vgpu-team-a", wantSocket: "/run/vgpu/m.sock", wantStateDir: "/run/vgpu/c"},
		{name: "bare name from $PATH", argv0: "vgpu-runtime-team-a", wantTenant: "team-a", wantRuntime: "vgpu-team-a", wantSocket: "/run/vgpu/m.sock", wantStateDir: "/run/vgpu/c"},
		{name: "a binary of any name", argv0: "/opt/vgpu/rt-b", wantTenant: "team-b", wantRuntime: "vgpu-team-b"},
		{name: "flag agrees", argv0: "/opt/vgpu/rt-b", flag: "team-b", wantTenant: "team-b", wantRuntime: "vgpu-team-b"},
		{name: "flag disagrees", argv0: "/opt/vgpu/rt-b", flag: "team-a", err: `serves tenant "team-b", but --vgpu-tenant says "team-a"`},
		{name: "flag wins over the file's socket", argv0: "/usr/local/bin/vgpu-runtime", socket: "/s", wantRuntime: "vgpu", wantSocket: "/s", wantStateDir: "/run/vgpu/c"},
		{name: "hand-made link not in the file", argv0: "/usr/local/bin/vgpu-runtime-team-z", wantTenant: "team-z"},
		{name: "hand-made link, bad tenant", argv0: "/usr/local/bin/vgpu-runtime--x", err: `tenant "-x" in its name`},
		{name: "engine name as a link", argv0: "/usr/local/bin/vgpu-team-b", err: `run as "/usr/local/bin/vgpu-team-b"`},
		{name: "a wrapper script's own name", argv0: "/etc/vgpu/wrap.sh", err: `run as "/etc/vgpu/wrap.sh"`},
		{name: "no file, plain", config: missing, argv0: "/usr/local/bin/vgpu-runtime"},
		{name: "no file, tenant link", config: missing, argv0: "/usr/local/bin/vgpu-runtime-team-a", wantTenant: "team-a"},
		{name: "no file, unknown name", config: missing, argv0: "/usr/local/bin/vgpu-team-a", err: missing + " does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := &Invocation{Tenant: tc.flag, Socket: tc.socket, Config: tc.config}
			if tc.config == "" {
				inv.Config = file
			}
			err := inv.Resolve(tc.argv0, func(string) string { t.Fatal("read the environment despite --vgpu-config"); return "" })
			if tc.err != "" {
				if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Resolve(%q) = %v, want ErrInvalidArgument with %q", tc.argv0, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.argv0, err)
			}
			if inv.Tenant != tc.wantTenant || inv.RuntimeName != tc.wantRuntime || inv.Socket != tc.wantSocket || inv.StateDir != tc.wantStateDir {
				t.Fatalf("Resolve(%q): tenant %q, runtime %q, socket %q, state %q; want %q, %q, %q, %q", tc.argv0,
					inv.Tenant, inv.RuntimeName, inv.Socket, inv.StateDir, tc.wantTenant, tc.wantRuntime, tc.wantSocket, tc.wantStateDir)
			}
		})
	}
}

// The settings file's path: --vgpu-config, else the environment, else the
// default.
func TestResolveSettingsPath(t *testing.T) {
	file := writeSettings(t, settingsTOML)
	env := func(k string) string {
		if k == SettingsFileEnv {
			return file
		}
		return ""
	}
	inv := &Invocation{}
	if err := inv.Resolve("/x/rt-b", env); err != nil || inv.Tenant != "team-b" || inv.Config != file {
		t.Fatalf("from $%s: tenant %q, config %q, %v", SettingsFileEnv, inv.Tenant, inv.Config, err)
	}
	inv = &Invocation{}
	if err := inv.Resolve("vgpu-runtime", func(string) string { return "" }); err != nil || inv.Config != DefaultSettingsFile {
		t.Fatalf("default: config %q, %v", inv.Config, err)
	}
}

// A damaged settings file is an error that names it, its line and the
// bad value; every mistake at once.
func TestParseSettingsFileErrors(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []string
	}{
		{"[runtimes.vgpu]\nbinary = \n", []string{"runtime.toml:2:"}},
		{"[runtimes.vgpu]\nbinary = \"/b\"\ncolour = \"red\"\n", []string{"colour"}},
		{"[runtimes.vgpu]\nbinary = \"b\"\nsocket = \"s\"\nstate_dir = \"d\"\ntenant = \"-t\"\n",
			[]string{`binary "b"`, `socket "s"`, `state_dir "d"`, `tenant "-t"`}},
		{"[runtimes.a]\nbinary = \"/x/rt\"\n[runtimes.b]\nbinary = \"/y/rt\"\n", []string{`runtime "b": binary "/y/rt" has the same name as runtime "a"'s`}},
		{"[runtimes.\"a b\"]\nbinary = \"/x/rt\"\n", []string{`runtime "a b": a runtime name`}},
	} {
		_, err := ParseSettingsFile("/etc/vgpu/runtime.toml", []byte(tc.body))
		if !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("%q: %v, want ErrInvalidArgument", tc.body, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v; want it to say %q", tc.body, err, w)
			}
		}
	}
}

// What Encode writes, Parse reads back the same.
func TestSettingsFileRoundTrip(t *testing.T) {
	f, err := ParseSettingsFile("in", []byte(settingsTOML))
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Encode()
	if err != nil {
		t.Fatal(err)
	}
	g, err := ParseSettingsFile("out", b)
	if err != nil {
		t.Fatalf("%v:\n%s", err, b)
	}
	if len(g.Runtimes) != 3 || g.Runtimes["vgpu-team-a"] != f.Runtimes["vgpu-team-a"] || g.Runtimes["vgpu-team-b"] != f.Runtimes["vgpu-team-b"] {
		t.Fatalf("round trip: %+v, want %+v\n%s", g, f, b)
	}
}

// FuzzParseSettingsFile: no input panics the parser, and a file it
// accepts encodes to one it reads back the same.
func FuzzParseSettingsFile(f *testing.F) {
	f.Add([]byte(settingsTOML))
	f.Add([]byte("[runtimes.a]\nbinary = \"/x\"\n[runtimes.b]\nbinary = \"/y/x\"\n"))
	f.Add([]byte("runtimes = 3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sf, err := ParseSettingsFile("fuzz", data)
		if err != nil {
			if !errors.Is(err, api.ErrInvalidArgument) {
				t.Fatalf("error %v is not ErrInvalidArgument", err)
			}
			return
		}
		b, err := sf.Encode()
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseSettingsFile("encoded", b)
		if err != nil {
			t.Fatalf("an accepted file encodes to one refused: %v\n%s", err, b)
		}
		if !maps.Equal(sf.Runtimes, again.Runtimes) {
			t.Fatalf("round trip: %+v, want %+v", again.Runtimes, sf.Runtimes)
		}
	})
}
