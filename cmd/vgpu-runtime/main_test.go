package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api/vocab"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

// binDir holds vgpu-runtime and vgpu-hook side by side, built static, as
// they are installed.
var binDir string

func TestMain(m *testing.M) {
	var err error
	binDir, err = os.MkdirTemp("", "vgpu-runtime-test")
	if err != nil {
		panic(err)
	}
	cmd := exec.Command("go", "build", "-o", binDir+"/", "github.com/vgpu/vgpu/cmd/vgpu-runtime", "github.com/vgpu/vgpu/cmd/vgpu-hook")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.RemoveAll(binDir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}

// fakeRuntime is a runtime that records its arguments, one a line, and its
// working directory, prints a line and exits with $FAKE_EXIT.
const fakeRuntime = `#!/bin/sh
for a in "$@"; do printf '%s\n' "$a"; done > "$VGPU_TEST_RECORD"
pwd > "$VGPU_TEST_RECORD.cwd"
echo "fake runc ran"
exit "${FAKE_EXIT:-0}"
`

type env struct {
	dir, runtime, record, state, root, log string
	settings                               string // $VGPU_RUNTIME_CONFIG: absent unless a test writes it
}

func newEnv(t *testing.T) *env {
	t.Helper()
	d := t.TempDir()
	e := &env{
		dir:      d,
		runtime:  filepath.Join(d, "fake-runc"),
		record:   filepath.Join(d, "argv"),
		state:    filepath.Join(d, "state"),
		root:     filepath.Join(d, "runtime-runc", "moby"),
		log:      filepath.Join(d, "log.json"),
		settings: filepath.Join(d, "runtime.toml"),
	}
	if err := os.WriteFile(e.runtime, []byte(fakeRuntime), 0o755); err != nil {
		t.Fatal(err)
	}
	return e
}

// run runs the wrapper with args and returns its exit status and output.
func (e *env) run(t *testing.T, exit int, args ...string) (int, string) {
	t.Helper()
	return e.runAs(t, filepath.Join(binDir, "vgpu-runtime"), exit, args...)
}

// runAs runs the wrapper as argv0 (a link to it, or its own path).
func (e *env) runAs(t *testing.T, argv0 string, exit int, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(argv0, args...)
	cmd.Env = append(os.Environ(), "VGPU_TEST_RECORD="+e.record, fmt.Sprintf("FAKE_EXIT=%d", exit),
		runtimehook.SettingsFileEnv+"="+e.settings)
	cmd.Dir = e.dir
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("run vgpu-runtime: %v", err)
	return -1, ""
}

// recorded returns the arguments the fake runtime got, or nil if it did not run.
func (e *env) recorded(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(e.record)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// docker returns runc's global flags the way dockerd passes them.
func (e *env) docker() []string {
	return []string{"--root", e.root, "--log", e.log, "--log-format", "json"}
}

func (e *env) bundle(t *testing.T, cfg string) (string, []byte) {
	t.Helper()
	b := filepath.Join(e.dir, "bundle")
	os.MkdirAll(filepath.Join(b, "rootfs"), 0o755)
	if err := os.WriteFile(filepath.Join(b, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return b, []byte(cfg)
}

func specJSON(env []string, annotations map[string]string) string {
	s := specs.Spec{
		Version:     specs.Version,
		Process:     &specs.Process{Args: []string{"sh"}, Env: env, Cwd: "/"},
		Root:        &specs.Root{Path: "rootfs"},
		Hostname:    "c",
		Mounts:      []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Annotations: annotations,
	}
	b, _ := json.MarshalIndent(s, "", "\t") // not the wrapper's encoding: a rewrite shows
	return string(b)
}

func TestPassThrough(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(e *env) []string
		exit int
	}{
		{"start", func(e *env) []string { return append(e.docker(), "start", "abc") }, 0},
		{"state", func(e *env) []string { return append(e.docker(), "state", "abc") }, 0},
		{"exec", func(e *env) []string {
			return append(e.docker(), "exec", "--process", "/tmp/runc-process1", "--detach", "--pid-file", "/run/p.pid", "abc")
		}, 0},
		{"exec with a command", func(e *env) []string {
			return append(e.docker(), "exec", "-t", "abc", "sh", "-c", "echo --vgpu-tenant x", "--vgpu-tenant", "y")
		}, 0},
		{"ps", func(e *env) []string { return append(e.docker(), "ps", "--format", "json", "abc") }, 0},
		{"kill", func(e *env) []string { return append(e.docker(), "kill", "abc", "9") }, 0},
		{"kill fails", func(e *env) []string { return append(e.docker(), "kill", "--all", "abc", "SIGKILL") }, 3},
		{"delete", func(e *env) []string { return append(e.docker(), "delete", "--force", "abc") }, 0},
		{"systemd cgroups, then create asking nothing", func(e *env) []string {
			return append(e.docker(), "--systemd-cgroup", "create", "--bundle", filepath.Join(e.dir, "bundle"), "--pid-file", "/run/p.pid", "abc")
		}, 0},
		{"features", func(e *env) []string { return []string{"features"} }, 0},
		{"version", func(e *env) []string { return []string{"--version"} }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			_, cfg := e.bundle(t, specJSON([]string{"PATH=/bin"}, nil))
			args := tc.args(e)
			// Wrapper flags as daemon.json's runtimeArgs put them (first),
			// and in both spellings.
			full := append([]string{"--vgpu-runtime", e.runtime, "--vgpu-tenant=team-a", "--vgpu-state", e.state}, args...)
			code, out := e.run(t, tc.exit, full...)
			if code != tc.exit {
				t.Fatalf("exit %d, want %d; output %q", code, tc.exit, out)
			}
			if !strings.Contains(out, "fake runc ran") {
				t.Errorf("output %q: the runtime's stdout did not come through", out)
			}
			if got := e.recorded(t); !slices.Equal(got, args) {
				t.Fatalf("runtime got\n %q\nwant\n %q", got, args)
			}
			if cwd, _ := os.ReadFile(e.record + ".cwd"); strings.TrimSpace(string(cwd)) != e.dir {
				t.Errorf("runtime ran in %q, want %q", cwd, e.dir)
			}
			if got, _ := os.ReadFile(filepath.Join(e.dir, "bundle", "config.json")); !bytes.Equal(got, cfg) {
				t.Errorf("config.json changed")
			}
			if _, err := os.Stat(e.state); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("state directory made: %v", err)
			}
		})
	}
}

func TestCreateWithRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		relBundle bool // the containerd shim's shape: no --bundle, run in the bundle
	}{{"docker", false}, {"current directory", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			b, _ := e.bundle(t, specJSON([]string{"PATH=/bin", "VGPU_MEMORY=2GiB"}, map[string]string{"vgpu.io/compute": "3"}))
			args := append(e.docker(), "create", "--bundle", b, "--pid-file", "/run/p.pid", "ctr1")
			if tc.relBundle {
				e.dir = b
				args = []string{"--root", e.root, "--log", e.log, "create", "--pid-file", "/run/p.pid", "ctr1"}
			}
			full := append([]string{"--vgpu-tenant", "team-a", "--vgpu-runtime=" + e.runtime}, args...)
			full = append(full, "--vgpu-state", e.state)
			code, out := e.run(t, 0, full...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, out)
			}
			if got := e.recorded(t); !slices.Equal(got, args) {
				t.Fatalf("runtime got\n %q\nwant\n %q", got, args)
			}
			raw, _ := os.ReadFile(filepath.Join(b, "config.json"))
			var s specs.Spec
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
			sockDir := filepath.Join(e.state, "moby", "ctr1")
			if fi, err := os.Lstat(sockDir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
				t.Fatalf("socket directory: %v, %v", fi, err)
			}
			if m := s.Mounts[len(s.Mounts)-1]; m.Destination != vocab.InContainerSocketDir || m.Source != sockDir {
				t.Errorf("mount %+v", m)
			}
			if !slices.Contains(s.Process.Env, "VGPU_SOCKET=/run/vgpu/mediator.sock") || !slices.Contains(s.Process.Env, "VGPU_DEVICES=1") {
				t.Errorf("env %q", s.Process.Env)
			}
			if s.Hooks == nil || len(s.Hooks.CreateRuntime) != 1 || len(s.Hooks.Poststop) != 1 {
				t.Fatalf("hooks %+v", s.Hooks)
			}
			h := s.Hooks.CreateRuntime[0]
			if h.Path != filepath.Join(binDir, "vgpu-hook") {
				t.Errorf("hook path %q, want vgpu-hook next to vgpu-runtime", h.Path)
			}
			cfg, err := runtimehook.ParseHookArgs(h.Args)
			if err != nil {
				t.Fatal(err)
			}
			want := runtimehook.HookConfig{Stage: runtimehook.StageCreateRuntime, Socket: runtimehook.DefaultOperatorSocket,
				Namespace: "moby", Tenant: "team-a", Memory: 2 << 30, Compute: 3, Devices: 1, SocketDir: sockDir, StateDir: e.state}
			if *cfg != want {
				t.Errorf("hook config %+v, want %+v", *cfg, want)
			}
			if !slices.Equal(h.Env, runtimehook.HookEnv) || h.Timeout == nil || *h.Timeout != runtimehook.HookTimeout {
				t.Errorf("hook env %q, timeout %v", h.Env, h.Timeout)
			}
		})
	}
}

func TestCreateRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		ann    map[string]string
		tenant string
		msg    string
	}{
		{"malformed annotation", []string{"PATH=/bin"}, map[string]string{"vgpu.io/memory": "12X"}, "team-a", `annotation vgpu.io/memory="12X": size "12X"`},
		{"malformed env", []string{"VGPU_DEVICES=many"}, nil, "team-a", `env VGPU_DEVICES="many"`},
		{"another tenant", []string{"VGPU_TENANT=team-b", "VGPU_MEMORY=1Gi"}, nil, "team-a", `env VGPU_TENANT="team-b"`},
		{"a tenant where the operator set none", []string{"VGPU_MEMORY=1Gi"}, map[string]string{"vgpu.io/tenant": "team-b"}, "",
			`annotation vgpu.io/tenant="team-b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			b, cfg := e.bundle(t, specJSON(tc.env, tc.ann))
			args := []string{"--vgpu-runtime", e.runtime, "--vgpu-state", e.state}
			if tc.tenant != "" {
				args = append(args, "--vgpu-tenant", tc.tenant)
			}
			args = append(append(args, e.docker()...), "create", "--bundle", b, "ctr1")
			code, out := e.run(t, 0, args...)
			if code == 0 || !strings.Contains(out, "vgpu-runtime: container ctr1: "+tc.msg) {
				t.Fatalf("exit %d, output %q; want a refusal naming %q", code, out, tc.msg)
			}
			if got := e.recorded(t); got != nil {
				t.Fatalf("the runtime ran: %q", got)
			}
			if got, _ := os.ReadFile(filepath.Join(b, "config.json")); !bytes.Equal(got, cfg) {
				t.Errorf("config.json changed")
			}
			log, _ := os.ReadFile(e.log)
			var line struct{ Level, Msg string }
			if err := json.Unmarshal(bytes.TrimSpace(log), &line); err != nil || line.Level != "error" || !strings.Contains(line.Msg, tc.msg) {
				t.Errorf("runc log %q: %+v, %v", log, line, err)
			}
		})
	}
}

// runc restore starts a container from a bundle too: one that asks for a
// vGPU is refused before runc runs (a checkpoint holds neither its device
// memory nor its sessions); one that asks for nothing passes through.
func TestRestore(t *testing.T) {
	e := newEnv(t)
	b, cfg := e.bundle(t, specJSON([]string{"VGPU_MEMORY=1Gi"}, nil))
	args := append(append([]string{"--vgpu-runtime", e.runtime, "--vgpu-state", e.state, "--vgpu-tenant", "team-a"}, e.docker()...),
		"restore", "--image-path", "/img", "--bundle", b, "--detach", "ctr1")
	code, out := e.run(t, 0, args...)
	if code == 0 || !strings.Contains(out, "vgpu-runtime: container ctr1: ") || !strings.Contains(out, "restore") {
		t.Fatalf("exit %d, output %q; want a refusal of the restore", code, out)
	}
	if got := e.recorded(t); got != nil {
		t.Fatalf("the runtime ran: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(b, "config.json")); !bytes.Equal(got, cfg) {
		t.Errorf("config.json changed")
	}
	_, cfg = e.bundle(t, specJSON([]string{"PATH=/bin"}, nil))
	if code, out := e.run(t, 0, args...); code != 0 {
		t.Fatalf("restore without a request: exit %d, output %q", code, out)
	}
	if got := e.recorded(t); !slices.Equal(got, args[6:]) {
		t.Fatalf("the runtime got %q, want %q", got, args[6:])
	}
	if got, _ := os.ReadFile(filepath.Join(b, "config.json")); !bytes.Equal(got, cfg) {
		t.Errorf("config.json changed on a restore that asks for nothing")
	}
}

func TestWrapperErrors(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--vgpu-runtime", filepath.Join(e.dir, "missing"), "state", "x"}, "no such file"},
		{[]string{"--vgpu-runtime", filepath.Join(binDir, "vgpu-runtime"), "state", "x"}, "this wrapper itself"},
		{[]string{"--vgpu-tenant"}, "needs a value"},
		{[]string{"--vgpu-colour", "red", "state", "x"}, "unknown wrapper flag --vgpu-colour"},
	} {
		code, out := e.run(t, 0, tc.args...)
		if code == 0 || !strings.Contains(out, tc.msg) {
			t.Errorf("%q: exit %d, output %q; want %q", tc.args, code, out, tc.msg)
		}
	}
}

// TestTenantFromSymlink: containerd's shim runs vgpu-runtime-<tenant>, a
// symlink, with no way to pass --vgpu-tenant; the name fixes the tenant.
func TestTenantFromSymlink(t *testing.T) {
	e := newEnv(t)
	link := filepath.Join(e.dir, "vgpu-runtime-team-b")
	if err := os.Symlink(filepath.Join(binDir, "vgpu-runtime"), link); err != nil {
		t.Fatal(err)
	}
	b, _ := e.bundle(t, specJSON([]string{"VGPU_DEVICES=1"}, nil))
	args := []string{"--root", filepath.Join(e.dir, "k8s.io"), "create", "--bundle", b, "ctr1"}
	cmd := exec.Command(link, append([]string{"--vgpu-runtime", e.runtime, "--vgpu-state", e.state}, args...)...)
	cmd.Env = append(os.Environ(), "VGPU_TEST_RECORD="+e.record, runtimehook.SettingsFileEnv+"="+e.settings)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := e.recorded(t); !slices.Equal(got, args) {
		t.Fatalf("runtime got %q, want %q", got, args)
	}
	s, cfg := createRuntimeHook(t, b)
	if cfg.Tenant != "team-b" || cfg.Namespace != "k8s.io" {
		t.Fatalf("hook config %+v, want tenant team-b in namespace k8s.io", cfg)
	}
	if s.Hooks.CreateRuntime[0].Path != filepath.Join(binDir, "vgpu-hook") {
		t.Fatalf("hook %q: want the one next to the real executable", s.Hooks.CreateRuntime[0].Path)
	}

	// The name and the flag disagree: refused.
	cmd = exec.Command(link, append([]string{"--vgpu-runtime", e.runtime, "--vgpu-tenant", "team-a"}, args...)...)
	cmd.Env = append(os.Environ(), runtimehook.SettingsFileEnv+"="+e.settings)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), `serves tenant "team-b" by its name`) {
		t.Fatalf("err %v, output %q", err, out)
	}
}

// createRuntimeHook returns the spec the wrapper left in bundle b and the
// configuration of its createRuntime hook.
func createRuntimeHook(t *testing.T, b string) (*specs.Spec, *runtimehook.HookConfig) {
	t.Helper()
	raw, _ := os.ReadFile(filepath.Join(b, "config.json"))
	var s specs.Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	if s.Hooks == nil || len(s.Hooks.CreateRuntime) == 0 {
		t.Fatalf("no createRuntime hook in %s", b)
	}
	cfg, err := runtimehook.ParseHookArgs(s.Hooks.CreateRuntime[0].Args)
	if err != nil {
		t.Fatal(err)
	}
	return &s, cfg
}

// TestSettingsFileByName: with no flag but the real runtime's path, a link
// named as a runtime of the settings file gets that runtime's tenant,
// socket and state directory (what containerd's BinaryName cannot pass).
// A link under a name the file does not know (the engine's runtime name,
// vgpu-team-b) refuses to create, naming argv[0], and runs nothing; it
// still passes the commands that need no tenant through.
func TestSettingsFileByName(t *testing.T) {
	e := newEnv(t)
	link := filepath.Join(e.dir, "rt-team-c")
	stranger := filepath.Join(e.dir, "vgpu-team-b")
	for _, l := range []string{link, stranger} {
		if err := os.Symlink(filepath.Join(binDir, "vgpu-runtime"), l); err != nil {
			t.Fatal(err)
		}
	}
	settings := fmt.Sprintf("[runtimes.vgpu-team-c]\nbinary = %q\ntenant = \"team-c\"\nsocket = \"/run/m-c.sock\"\nstate_dir = %q\n", link, e.state)
	if err := os.WriteFile(e.settings, []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := e.bundle(t, specJSON([]string{"VGPU_MEMORY=1GiB"}, nil))
	args := []string{"--root", filepath.Join(e.dir, "k8s.io"), "create", "--bundle", b, "ctr1"}
	if code, out := e.runAs(t, link, 0, append([]string{"--vgpu-runtime", e.runtime}, args...)...); code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	if got := e.recorded(t); !slices.Equal(got, args) {
		t.Fatalf("runtime got %q, want %q", got, args)
	}
	_, cfg := createRuntimeHook(t, b)
	if cfg.Tenant != "team-c" || cfg.Socket != "/run/m-c.sock" || cfg.StateDir != e.state {
		t.Fatalf("hook config %+v, want tenant team-c, socket /run/m-c.sock, state %s from the settings file", cfg, e.state)
	}

	os.Remove(e.record)
	b, orig := e.bundle(t, specJSON([]string{"VGPU_MEMORY=1GiB"}, nil))
	code, out := e.runAs(t, stranger, 0, append([]string{"--vgpu-runtime", e.runtime}, args...)...)
	if code == 0 || !strings.Contains(out, fmt.Sprintf("run as %q", stranger)) || !strings.Contains(out, "refusing to create the container") {
		t.Fatalf("create as %s: exit %d, output %q; want a refusal naming it", stranger, code, out)
	}
	if got := e.recorded(t); got != nil {
		t.Fatalf("the real runtime ran: %q", got)
	}
	if raw, _ := os.ReadFile(filepath.Join(b, "config.json")); !bytes.Equal(raw, orig) {
		t.Fatalf("config.json changed by a refused create")
	}
	state := []string{"--root", filepath.Join(e.dir, "k8s.io"), "state", "ctr1"}
	if code, out := e.runAs(t, stranger, 0, append([]string{"--vgpu-runtime", e.runtime}, state...)...); code != 0 || !slices.Equal(e.recorded(t), state) {
		t.Fatalf("state as %s: exit %d, ran %q: %s", stranger, code, e.recorded(t), out)
	}
}

// A lone --help is the wrapper's and runs nothing; --help with a command
// is the real runtime's, passed on unchanged.
func TestHelpIsOnlyALoneFlag(t *testing.T) {
	e := newEnv(t)
	for _, h := range []string{"--help", "-h"} {
		code, out := e.run(t, 0, "--vgpu-runtime", e.runtime, h)
		if code != 0 || !strings.HasPrefix(out, "usage: vgpu-runtime") || e.recorded(t) != nil {
			t.Errorf("%s: exit %d, ran %v:\n%s", h, code, e.recorded(t), out)
		}
	}
	code, out := e.run(t, 0, "--vgpu-runtime", e.runtime, "state", "--help")
	if got := e.recorded(t); code != 0 || strings.Join(got, " ") != "state --help" || strings.Contains(out, "usage: vgpu-runtime") {
		t.Errorf("state --help: exit %d, runtime got %v:\n%s", code, got, out)
	}
}
