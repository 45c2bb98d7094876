package integration

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
)

const dockerOthers = `{
    "log-driver": "journald",
    "runtimes": {
        "runsc": {
            "path": "/usr/local/bin/runsc",
            "runtimeArgs": ["--platform=ptrace"]
        }
    },
    "default-runtime": "runc",
    "max-concurrent-downloads": 3,
    "x-unknown": {"nested": [1, 2.50, 1e3, 12345678901234567890, "a<b>&\u00e9"]}
}
`

// decodeJSON decodes a daemon.json for comparisons.
func decodeJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("result is not JSON: %v\n%s", err, b)
	}
	return m
}

func vgpuDocker(path string, tenants ...string) map[string]any {
	rts := map[string]any{"vgpu": map[string]any{"path": path}}
	for _, t := range tenants {
		rts["vgpu-"+t] = map[string]any{"path": path, "runtimeArgs": []any{"--vgpu-tenant", t}}
	}
	return rts
}

func TestInstallDocker(t *testing.T) {
	const rp = "/usr/local/bin/vgpu-runtime"
	tests := []struct {
		name    string
		before  *string // nil: no file
		mode    os.FileMode
		tenants []string
		// want is the whole decoded result.
		want       map[string]any
		wantAction []string // substrings, one per runtime
		check      func(t *testing.T, before, after []byte)
	}{
		{
			name: "missing file",
			want: map[string]any{"runtimes": vgpuDocker(rp)},
			check: func(t *testing.T, _, after []byte) {
				if want := "{\n  \"runtimes\": {\n    \"vgpu\": {\n      \"path\": \"/usr/local/bin/vgpu-runtime\"\n    }\n  }\n}\n"; string(after) != want {
					t.Errorf("new file:\n%s\nwant:\n%s", after, want)
				}
			},
			wantAction: []string{`added runtime "vgpu"`},
		},
		{
			name:       "empty file",
			before:     ptr(""),
			want:       map[string]any{"runtimes": vgpuDocker(rp)},
			wantAction: []string{`added runtime "vgpu"`},
		},
		{
			name:       "blank file",
			before:     ptr(" \n\n"),
			want:       map[string]any{"runtimes": vgpuDocker(rp)},
			wantAction: []string{`added runtime "vgpu"`},
		},
		{
			name:       "empty object",
			before:     ptr("{}"),
			tenants:    []string{"alice", "bob.x"},
			want:       map[string]any{"runtimes": vgpuDocker(rp, "alice", "bob.x")},
			wantAction: []string{`added runtime "vgpu"`, `added runtime "vgpu-alice"`, `added runtime "vgpu-bob.x"`},
		},
		{
			name:    "other runtimes and settings are kept",
			before:  ptr(dockerOthers),
			mode:    0o600,
			tenants: []string{"alice"},
			want: func() map[string]any {
				var m map[string]any
				json.Unmarshal([]byte(dockerOthers), &m)
				maps := m["runtimes"].(map[string]any)
				for k, v := range vgpuDocker(rp, "alice") {
					maps[k] = v
				}
				return m
			}(),
			wantAction: []string{`added runtime "vgpu"`, `added runtime "vgpu-alice"`},
			check: func(t *testing.T, _, after []byte) {
				s := string(after)
				// Key order, number literals and unescaped text survive;
				// the file's 4-space indentation is kept.
				order := []string{`"log-driver"`, `"runtimes"`, `"runsc"`, `"vgpu"`, `"vgpu-alice"`, `"default-runtime"`, `"max-concurrent-downloads"`, `"x-unknown"`}
				last := -1
				for _, k := range order {
					i := strings.Index(s, k)
					if i < last {
						t.Errorf("key %s out of order in\n%s", k, s)
					}
					last = i
				}
				for _, lit := range []string{"2.50", "1e3", "12345678901234567890", `"a<b>&\u00e9"`, "\n    \"log-driver\""} {
					if !strings.Contains(s, lit) {
						t.Errorf("%q lost in\n%s", lit, s)
					}
				}
			},
		},
		{
			name:       "already installed",
			before:     ptr(`{"runtimes": {"vgpu": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": []}}, "debug": true}`),
			want:       map[string]any{"debug": true, "runtimes": map[string]any{"vgpu": map[string]any{"path": rp, "runtimeArgs": []any{}}}},
			wantAction: []string{`runtime "vgpu" already in place`},
		},
		{
			name:   "changed path is updated, other members kept",
			before: ptr(`{"runtimes": {"vgpu": {"x-note": 1, "path": "/opt/old/vgpu-runtime", "runtimeArgs": ["--vgpu-tenant", "old"]}, "runc": {"path": "runc"}}}`),
			want: map[string]any{"runtimes": map[string]any{
				"vgpu": map[string]any{"x-note": 1.0, "path": rp},
				"runc": map[string]any{"path": "runc"},
			}},
			wantAction: []string{`updated runtime "vgpu": was path "/opt/old/vgpu-runtime", runtimeArgs ["--vgpu-tenant","old"], now path /usr/local/bin/vgpu-runtime`},
		},
		{
			// dockerd refuses "path" beside "runtimeType" or "options".
			name: "runtimeType and options are removed beside path",
			before: ptr(`{"runtimes": {
				"vgpu": {"runtimeType": "io.containerd.runc.v2", "x-note": 1, "path": "/usr/local/bin/vgpu-runtime", "options": {"BinaryName": "/usr/local/bin/vgpu-runtime"}},
				"vgpu-alice": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": ["--vgpu-tenant", "alice"], "runtimeType": ""},
				"vgpu-bob": {"runtimeType": "io.containerd.runsc.v1", "options": {"TypeUrl": "io.containerd.runsc.v1.options"}}}}`),
			tenants: []string{"alice", "bob"},
			want: map[string]any{"runtimes": map[string]any{
				"vgpu":       map[string]any{"x-note": 1.0, "path": rp},
				"vgpu-alice": map[string]any{"path": rp, "runtimeArgs": []any{"--vgpu-tenant", "alice"}},
				"vgpu-bob":   map[string]any{"path": rp, "runtimeArgs": []any{"--vgpu-tenant", "bob"}},
			}},
			wantAction: []string{
				`updated runtime "vgpu": was path "/usr/local/bin/vgpu-runtime", now path /usr/local/bin/vgpu-runtime; removed "runtimeType": "io.containerd.runc.v2", "options": {"BinaryName":"/usr/local/bin/vgpu-runtime"}: dockerd refuses them beside "path"`,
				`updated runtime "vgpu-alice": was path "/usr/local/bin/vgpu-runtime", runtimeArgs ["--vgpu-tenant","alice"], now path /usr/local/bin/vgpu-runtime, runtimeArgs ["--vgpu-tenant","alice"]; removed "runtimeType": ""`,
				`updated runtime "vgpu-bob": was path null, now path /usr/local/bin/vgpu-runtime, runtimeArgs ["--vgpu-tenant","bob"]; removed "runtimeType": "io.containerd.runsc.v1", "options": {"TypeUrl":"io.containerd.runsc.v1.options"}`,
			},
		},
		{
			// dockerd decodes a runtime's members with encoding/json, which
			// matches field names case insensitively: "PATH" is its path and
			// "RuntimeType" its runtimeType. Before, "path" was added beside
			// "PATH" (dockerd read the old one) and every run said updated.
			name: "members are matched as dockerd matches them",
			before: ptr(`{"runtimes": {
				"vgpu": {"PATH": "/opt/old/vgpu-runtime", "RuntimeType": "io.containerd.runc.v2", "Options": {}},
				"vgpu-alice": {"pAth": "/usr/local/bin/vgpu-runtime", "RuntimeArgs": ["--vgpu-tenant", "alice"]}}}`),
			tenants: []string{"alice"},
			want: map[string]any{"runtimes": map[string]any{
				"vgpu":       map[string]any{"path": rp},
				"vgpu-alice": map[string]any{"pAth": rp, "RuntimeArgs": []any{"--vgpu-tenant", "alice"}},
			}},
			wantAction: []string{
				`updated runtime "vgpu": was path "/opt/old/vgpu-runtime", now path /usr/local/bin/vgpu-runtime; removed "RuntimeType": "io.containerd.runc.v2", "Options": {}: dockerd refuses them beside "path"`,
				`runtime "vgpu-alice" already in place`,
			},
		},
		{
			// Only the --vgpu-tenant pair is the installer's; both forms
			// of it are recognised.
			name: "the operator's runtimeArgs are kept",
			before: ptr(`{"runtimes": {
				"vgpu": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": ["--vgpu-socket", "/run/x.sock", "--vgpu-tenant=bob", "--vgpu-state=/run/s"]},
				"vgpu-alice": {"path": "/opt/old", "runtimeArgs": ["--vgpu-hook=/opt/hook", "--vgpu-tenant", "bob", "--vgpu-runtime", "/usr/bin/crun", "--vgpu-tenant=carol"]},
				"vgpu-bob": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": ["--vgpu-socket=/run/y.sock"]},
				"vgpu-carol": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": ["--vgpu-tenant=carol", "--vgpu-state", "/s"]}}}`),
			tenants: []string{"alice", "bob", "carol"},
			want: map[string]any{"runtimes": map[string]any{
				"vgpu":       map[string]any{"path": rp, "runtimeArgs": []any{"--vgpu-socket", "/run/x.sock", "--vgpu-state=/run/s"}},
				"vgpu-alice": map[string]any{"path": rp, "runtimeArgs": []any{"--vgpu-hook=/opt/hook", "--vgpu-tenant", "alice", "--vgpu-runtime", "/usr/bin/crun"}},
				"vgpu-bob":   map[string]any{"path": rp, "runtimeArgs": []any{"--vgpu-socket=/run/y.sock", "--vgpu-tenant", "bob"}},
				"vgpu-carol": map[string]any{"path": rp, "runtimeArgs": []any{"--vgpu-tenant=carol", "--vgpu-state", "/s"}},
			}},
			wantAction: []string{
				`updated runtime "vgpu": was path "/usr/local/bin/vgpu-runtime", runtimeArgs ["--vgpu-socket","/run/x.sock","--vgpu-tenant=bob","--vgpu-state=/run/s"], now path /usr/local/bin/vgpu-runtime, runtimeArgs ["--vgpu-socket","/run/x.sock","--vgpu-state=/run/s"]`,
				`updated runtime "vgpu-alice"`,
				`updated runtime "vgpu-bob"`,
				`runtime "vgpu-carol" already in place: path /usr/local/bin/vgpu-runtime, runtimeArgs ["--vgpu-tenant=carol","--vgpu-state","/s"]`,
			},
		},
		{
			name: "runtimeArgs that is not a list of strings is replaced",
			before: ptr(`{"runtimes": {
				"vgpu": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": [1]},
				"vgpu-alice": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": "--vgpu-tenant alice"}}}`),
			tenants: []string{"alice"},
			want:    map[string]any{"runtimes": vgpuDocker(rp, "alice")},
			wantAction: []string{
				`updated runtime "vgpu": was path "/usr/local/bin/vgpu-runtime", runtimeArgs [1], now path /usr/local/bin/vgpu-runtime; runtimeArgs was not a list of strings and was replaced`,
				`updated runtime "vgpu-alice": was path "/usr/local/bin/vgpu-runtime", runtimeArgs "--vgpu-tenant alice", now path /usr/local/bin/vgpu-runtime, runtimeArgs ["--vgpu-tenant","alice"]; runtimeArgs was not a list of strings and was replaced`,
			},
		},
		{
			name:    "changed tenant args are updated",
			before:  ptr(`{"runtimes": {"vgpu": {"path": "/usr/local/bin/vgpu-runtime"}, "vgpu-alice": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": ["--vgpu-tenant", "bob"]}}}`),
			tenants: []string{"alice"},
			want:    map[string]any{"runtimes": vgpuDocker(rp, "alice")},
			wantAction: []string{`runtime "vgpu" already in place`,
				`updated runtime "vgpu-alice": was path "/usr/local/bin/vgpu-runtime", runtimeArgs ["--vgpu-tenant","bob"]`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "docker", "daemon.json")
			var before []byte
			if tc.before != nil {
				before = []byte(*tc.before)
				writeFile(t, path, before, tc.mode)
			}
			r, err := InstallDocker(InstallOptions{ConfigPath: path, Tenants: tc.tenants})
			if err != nil {
				t.Fatal(err)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := decodeJSON(t, after); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("result %v\nwant   %v\nfile:\n%s", got, tc.want, after)
			}
			checkActions(t, r.Actions, tc.wantAction)
			if !reflect.DeepEqual(r.After, after) {
				t.Errorf("Result.After differs from the file")
			}
			alreadyThere := tc.before != nil && string(before) == string(after)
			if r.Changed == alreadyThere || r.Written == alreadyThere {
				t.Errorf("Changed %v, Written %v; file changed: %v", r.Changed, r.Written, !alreadyThere)
			}
			if alreadyThere != (r.Restart == "") {
				t.Errorf("Restart %q when the file changed: %v", r.Restart, !alreadyThere)
			}
			if r.Changed && !strings.Contains(r.Restart, "systemctl reload docker") {
				t.Errorf("Restart = %q, want the reload command", r.Restart)
			}
			wantMode := tc.mode
			if tc.before == nil || wantMode == 0 {
				wantMode = 0o644
			}
			checkMode(t, path, wantMode)
			checkNoTemp(t, filepath.Dir(path))
			if tc.check != nil {
				tc.check(t, before, after)
			}

			// Second run: nothing to do, nothing written.
			st1, _ := os.Stat(path)
			r2, err := InstallDocker(InstallOptions{ConfigPath: path, Tenants: tc.tenants})
			if err != nil {
				t.Fatal(err)
			}
			if r2.Changed || r2.Written || r2.Restart != "" {
				t.Errorf("second run: Changed %v Written %v Restart %q", r2.Changed, r2.Written, r2.Restart)
			}
			for _, a := range r2.Actions {
				if !strings.Contains(a, "already in place") {
					t.Errorf("second run action %q", a)
				}
			}
			again, _ := os.ReadFile(path)
			st2, _ := os.Stat(path)
			if string(again) != string(after) || !os.SameFile(st1, st2) || !st1.ModTime().Equal(st2.ModTime()) {
				t.Errorf("second run touched the file")
			}
		})
	}
}

