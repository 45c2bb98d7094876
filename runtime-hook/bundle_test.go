package runtimehook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

// dockerConfig is the shape of a config.json Docker writes (abridged), with
// env and annotations to fill in.
const dockerConfig = `{"ociVersion":"1.0.2-dev","process":{"user":{"uid":0,"gid":0},"args":["sh"],"env":[%s],` +
	`"cwd":"/","capabilities":{"bounding":["CAP_CHOWN"]},"noNewPrivileges":false},"root":{"path":"/var/lib/docker/overlay2/x/merged"},` +
	`"hostname":"abc","mounts":[{"destination":"/proc","type":"proc","source":"proc","options":["nosuid","noexec","nodev"]}],` +
	`"hooks":{"prestart":[{"path":"/proc/1234/exe","args":["libnetwork-setkey","-exec-root=/var/run/docker","abc","def"]}]},` +
	`"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]},"namespaces":[{"type":"mount"},{"type":"pid"}],` +
	`"maskedPaths":["/proc/kcore"],"readonlyPaths":["/proc/sys"]}%s}`

func config(env string, annotations string) []byte {
	ann := ""
	if annotations != "" {
		ann = `,"annotations":{` + annotations + `}`
	}
	return []byte(strings.Replace(strings.Replace(dockerConfig, "%s", env, 1), "%s", ann, 1))
}

