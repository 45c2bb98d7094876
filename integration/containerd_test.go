package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// debianConfig is /etc/containerd/config.toml as Debian 12's containerd 1.6
// package installs it.
const debianConfig = `version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
`

// othersConfig has other runtimes, unrelated settings and comments.
const othersConfig = `# containerd config, managed by hand
version = 2
root = "/var/lib/containerd"
oom_score = -999

[grpc]
  address = "/run/containerd/containerd.sock"  # the default
  max_recv_message_size = 16777216

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"

[[plugins."io.containerd.transfer.v1.local".unpack_config]]
  platform = "linux/amd64"
  snapshotter = "overlayfs"

[timeouts]
  "io.containerd.timeout.shim.cleanup" = "5s"
`

// vgpuTables is the runtime tables an install adds (under the runtimes
// table of the file's version).
func vgpuTables(binary string, systemd bool, tenants ...string) map[string]any {
	opts := func(b string) map[string]any {
		o := map[string]any{"BinaryName": b}
		if systemd {
			o["SystemdCgroup"] = true
		}
		return o
	}
	pods := func() []any { return []any{"vgpu.io/*"} }
	m := map[string]any{"vgpu": map[string]any{"runtime_type": RuncV2, "pod_annotations": pods(), "options": opts(binary)}}
	for _, t := range tenants {
		m["vgpu-"+t] = map[string]any{"runtime_type": RuncV2, "pod_annotations": pods(), "options": opts(binary + "-" + t)}
	}
	return m
}

func parse(t *testing.T, b []byte) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := toml.Unmarshal(b, &m); err != nil {
		t.Fatalf("not TOML: %v\n%s", err, b)
	}
	return m
}

// with returns doc (parsed from text) with the tables of m set under key.
func with(t *testing.T, text string, key []string, m map[string]any) map[string]any {
	t.Helper()
	doc := parse(t, []byte(text))
	for name, v := range m {
		setTable(doc, append(append([]string{}, key...), name), v.(map[string]any))
	}
	return doc
}

var v2Runtimes = []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"}