func TestInstallDockerErrors(t *testing.T) {
	tests := []struct {
		name     string
		before   string
		tenants  []string
		wantLine int
		wantMsg  string
	}{
		{name: "syntax error", before: "{\n  \"debug\": true,\n  \"bip\" \"x\"\n}\n", wantLine: 3, wantMsg: "invalid character"},
		{name: "truncated", before: "{\n  \"debug\": true,\n", wantMsg: "unexpected end of JSON input"},
		{name: "trailing garbage", before: "{}\n}\n", wantLine: 2, wantMsg: "after top-level value"},
		{name: "top level array", before: `["vgpu"]`, wantMsg: "the top level is an array, want a JSON object"},
		{name: "runtimes not an object", before: `{"runtimes": "runc"}`, wantMsg: "runtimes is a string, want a JSON object"},
		{name: "vgpu runtime not an object", before: `{"runtimes": {"vgpu": ["x"]}}`, wantMsg: "runtimes.vgpu is an array"},
		{name: "duplicate runtimes", before: `{"runtimes": {}, "runtimes": {}}`, wantMsg: `key "runtimes" is given twice`},
		{name: "duplicate runtime", before: `{"runtimes": {"vgpu": {}, "vgpu": {}}}`, wantMsg: `key "runtimes.vgpu" is given twice`},
		{name: "duplicate runtimeArgs", before: `{"runtimes": {"vgpu": {"runtimeArgs": [], "path": "/x", "runtimeArgs": []}}}`, wantMsg: `key "runtimes.vgpu.runtimeArgs" is given twice`},
		{name: "path in two cases", before: `{"runtimes": {"vgpu": {"path": "/usr/local/bin/vgpu-runtime", "PATH": "/x"}}}`, wantMsg: `key "runtimes.vgpu.path" is given twice`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "daemon.json")
			writeFile(t, path, []byte(tc.before), 0o644)
			_, err := InstallDocker(InstallOptions{ConfigPath: path, Tenants: tc.tenants})
			checkConfigError(t, err, path, tc.wantLine, tc.wantMsg)
			if got, _ := os.ReadFile(path); string(got) != tc.before {
				t.Errorf("file changed on error:\n%s", got)
			}
		})
	}
}