// bundle makes a bundle with config.json = cfg (mode 0600) and an
// invocation that creates container id from it.
func bundle(t *testing.T, cfg []byte, id string) (*Invocation, string) {
	t.Helper()
	dir := t.TempDir()
	b := filepath.Join(dir, "bundle")
	if err := os.Mkdir(b, 0o711); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(b, "config.json")
	if err := os.WriteFile(p, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	inv := &Invocation{
		Command:  "create",
		Root:     "/var/run/docker/runtime-runc/moby",
		Bundle:   b,
		ID:       id,
		Tenant:   "team-a",
		Socket:   "/run/vgpu/mediator.sock",
		Hook:     writeExe(t, filepath.Join(dir, "bin", "vgpu-hook")),
		StateDir: filepath.Join(dir, "state"),
	}
	return inv, p
}

func readSpec(t *testing.T, p string) *specs.Spec {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestEditBundleNoRequestIsByteIdentical(t *testing.T) {
	for _, tc := range []struct{ name, env, ann string }{
		{"plain", `"PATH=/bin"`, ""},
		{"other annotations", `"PATH=/bin","HOME=/root"`, `"io.kubernetes.pod.name":"p","org.opencontainers.image.ref":"x"`},
		{"empty values", `"VGPU_MEMORY=","PATH=/bin"`, `"vgpu.io/devices":""`},
		{"own tenant restated", `"VGPU_TENANT=team-a"`, ""},
		{"kubernetes sandbox with the pod's request", `"PATH=/bin"`,
			`"io.kubernetes.cri.container-type":"sandbox","vgpu.io/memory":"1GiB","vgpu.io/devices":"2"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Odd spacing, key order and a field specs.Spec does not know:
			// any rewrite would show.
			cfg := append(config(tc.env, tc.ann), "\n  \n"...)
			cfg = bytes.Replace(cfg, []byte(`"hostname":"abc"`), []byte(`"hostname" : "abc", "x-unknown": {"b":1, "a":2}`), 1)
			inv, p := bundle(t, cfg, "abc")
			before, _ := os.Stat(p)
			edited, err := EditBundle(inv)
			if err != nil || edited {
				t.Fatalf("EditBundle = %v, %v; want no edit", edited, err)
			}
			got, _ := os.ReadFile(p)
			if !bytes.Equal(got, cfg) {
				t.Fatalf("config.json changed:\n%s\nwas\n%s", got, cfg)
			}
			after, _ := os.Stat(p)
			if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
				t.Fatal("config.json was replaced")
			}
			if _, err := os.Stat(inv.StateDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("state directory made for a container that asked nothing: %v", err)
			}
			entries, _ := os.ReadDir(filepath.Dir(p))
			if len(entries) != 1 {
				t.Fatalf("bundle holds %d files", len(entries))
			}
		})
	}
}

func TestEditBundleRequest(t *testing.T) {
	inv, p := bundle(t, config(`"PATH=/bin","VGPU_MEMORY=2GiB","VGPU_SOCKET=/tmp/fake.sock"`, `"vgpu.io/compute":"5"`), "abc")
	edited, err := EditBundle(inv)
	if err != nil || !edited {
		t.Fatalf("EditBundle = %v, %v", edited, err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("config.json mode %v, want 0600 kept", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("bundle holds %d files; temporary file left?", len(entries))
	}
	s := readSpec(t, p)
	sockDir := filepath.Join(inv.StateDir, "moby", "abc")
	if got := s.Mounts[len(s.Mounts)-1]; got.Destination != "/run/vgpu" || got.Source != sockDir ||
		!slices.Equal(got.Options, SocketMountOptions) {
		t.Errorf("last mount %+v", got)
	}
	wantEnv := []string{"PATH=/bin", "VGPU_MEMORY=2GiB", "VGPU_SOCKET=/run/vgpu/mediator.sock", "VGPU_DEVICES=1"}
	if !slices.Equal(s.Process.Env, wantEnv) {
		t.Errorf("env %q, want %q", s.Process.Env, wantEnv)
	}
	// Docker's prestart hook (libnetwork), a deprecated field, is kept.
	if raw, _ := os.ReadFile(p); !bytes.Contains(raw, []byte(`"prestart":[{"path":"/proc/1234/exe","args":["libnetwork-setkey"`)) {
		t.Errorf("Docker's prestart hook lost: %s", raw)
	}
	if len(s.Hooks.CreateRuntime) != 1 || len(s.Hooks.Poststop) != 1 {
		t.Fatalf("hooks %+v", s.Hooks)
	}
	cr := s.Hooks.CreateRuntime[0]
	cfg, err := ParseHookArgs(cr.Args)
	if err != nil {
		t.Fatalf("the installed hook's args do not parse: %v", err)
	}
	want := HookConfig{Stage: StageCreateRuntime, Socket: "/run/vgpu/mediator.sock", Namespace: "moby", Tenant: "team-a",
		Memory: 2 << 30, Compute: 5, Devices: 1, SocketDir: sockDir, StateDir: inv.StateDir}
	if *cfg != want {
		t.Errorf("createRuntime hook %+v, want %+v", *cfg, want)
	}
	if cr.Path != inv.Hook || cr.Timeout == nil || *cr.Timeout != HookTimeout || !slices.Equal(cr.Env, HookEnv) {
		t.Errorf("createRuntime hook %+v", cr)
	}
	if s.Root.Path != "/var/lib/docker/overlay2/x/merged" || s.Linux.MaskedPaths[0] != "/proc/kcore" || s.Process.Capabilities.Bounding[0] != "CAP_CHOWN" {
		t.Errorf("settings lost in the rewrite: %+v", s)
	}
	di, err := os.Lstat(sockDir)
	if err != nil || !di.IsDir() || di.Mode().Perm() != 0o755 {
		t.Fatalf("socket directory: %v, %v", di, err)
	}

	// Created again (docker start after a stop): same result.
	before, _ := os.ReadFile(p)
	if edited, err := EditBundle(inv); err != nil || !edited {
		t.Fatalf("second EditBundle = %v, %v", edited, err)
	}
	if after, _ := os.ReadFile(p); !bytes.Equal(before, after) {
		t.Errorf("a second edit changed the spec:\n%s\n%s", before, after)
	}
}

// unwritableBundle moves inv's bundle to a path so long that config.json
// (the path plus 12 bytes) is within Linux's PATH_MAX of 4095 bytes but a
// temporary file beside it (at least 20 more) is not: WriteSpec fails,
// whoever runs the test (root ignores a read-only bundle).
func unwritableBundle(t *testing.T, inv *Invocation, cfg []byte) {
	t.Helper()
	b := t.TempDir()
	for len(b) < 4078 { // ends 4078 to 4080 bytes long
		b = filepath.Join(b, strings.Repeat("b", min(200, 4080-len(b)-1)))
	}
	if err := os.MkdirAll(b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b, "config.json"), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	inv.Bundle = b
}

// TestEditBundleFailureLeavesNoSocketDir: a create that fails never runs
// runc, so no poststop hook would remove a socket directory made for it.
func TestEditBundleFailureLeavesNoSocketDir(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       []byte
		unwritten bool // WriteSpec fails
		err       error
		msg       string
	}{
		{"spec edit refused", []byte(`{"ociVersion":"1.0.2","root":{"path":"rootfs"},"annotations":{"vgpu.io/memory":"1GiB"}}`),
			false, api.ErrInvalidArgument, "no process"},
		{"config.json not written", config(`"VGPU_MEMORY=1GiB"`, ""), true, api.ErrInternal, "file name too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, p := bundle(t, tc.cfg, "abc")
			if tc.unwritten {
				unwritableBundle(t, inv, tc.cfg)
				p = filepath.Join(inv.Bundle, "config.json")
			}
			edited, err := EditBundle(inv)
			if edited || !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("EditBundle = %v, %v; want %v naming %q", edited, err, tc.err, tc.msg)
			}
			if dir := filepath.Join(inv.StateDir, "moby", "abc"); fileExists(dir) {
				t.Errorf("socket directory %s left behind", dir)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, tc.cfg) {
				t.Errorf("config.json changed on a failure")
			}
			if entries, _ := os.ReadDir(filepath.Dir(p)); len(entries) != 1 {
				t.Errorf("bundle holds %d files; temporary file left?", len(entries))
			}
		})
	}

	// A directory that holds something (a live container's socket, should
	// the id be in use) stays.
	inv, _ := bundle(t, config(`"VGPU_MEMORY=1GiB"`, ""), "abc")
	unwritableBundle(t, inv, config(`"VGPU_MEMORY=1GiB"`, ""))
	sock := filepath.Join(inv.StateDir, "moby", "abc", vocab.SocketName)
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EditBundle(inv); !errors.Is(err, api.ErrInternal) {
		t.Fatalf("EditBundle = %v, want the write to fail", err)
	}
	if !fileExists(sock) {
		t.Errorf("a directory in use was removed")
	}
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func TestEditBundleRelativeBundle(t *testing.T) {
	inv, p := bundle(t, config(`"VGPU_DEVICES=2"`, ""), "rel")
	t.Chdir(filepath.Dir(p))
	inv.Bundle = ""
	if edited, err := EditBundle(inv); err != nil || !edited {
		t.Fatalf("EditBundle in the current directory = %v, %v", edited, err)
	}
	if s := readSpec(t, p); !slices.Contains(s.Process.Env, "VGPU_DEVICES=2") {
		t.Fatalf("env %q", s.Process.Env)
	}
}

func TestEditBundleRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   []byte
		id    string
		setup func(inv *Invocation)
		err   error
		msg   string
	}{
		{"malformed memory", config(`"VGPU_MEMORY=12X"`, ""), "abc", nil, api.ErrInvalidArgument, `env VGPU_MEMORY="12X": size "12X"`},
		{"malformed annotation", config(`"VGPU_MEMORY=1Gi"`, `"vgpu.io/devices":"two"`), "abc", nil, api.ErrInvalidArgument, `annotation vgpu.io/devices="two"`},
		{"tenant claim", config(`"VGPU_TENANT=team-b","VGPU_MEMORY=1Gi"`, ""), "abc", nil, api.ErrPermissionDenied, `env VGPU_TENANT="team-b"`},
		{"tenant claim without a request", config(`"PATH=/bin"`, `"vgpu.io/tenant":"root"`), "abc", nil, api.ErrPermissionDenied, `annotation vgpu.io/tenant="root"`},
		{"unknown field", bytes.Replace(config(`"VGPU_MEMORY=1Gi"`, ""), []byte(`"hostname":"abc"`), []byte(`"hostname":"abc","x-new":1`), 1),
			"abc", nil, api.ErrInvalidArgument, "does not know"},
		{"bad id", config(`"VGPU_MEMORY=1Gi"`, ""), "../../etc", nil, api.ErrInvalidArgument, `container id "../../etc"`},
		{"missing hook", config(`"VGPU_MEMORY=1Gi"`, ""), "abc", func(inv *Invocation) { inv.Hook = "/nonexistent/vgpu-hook" },
			api.ErrUnavailable, "/nonexistent/vgpu-hook"},
		{"socket dir is a symlink", config(`"VGPU_MEMORY=1Gi"`, ""), "abc", func(inv *Invocation) {
			os.MkdirAll(filepath.Join(inv.StateDir, "moby"), 0o755)
			os.Symlink("/etc", filepath.Join(inv.StateDir, "moby", "abc"))
		}, api.ErrPermissionDenied, "not a directory"},
		{"namespace dir is a symlink", config(`"VGPU_MEMORY=1Gi"`, ""), "abc", func(inv *Invocation) {
			os.MkdirAll(inv.StateDir, 0o755)
			os.Symlink("/etc", filepath.Join(inv.StateDir, "moby"))
		}, api.ErrPermissionDenied, "not a directory"},
		{"bad namespace", config(`"VGPU_MEMORY=1Gi"`, ""), "abc", func(inv *Invocation) { inv.Root = "/run/x/-bad" },
			api.ErrInvalidArgument, `namespace "-bad"`},
		{"not json", []byte("{"), "abc", nil, api.ErrInvalidArgument, "config.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, p := bundle(t, tc.cfg, tc.id)
			if tc.setup != nil {
				tc.setup(inv)
			}
			edited, err := EditBundle(inv)
			if edited || !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("EditBundle = %v, %v; want %v naming %q", edited, err, tc.err, tc.msg)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, tc.cfg) {
				t.Fatalf("config.json changed on a refusal")
			}
		})
	}
	inv := &Invocation{Bundle: filepath.Join(t.TempDir(), "none"), ID: "x"}
	if _, err := EditBundle(inv); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("missing bundle: %v", err)
	}
}

func TestPrepareSocketDir(t *testing.T) {
	state := filepath.Join(t.TempDir(), "a", "state")
	dir, err := PrepareSocketDir(state, "moby", "c1")
	if err != nil || dir != filepath.Join(state, "moby", "c1") {
		t.Fatalf("PrepareSocketDir = %q, %v", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := PrepareSocketDir(state, "moby", "c1"); err != nil {
		t.Fatalf("reuse: %v", err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
	// One id in another namespace, and without one, is another directory.
	for ns, want := range map[string]string{"k8s.io": filepath.Join(state, "k8s.io", "c1"), "": filepath.Join(state, vocab.NoNamespace, "c1")} {
		if got, err := PrepareSocketDir(state, ns, "c1"); err != nil || got != want {
			t.Errorf("namespace %q: PrepareSocketDir = %q, %v; want %q", ns, got, err, want)
		}
	}
	os.WriteFile(filepath.Join(state, "moby", "file"), nil, 0o644)
	if _, err := PrepareSocketDir(state, "moby", "file"); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("a file in the way: %v", err)
	}
	os.WriteFile(filepath.Join(state, "nsfile"), nil, 0o644)
	if _, err := PrepareSocketDir(state, "nsfile", "c1"); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("a file in the namespace's way: %v", err)
	}
	os.Symlink(t.TempDir(), filepath.Join(state, "nslink"))
	if _, err := PrepareSocketDir(state, "nslink", "c1"); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("a symlink in the namespace's way: %v", err)
	}
	for _, id := range []string{"", ".", "..", "a/b", "-x", ".hidden", strings.Repeat("a", 129)} {
		if _, err := PrepareSocketDir(state, "moby", id); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("id %q: %v", id, err)
		}
	}
	for _, ns := range []string{".", "..", "a/b", "-x", "_", ".hidden", "/", strings.Repeat("a", 129)} {
		_, err := PrepareSocketDir(state, ns, "c1")
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprintf("namespace %q", ns)) {
			t.Errorf("namespace %q: %v", ns, err)
		}
	}
	if _, err := PrepareSocketDir("relative", "moby", "c1"); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("relative state dir: %v", err)
	}
}

func TestReportError(t *testing.T) {
	dir := t.TempDir()
	for _, format := range []string{"json", "text", ""} {
		log := filepath.Join(dir, "log-"+format)
		os.WriteFile(log, []byte(`{"level":"info","msg":"earlier"}`+"\n"), 0o600)
		var stderr bytes.Buffer
		inv := &Invocation{Log: log, LogFormat: format}
		inv.ReportError(&stderr, errors.New(`annotation vgpu.io/memory="12X": bad`))
		if !strings.Contains(stderr.String(), `vgpu-runtime: annotation vgpu.io/memory="12X": bad`) {
			t.Errorf("stderr %q", stderr.String())
		}
		b, _ := os.ReadFile(log)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2 {
			t.Fatalf("%s log: %q", format, b)
		}
		if format == "json" {
			var line struct{ Level, Msg, Time string }
			if err := json.Unmarshal([]byte(lines[1]), &line); err != nil || line.Level != "error" ||
				line.Msg != `vgpu-runtime: annotation vgpu.io/memory="12X": bad` || line.Time == "" {
				t.Errorf("json log line %q: %+v, %v", lines[1], line, err)
			}
		} else if !strings.Contains(lines[1], "level=error") || !strings.Contains(lines[1], "vgpu.io/memory") {
			t.Errorf("text log line %q", lines[1])
		}
	}
	var stderr bytes.Buffer
	(*Invocation)(nil).ReportError(&stderr, errors.New("early"))
	if stderr.String() != "vgpu-runtime: early\n" {
		t.Errorf("stderr %q", stderr.String())
	}
}

// runc restore starts a container from a bundle and a checkpoint, which
// holds neither the container's device memory nor its sessions: a bundle
// that asks for a vGPU is refused, untouched; one that asks for nothing is
// left alone, as on create.
func TestEditBundleRestore(t *testing.T) {
	cfg := config(`"PATH=/bin","VGPU_MEMORY=1GiB"`, "")
	inv, p := bundle(t, cfg, "abc")
	inv.Command = "restore"
	edited, err := EditBundle(inv)
	if edited || !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), "abc") || !strings.Contains(fmt.Sprint(err), "restore") {
		t.Fatalf("EditBundle on restore = %v, %v; want a refusal naming the container and restore", edited, err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, cfg) {
		t.Fatal("config.json changed on a refused restore")
	}
	if _, err := os.Stat(inv.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state directory made for a refused restore: %v", err)
	}
	plain := config(`"PATH=/bin"`, "")
	inv, p = bundle(t, plain, "abc")
	inv.Command = "restore"
	if edited, err := EditBundle(inv); edited || err != nil {
		t.Fatalf("EditBundle on restore without a request = %v, %v", edited, err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, plain) {
		t.Fatal("config.json changed on a restore that asks for nothing")
	}
}

// config.json is read whole by the wrapper as by the hook, so both bound
// it: a larger one is refused, naming the bound, before it is parsed.
func TestEditBundleBoundsConfig(t *testing.T) {
	big := append(config(`"PATH=/bin","VGPU_MEMORY=1GiB"`, `"pad":"`+strings.Repeat("x", maxConfigJSON)+`"`), '\n')
	inv, _ := bundle(t, big, "abc")
	edited, err := EditBundle(inv)
	if edited || !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), fmt.Sprint(maxConfigJSON)) {
		t.Fatalf("EditBundle of a %d-byte config.json = %v, %v; want a refusal naming the bound %d", len(big), edited, err, maxConfigJSON)
	}
	if _, err := os.Stat(inv.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state directory made for a refused config.json: %v", err)
	}
}