func TestInstallContainerd(t *testing.T) {
	const rp = "/usr/local/bin/vgpu-runtime"
	tests := []struct {
		name    string
		before  *string
		tenants []string
		want    func(t *testing.T) map[string]any
		// appended: the old file is a byte-identical prefix of the new one.
		// Otherwise the file was rewritten.
		appended   bool
		wantAction []string
		wantNote   string
		check      func(t *testing.T, before, after []byte)
	}{
		{
			name: "missing file",
			want: func(t *testing.T) map[string]any {
				return with(t, "version = 2", v2Runtimes, vgpuTables(rp, false))
			},
			appended:   true,
			wantAction: []string{`added runtime "vgpu": runtime_type io.containerd.runc.v2, BinaryName /usr/local/bin/vgpu-runtime`},
			check: func(t *testing.T, _, after []byte) {
				if !strings.HasPrefix(string(after), "version = 2\n\n# vgpu: ") {
					t.Errorf("new file:\n%s", after)
				}
			},
		},
		{
			name:   "empty file",
			before: ptr(""),
			want: func(t *testing.T) map[string]any {
				return with(t, "version = 2", v2Runtimes, vgpuTables(rp, false))
			},
			appended: true,
		},
		{
			name:    "comments only",
			before:  ptr("# nothing here yet\n"),
			tenants: []string{"alice"},
			want: func(t *testing.T) map[string]any {
				return with(t, "version = 2", v2Runtimes, vgpuTables(rp, false, "alice"))
			},
			appended:   true,
			wantAction: []string{`added runtime "vgpu"`, `added runtime "vgpu-alice": runtime_type io.containerd.runc.v2, BinaryName /usr/local/bin/vgpu-runtime-alice`},
			wantNote:   "ln -s /usr/local/bin/vgpu-runtime /usr/local/bin/vgpu-runtime-alice",
		},
		{
			name:    "debian default",
			before:  ptr(debianConfig),
			tenants: []string{"alice", "b.c"},
			want: func(t *testing.T) map[string]any {
				return with(t, debianConfig, v2Runtimes, vgpuTables(rp, false, "alice", "b.c"))
			},
			appended: true,
			check: func(t *testing.T, _, after []byte) {
				if !strings.Contains(string(after), `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."vgpu-b.c".options]`) {
					t.Errorf("quoted key missing:\n%s", after)
				}
			},
		},
		{
			name:    "other runtimes, settings and comments are kept; SystemdCgroup follows runc",
			before:  ptr(othersConfig),
			tenants: []string{"alice"},
			want: func(t *testing.T) map[string]any {
				return with(t, othersConfig, v2Runtimes, vgpuTables(rp, true, "alice"))
			},
			appended:   true,
			wantAction: []string{`SystemdCgroup true`, `SystemdCgroup true`},
		},
		{
			name:   "no trailing newline",
			before: ptr("version = 2\nroot = \"/x\""),
			want: func(t *testing.T) map[string]any {
				return with(t, "version = 2\nroot = \"/x\"", v2Runtimes, vgpuTables(rp, false))
			},
			appended: true,
		},
		{
			name:   "version 1",
			before: ptr("[plugins.cri]\n  sandbox_image = \"pause:3.6\"\n"),
			want: func(t *testing.T) map[string]any {
				return with(t, "[plugins.cri]\n  sandbox_image = \"pause:3.6\"\n", []string{"plugins", "cri", "containerd", "runtimes"}, vgpuTables(rp, false))
			},
			appended: true,
			check: func(t *testing.T, _, after []byte) {
				if !strings.Contains(string(after), "\n[plugins.cri.containerd.runtimes.vgpu]\n  runtime_type = \"io.containerd.runc.v2\"\n  pod_annotations = [\"vgpu.io/*\"]") {
					t.Errorf("want a version 1 table:\n%s", after)
				}
			},
		},
		{
			name:   "version 3",
			before: ptr("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n"),
			want: func(t *testing.T) map[string]any {
				return with(t, "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n",
					[]string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes"}, vgpuTables(rp, false))
			},
			appended: true,
		},
		{
			name:   "already installed",
			before: ptr(debianConfig + "\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\n  runtime_type = \"io.containerd.runc.v2\"\n  privileged_without_host_devices = false\n  pod_annotations = [\"example.com/*\", \"vgpu.io/*\"]\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu.options]\n    BinaryName = \"/usr/local/bin/vgpu-runtime\"\n    Root = \"\"\n"),
			want: func(t *testing.T) map[string]any {
				m := with(t, debianConfig, v2Runtimes, vgpuTables(rp, false))
				vg := m["plugins"].(map[string]any)["io.containerd.grpc.v1.cri"].(map[string]any)["containerd"].(map[string]any)["runtimes"].(map[string]any)["vgpu"].(map[string]any)
				vg["privileged_without_host_devices"] = false
				vg["pod_annotations"] = []any{"example.com/*", "vgpu.io/*"}
				vg["options"].(map[string]any)["Root"] = ""
				return m
			},
			appended:   true, // unchanged, trivially
			wantAction: []string{`runtime "vgpu" already in place`},
		},
		{
			// Without the pattern, the CRI drops a pod's vgpu.io/*
			// annotations: the runtime is not in place.
			name:    "pod_annotations is added, the operator's patterns kept",
			before:  ptr(debianConfig + "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\n  runtime_type = \"io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu.options]\n    BinaryName = \"/usr/local/bin/vgpu-runtime\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu-alice]\n  runtime_type = \"io.containerd.runc.v2\"\n  pod_annotations = [\"example.com/*\"]\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu-alice.options]\n    BinaryName = \"/usr/local/bin/vgpu-runtime-alice\"\n"),
			tenants: []string{"alice"},
			want: func(t *testing.T) map[string]any {
				m := with(t, debianConfig, v2Runtimes, vgpuTables(rp, false, "alice"))
				m["plugins"].(map[string]any)["io.containerd.grpc.v1.cri"].(map[string]any)["containerd"].(map[string]any)["runtimes"].(map[string]any)["vgpu-alice"].(map[string]any)["pod_annotations"] = []any{"example.com/*", "vgpu.io/*"}
				return m
			},
			wantAction: []string{
				`updated runtime "vgpu": was runtime_type = "io.containerd.runc.v2", pod_annotations = (none), options = {BinaryName = "/usr/local/bin/vgpu-runtime"}; now runtime_type io.containerd.runc.v2, BinaryName /usr/local/bin/vgpu-runtime, pod_annotations with "vgpu.io/*"`,
				`updated runtime "vgpu-alice": was runtime_type = "io.containerd.runc.v2", pod_annotations = ["example.com/*"], options = {BinaryName = "/usr/local/bin/vgpu-runtime-alice"}`,
				"parsed and written again",
			},
		},
		{
			name: "changed path is updated by a rewrite, other settings kept",
			before: ptr(othersConfig + `
# vgpu, old location
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vgpu]
  runtime_type = "io.containerd.runc.v2"
  pod_annotations = ["vgpu.io/*"]
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vgpu.options]
    BinaryName = "/opt/vgpu/vgpu-runtime"
    SystemdCgroup = true
    NoPivotRoot = true
`),
			want: func(t *testing.T) map[string]any {
				m := with(t, othersConfig, v2Runtimes, vgpuTables(rp, true))
				vg := m["plugins"].(map[string]any)["io.containerd.grpc.v1.cri"].(map[string]any)["containerd"].(map[string]any)["runtimes"].(map[string]any)["vgpu"].(map[string]any)
				vg["options"].(map[string]any)["NoPivotRoot"] = true
				return m
			},
			wantAction: []string{`updated runtime "vgpu": was runtime_type = "io.containerd.runc.v2", pod_annotations = ["vgpu.io/*"], options = {BinaryName = "/opt/vgpu/vgpu-runtime", NoPivotRoot = true, SystemdCgroup = true}; now runtime_type io.containerd.runc.v2, BinaryName /usr/local/bin/vgpu-runtime, SystemdCgroup true`, "parsed and written again"},
		},
		{
			name:   "runtime without options is updated",
			before: ptr(debianConfig + "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\n  runtime_type = \"io.containerd.runc.v1\"\n"),
			want: func(t *testing.T) map[string]any {
				return with(t, debianConfig, v2Runtimes, vgpuTables(rp, false))
			},
			wantAction: []string{`updated runtime "vgpu": was runtime_type = "io.containerd.runc.v1", pod_annotations = (none), options = (none)`},
		},
		{
			name: "inline runtimes table cannot take appended text",
			before: ptr(`version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  runtimes = { runc = { runtime_type = "io.containerd.runc.v2" } }
`),
			want: func(t *testing.T) map[string]any {
				return with(t, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\nruntime_type = \"io.containerd.runc.v2\"\n", v2Runtimes, vgpuTables(rp, false))
			},
			wantAction: []string{`added runtime "vgpu"`, "parsed and written again"},
		},
		{
			name:   "CRI disabled",
			before: ptr("version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"),
			want: func(t *testing.T) map[string]any {
				return with(t, "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n", v2Runtimes, vgpuTables(rp, false))
			},
			appended: true,
			wantNote: `the CRI plugin is disabled (disabled_plugins contains "io.containerd.grpc.v1.cri")`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "containerd", "config.toml")
			var before []byte
			if tc.before != nil {
				before = []byte(*tc.before)
				writeFile(t, path, before, 0o600)
			}
			r, err := InstallContainerd(InstallOptions{ConfigPath: path, Tenants: tc.tenants})
			if err != nil {
				t.Fatal(err)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := parse(t, after), tc.want(t); !reflect.DeepEqual(got, want) {
				t.Errorf("result %v\nwant   %v\nfile:\n%s", got, want, after)
			}
			if !bytes.Equal(r.After, after) {
				t.Errorf("Result.After differs from the file")
			}
			if tc.appended {
				if !bytes.HasPrefix(after, bytes.TrimRight(before, "\n")) || r.Rewritten || r.Backup != "" {
					t.Errorf("the old file is not kept as it was (Rewritten %v):\n%s", r.Rewritten, after)
				}
			} else {
				if !r.Rewritten {
					t.Errorf("Rewritten is false, but the file was rewritten")
				}
				if bak, err := os.ReadFile(path + ".before-vgpu"); err != nil || !bytes.Equal(bak, before) || r.Backup != path+".before-vgpu" {
					t.Errorf("backup %q: %v, %q", r.Backup, err, bak)
				} else {
					checkMode(t, r.Backup, 0o600)
				}
			}
			checkActions(t, r.Actions, tc.wantAction)
			if tc.wantNote != "" && !strings.Contains(strings.Join(r.Notes, "\n"), tc.wantNote) {
				t.Errorf("notes %q lack %q", r.Notes, tc.wantNote)
			}
			changed := tc.before == nil || !bytes.Equal(before, after)
			if r.Changed != changed || r.Written != changed || (r.Restart != "") != changed {
				t.Errorf("Changed %v Written %v Restart %q; file changed: %v", r.Changed, r.Written, r.Restart, changed)
			}
			if changed && !strings.Contains(r.Restart, "systemctl restart containerd") {
				t.Errorf("Restart = %q", r.Restart)
			}
			if tc.before != nil {
				checkMode(t, path, 0o600)
			} else {
				checkMode(t, path, 0o644)
			}
			checkNoTemp(t, filepath.Dir(path))
			if tc.check != nil {
				tc.check(t, before, after)
			}

			st1, _ := os.Stat(path)
			r2, err := InstallContainerd(InstallOptions{ConfigPath: path, Tenants: tc.tenants})
			if err != nil {
				t.Fatal(err)
			}
			if r2.Changed || r2.Written || r2.Rewritten || r2.Restart != "" {
				t.Errorf("second run: Changed %v Written %v Rewritten %v Restart %q", r2.Changed, r2.Written, r2.Rewritten, r2.Restart)
			}
			for _, a := range r2.Actions {
				if !strings.Contains(a, "already in place") {
					t.Errorf("second run action %q", a)
				}
			}
			st2, _ := os.Stat(path)
			if !os.SameFile(st1, st2) || !st1.ModTime().Equal(st2.ModTime()) {
				t.Errorf("second run touched the file")
			}
			checkContainerdLoads(t, path)
		})
	}
}