func TestWithTenant(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		tenant string
		want   []string
	}{
		{nil, "", []string{}},
		{nil, "a", []string{"--vgpu-tenant", "a"}},
		{[]string{"--x", "--vgpu-tenant"}, "", []string{"--x"}},
		{[]string{"--vgpu-tenant", "--x"}, "a", []string{"--vgpu-tenant", "a"}}, // "--x" is the pair's value
		{[]string{"--x", "--vgpu-tenant"}, "a", []string{"--x", "--vgpu-tenant", "a"}},
		{[]string{"--vgpu-tenant=", "--y"}, "a", []string{"--vgpu-tenant", "a", "--y"}},
		{[]string{"--vgpu-tenant=a", "--vgpu-tenant", "b"}, "a", []string{"--vgpu-tenant=a"}},
		{[]string{"--vgpu-tenant", "b", "--vgpu-tenant=a"}, "a", []string{"--vgpu-tenant", "a"}},
		{[]string{"--vgpu-tenants=a", "--vgpu-tenant-x"}, "", []string{"--vgpu-tenants=a", "--vgpu-tenant-x"}},
	} {
		if got := withTenant(tc.args, tc.tenant); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("withTenant(%q, %q) = %q, want %q", tc.args, tc.tenant, got, tc.want)
		}
	}
}