// checkContainerdLoads has the installed containerd, where there is one,
// load the file and checks that it sees the vgpu runtime.
func checkContainerdLoads(t *testing.T, path string) {
	t.Helper()
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return
	}
	doc := parse(t, mustRead(t, path))
	if v, _ := doc["version"].(int64); v == 3 {
		return // containerd 2's format; Debian's containerd 1.6 ignores it
	}
	if d, _ := doc["disabled_plugins"].([]any); len(d) > 0 {
		return // config dump leaves out disabled plugins
	}
	out, err := exec.Command(bin, "--config", path, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd config dump: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(`BinaryName = "/usr/local/bin/vgpu-runtime"`)) {
		t.Errorf("containerd does not see the vgpu runtime:\n%s", out)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestInstallContainerdErrors(t *testing.T) {
	tests := []struct {
		name     string
		before   string
		wantLine int
		wantMsg  string
	}{
		{name: "syntax error", before: "version = 2\n\n[plugins\nx = 1\n", wantLine: 3, wantMsg: "config.toml:3:"},
		{name: "bad value", before: "version = 2\nroot = /var/lib\n", wantLine: 2, wantMsg: "config.toml:2:8:"},
		{name: "duplicate key", before: "version = 2\nroot = \"a\"\nroot = \"b\"\n", wantLine: 3, wantMsg: "already defined"},
		{name: "unknown version", before: "version = 4\n", wantMsg: "config version 4 is not one vgpu knows"},
		{name: "version not a number", before: "version = \"2\"\n", wantMsg: "version is 2 (string), want an integer"},
		{name: "runtimes not a table", before: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = 1\n", wantMsg: `plugins."io.containerd.grpc.v1.cri".containerd.runtimes is int64, want a table`},
		{name: "pod_annotations not an array", before: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\npod_annotations = \"vgpu.io/*\"\n", wantMsg: `runtimes.vgpu.pod_annotations is "vgpu.io/*" (string), want an array of strings`},
		{name: "pod_annotations not strings", before: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\npod_annotations = [\"a/*\", 1]\n", wantMsg: `runtimes.vgpu.pod_annotations holds 1 (int64), want strings`},
		{name: "vgpu options not a table", before: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\noptions = \"x\"\n", wantMsg: `runtimes.vgpu.options is string, want a table`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			writeFile(t, path, []byte(tc.before), 0o644)
			_, err := InstallContainerd(InstallOptions{ConfigPath: path})
			checkConfigError(t, err, path, tc.wantLine, tc.wantMsg)
			if got, _ := os.ReadFile(path); string(got) != tc.before {
				t.Errorf("file changed on error:\n%s", got)
			}
		})
	}
}

func TestInstallContainerdDryRun(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing", "config.toml")
	r, err := InstallContainerd(InstallOptions{ConfigPath: missing, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Changed || r.Written || r.Existed || len(r.After) == 0 || r.Restart == "" {
		t.Errorf("dry run on a missing file: %+v", r)
	}
	if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
		t.Errorf("dry run created the directory: %v", err)
	}
	if d := r.Diff(); !strings.HasPrefix(d, "--- /dev/null\n+++ "+missing+"\n@@ -0,0 +1,") {
		t.Errorf("diff of a new file:\n%s", d)
	}

	// Append and rewrite, both dry.
	for _, before := range []string{debianConfig, debianConfig + "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\n  runtime_type = \"x\"\n"} {
		path := filepath.Join(dir, "config.toml")
		writeFile(t, path, []byte(before), 0o644)
		st1, _ := os.Stat(path)
		r, err := InstallContainerd(InstallOptions{ConfigPath: path, DryRun: true, Tenants: []string{"alice"}})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Changed || r.Written || r.Backup != "" {
			t.Errorf("dry run: %+v", r)
		}
		st2, _ := os.Stat(path)
		if got := mustRead(t, path); string(got) != before || !st1.ModTime().Equal(st2.ModTime()) {
			t.Errorf("dry run changed the file")
		}
		if _, err := os.Stat(path + ".before-vgpu"); !os.IsNotExist(err) {
			t.Errorf("dry run wrote a backup")
		}
		d := r.Diff()
		if !regexp.MustCompile(`\n\+ *BinaryName = ["']/usr/local/bin/vgpu-runtime-alice["']\n`).MatchString(d) {
			t.Errorf("diff:\n%s", d)
		}
		checkNoTemp(t, dir)
	}
}

// TestInstallContainerdNaN: "x = nan" is valid TOML, and reflect.DeepEqual
// finds NaN unequal to itself, so every install into such a file failed
// with "rewriting the file would change other settings" (found by
// FuzzEditConfigTOML). Both ways of editing must take it.
func TestInstallContainerdNaN(t *testing.T) {
	rts, err := Runtimes("", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		before    string
		rewritten bool
	}{
		{before: "version = 2\nx = nan\n"},
		{before: "version = 2\nx = [-nan]\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\nruntime_type = \"io.containerd.runc.v1\"\n", rewritten: true},
	} {
		e, err := editConfigTOML("config.toml", []byte(tc.before), rts)
		if err != nil {
			t.Fatalf("%q: %v", tc.before, err)
		}
		doc := parse(t, e.after)
		vg, _ := table("", doc, append(slices.Clone(v2Runtimes), "vgpu", "options"))
		if e.rewritten != tc.rewritten || vg["BinaryName"] != DefaultRuntimePath {
			t.Errorf("%q: rewritten %v, vgpu options %v:\n%s", tc.before, e.rewritten, vg, e.after)
		}
		if !sameTOML(doc["x"], parse(t, []byte(tc.before))["x"]) {
			t.Errorf("%q: x is %v now:\n%s", tc.before, doc["x"], e.after)
		}
	}
}