func TestInstallDockerDryRun(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing", "daemon.json")
	r, err := InstallDocker(InstallOptions{ConfigPath: missing, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Changed || r.Written || r.Existed || r.Restart == "" || len(r.After) == 0 {
		t.Errorf("dry run on a missing file: %+v", r)
	}
	if _, err := os.Stat(filepath.Dir(missing)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dry run created %s: %v", filepath.Dir(missing), err)
	}

	path := filepath.Join(dir, "daemon.json")
	writeFile(t, path, []byte(dockerOthers), 0o640)
	st1, _ := os.Stat(path)
	r, err = InstallDocker(InstallOptions{ConfigPath: path, DryRun: true, Tenants: []string{"alice"}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Changed || r.Written {
		t.Errorf("dry run: Changed %v Written %v", r.Changed, r.Written)
	}
	got, _ := os.ReadFile(path)
	st2, _ := os.Stat(path)
	if string(got) != dockerOthers || !st1.ModTime().Equal(st2.ModTime()) {
		t.Errorf("dry run changed the file")
	}
	d := r.Diff()
	for _, want := range []string{"--- " + path, "+++ " + path, `+        "vgpu": {`, `+        "vgpu-alice": {`} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q:\n%s", want, d)
		}
	}
	checkNoTemp(t, dir)
}

func TestInstallDockerSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real.json")
	writeFile(t, target, []byte(`{"debug": true}`), 0o600)
	link := filepath.Join(dir, "daemon.json")
	if err := os.Symlink("real.json", link); err != nil {
		t.Fatal(err)
	}
	r, err := InstallDocker(InstallOptions{ConfigPath: link})
	if err != nil {
		t.Fatal(err)
	}
	if r.Path != target {
		t.Errorf("Path %s, want the link's target %s", r.Path, target)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the symlink was replaced: %v %v", fi.Mode(), err)
	}
	got, _ := os.ReadFile(target)
	if m := decodeJSON(t, got); m["debug"] != true || m["runtimes"] == nil {
		t.Errorf("target: %s", got)
	}
	checkMode(t, target, 0o600)
}

func TestRuntimesValidation(t *testing.T) {
	for _, tc := range []struct {
		path    string
		tenants []string
	}{
		{"relative/vgpu-runtime", nil},
		{"/usr/bin/vgpu\nruntime", nil},
		{"", []string{""}},
		{"", []string{"-x"}},
		{"", []string{"a/b"}},
		{"", []string{"a b"}},
		{"", []string{strings.Repeat("a", 64)}},
		{"", []string{"a", "a"}},
	} {
		if _, err := Runtimes(tc.path, tc.tenants); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Runtimes(%q, %q) = %v, want invalid argument", tc.path, tc.tenants, err)
		}
		if _, err := InstallDocker(InstallOptions{ConfigPath: filepath.Join(t.TempDir(), "d.json"), RuntimePath: tc.path, Tenants: tc.tenants}); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("InstallDocker(%q, %q) = %v, want invalid argument", tc.path, tc.tenants, err)
		}
	}
	rts, err := Runtimes("/opt/vgpu/bin/../bin/vgpu-runtime", []string{"alice", "b.o_b-1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Runtime{
		{Name: "vgpu", Path: "/opt/vgpu/bin/vgpu-runtime", Binary: "/opt/vgpu/bin/vgpu-runtime"},
		{Name: "vgpu-alice", Tenant: "alice", Path: "/opt/vgpu/bin/vgpu-runtime", Args: []string{"--vgpu-tenant", "alice"}, Binary: "/opt/vgpu/bin/vgpu-runtime-alice"},
		{Name: "vgpu-b.o_b-1", Tenant: "b.o_b-1", Path: "/opt/vgpu/bin/vgpu-runtime", Args: []string{"--vgpu-tenant", "b.o_b-1"}, Binary: "/opt/vgpu/bin/vgpu-runtime-b.o_b-1"},
	}
	if !reflect.DeepEqual(rts, want) {
		t.Errorf("Runtimes = %+v\nwant %+v", rts, want)
	}
}

// Helpers shared by the install tests.

func ptr[T any](v T) *T { return &v }

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if mode == 0 {
		mode = 0o644
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != want {
		t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
	}
}

// checkNoTemp fails when a temporary file of writeFileAtomic is left in dir.
func checkNoTemp(t *testing.T, dir string) {
	t.Helper()
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		if strings.Contains(e.Name(), ".vgpu-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

func checkActions(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) < len(want) {
		t.Errorf("actions %q, want %d of them", got, len(want))
		return
	}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Errorf("action %d = %q, want it to contain %q", i, got[i], w)
		}
	}
}

func checkConfigError(t *testing.T, err error, path string, line int, msg string) {
	t.Helper()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T), want *ConfigError", err, err)
	}
	if !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("error %v does not match api.ErrInvalidArgument", err)
	}
	if ce.Path != path {
		t.Errorf("error names %q, want %q", ce.Path, path)
	}
	if line > 0 && ce.Line != line {
		t.Errorf("error at line %d, want %d: %v", ce.Line, line, err)
	}
	if !strings.Contains(err.Error(), msg) || !strings.HasPrefix(err.Error(), path) {
		t.Errorf("error %q, want it to start with the path and contain %q", err, msg)
	}
}
