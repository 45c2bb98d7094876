package runtimehook

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
)

func split(s string) []string { return strings.Fields(s) }

func TestParseArgs(t *testing.T) {
	const dockerGlobals = "--root /var/run/docker/runtime-runc/moby --log /run/containerd/io.containerd.runtime.v2.task/moby/abc/log.json --log-format json"
	const ctrGlobals = "--root /run/containerd/runc/k8s.io --log /run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/log.json --log-format json"
	for _, tc := range []struct {
		name string
		args string
		want Invocation // Args "" means the args without the --vgpu-* flags: given in passed
		pass string
	}{
		{
			name: "docker create",
			args: "--vgpu-tenant team-a " + dockerGlobals + " --systemd-cgroup create --bundle /run/containerd/io.containerd.runtime.v2.task/moby/abc --pid-file /run/x/init.pid abc",
			pass: dockerGlobals + " --systemd-cgroup create --bundle /run/containerd/io.containerd.runtime.v2.task/moby/abc --pid-file /run/x/init.pid abc",
			want: Invocation{Command: "create", Root: "/var/run/docker/runtime-runc/moby",
				Log: "/run/containerd/io.containerd.runtime.v2.task/moby/abc/log.json", LogFormat: "json",
				Bundle: "/run/containerd/io.containerd.runtime.v2.task/moby/abc", ID: "abc", Tenant: "team-a"},
		},
		{
			name: "containerd shim create with a console socket",
			args: ctrGlobals + " create --bundle /b/k8s.io/abc --pid-file /b/init.pid --console-socket /tmp/pty.sock abc",
			pass: ctrGlobals + " create --bundle /b/k8s.io/abc --pid-file /b/init.pid --console-socket /tmp/pty.sock abc",
			want: Invocation{Command: "create", Root: "/run/containerd/runc/k8s.io",
				Log: "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/log.json", LogFormat: "json",
				Bundle: "/b/k8s.io/abc", ID: "abc"},
		},
		{
			name: "every wrapper flag, both forms, everywhere",
			args: "--vgpu-runtime=/usr/sbin/runc --root /r/ns --vgpu-socket /s.sock create --vgpu-hook=/h -b /bundle --vgpu-state /st --no-pivot --vgpu-tenant=t id1",
			pass: "--root /r/ns create -b /bundle --no-pivot id1",
			want: Invocation{Command: "create", Root: "/r/ns", Bundle: "/bundle", ID: "id1",
				Tenant: "t", Runtime: "/usr/sbin/runc", Socket: "/s.sock", Hook: "/h", StateDir: "/st"},
		},
		{
			name: "= forms of runc's flags",
			args: "--root=/r/moby --log=/l --log-format=text create --bundle=/b --pid-file=/p c2",
			pass: "--root=/r/moby --log=/l --log-format=text create --bundle=/b --pid-file=/p c2",
			want: Invocation{Command: "create", Root: "/r/moby", Log: "/l", LogFormat: "text", Bundle: "/b", ID: "c2"},
		},
		{
			name: "single-dash long flags",
			args: "-root /r/ns create -bundle /b c3",
			pass: "-root /r/ns create -bundle /b c3",
			want: Invocation{Command: "create", Root: "/r/ns", Bundle: "/b", ID: "c3"},
		},
		{
			name: "flags after the id (runc reorders)",
			args: "create c4 --bundle /b --pid-file /p",
			pass: "create c4 --bundle /b --pid-file /p",
			want: Invocation{Command: "create", Bundle: "/b", ID: "c4"},
		},
		{
			name: "no bundle: the current directory",
			args: "create c5",
			pass: "create c5",
			want: Invocation{Command: "create", ID: "c5"},
		},
		{
			name: "run creates too",
			args: "--root /r/x run -d --bundle /b --pid-file /p c6",
			pass: "--root /r/x run -d --bundle /b --pid-file /p c6",
			want: Invocation{Command: "run", Root: "/r/x", Bundle: "/b", ID: "c6"},
		},
		{
			name: "start",
			args: "--vgpu-tenant a " + dockerGlobals + " start abc",
			pass: dockerGlobals + " start abc",
			want: Invocation{Command: "start", Root: "/var/run/docker/runtime-runc/moby",
				Log: "/run/containerd/io.containerd.runtime.v2.task/moby/abc/log.json", LogFormat: "json", Tenant: "a"},
		},
		{
			name: "state",
			args: "--root /r/moby state abc",
			pass: "--root /r/moby state abc",
			want: Invocation{Command: "state", Root: "/r/moby"},
		},
		{
			name: "kill",
			args: "--root /r/moby kill --all abc 9",
			pass: "--root /r/moby kill --all abc 9",
			want: Invocation{Command: "kill", Root: "/r/moby"},
		},
		{
			name: "delete",
			args: "--root /r/moby delete --force abc --vgpu-tenant x",
			pass: "--root /r/moby delete --force abc",
			want: Invocation{Command: "delete", Root: "/r/moby", Tenant: "x"},
		},
		{
			name: "ps",
			args: "--root /r/moby ps --format json abc",
			pass: "--root /r/moby ps --format json abc",
			want: Invocation{Command: "ps", Root: "/r/moby"},
		},
		{
			name: "exec keeps the command's own arguments",
			args: "--vgpu-tenant a --root /r/moby exec --vgpu-socket /s -e A=1 --user 0 abc prog --vgpu-tenant b -- x",
			pass: "--root /r/moby exec -e A=1 --user 0 abc prog --vgpu-tenant b -- x",
			want: Invocation{Command: "exec", Root: "/r/moby", Tenant: "a", Socket: "/s"},
		},
		{
			name: "exec the way docker does it",
			args: dockerGlobals + " exec --process /tmp/runc-process123 --detach --pid-file /p abc",
			pass: dockerGlobals + " exec --process /tmp/runc-process123 --detach --pid-file /p abc",
			want: Invocation{Command: "exec", Root: "/var/run/docker/runtime-runc/moby",
				Log: "/run/containerd/io.containerd.runtime.v2.task/moby/abc/log.json", LogFormat: "json"},
		},
		{
			name: "after -- nothing is the wrapper's",
			args: "create --bundle /b -- --vgpu-tenant",
			pass: "create --bundle /b -- --vgpu-tenant",
			want: Invocation{Command: "create", Bundle: "/b", ID: "--vgpu-tenant"},
		},
		{
			name: "version",
			args: "--vgpu-runtime /x --version",
			pass: "--version",
			want: Invocation{Runtime: "/x"},
		},
		{
			name: "nothing",
			args: "",
			pass: "",
			want: Invocation{},
		},
		{
			// runc restore starts a container from a bundle too; its
			// value flags are not taken for the id.
			name: "containerd shim restore",
			args: ctrGlobals + " restore --image-path /img --work-path /work --bundle /b/k8s.io/abc --pid-file /b/init.pid --manage-cgroups-mode soft --detach --empty-ns network --lsm-profile apparmor:p --lsm-mount-context ctx abc",
			pass: ctrGlobals + " restore --image-path /img --work-path /work --bundle /b/k8s.io/abc --pid-file /b/init.pid --manage-cgroups-mode soft --detach --empty-ns network --lsm-profile apparmor:p --lsm-mount-context ctx abc",
			want: Invocation{Command: "restore", Root: "/run/containerd/runc/k8s.io",
				Log: "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/log.json", LogFormat: "json",
				Bundle: "/b/k8s.io/abc", ID: "abc"},
		},
		{
			name: "later wrapper flag wins",
			args: "--vgpu-tenant a --vgpu-tenant=b features",
			pass: "features",
			want: Invocation{Command: "features", Tenant: "b"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseArgs(split(tc.args))
			if err != nil {
				t.Fatalf("ParseArgs: %v", err)
			}
			want := tc.want
			want.Args = split(tc.pass)
			if want.Args == nil {
				want.Args = []string{}
			}
			if !reflect.DeepEqual(*got, want) {
				t.Fatalf("ParseArgs(%q) =\n %+v\nwant\n %+v", tc.args, *got, want)
			}
		})
	}
}

func TestParseArgsEmptyValues(t *testing.T) {
	got, err := ParseArgs([]string{"--vgpu-tenant=", "--vgpu-socket", "", "create", "--bundle", "", "id"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "" || got.Bundle != "" || got.ID != "id" || !reflect.DeepEqual(got.Args, []string{"create", "--bundle", "", "id"}) {
		t.Fatalf("got %+v", got)
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--vgpu-tenant"},
		{"create", "--bundle", "/b", "id", "--vgpu-hook"},
		{"--vgpu-tenants", "a", "create", "id"},
		{"--vgpu-", "create"},
		{"--vgpu-debug=1", "state", "x"},
	} {
		if inv, err := ParseArgs(args); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "--vgpu-") {
			t.Errorf("ParseArgs(%q) = %+v, %v; want an invalid-argument error naming the flag", args, inv, err)
		}
	}
}

func TestNamespace(t *testing.T) {
	for root, want := range map[string]string{
		"/var/run/docker/runtime-runc/moby": "moby",
		"/run/containerd/runc/k8s.io":       "k8s.io",
		"/run/containerd/runc/default/":     "default",
		"":                                  "",
	} {
		if got := (&Invocation{Root: root}).Namespace(); got != want {
			t.Errorf("Namespace(root %q) = %q, want %q", root, got, want)
		}
	}
}

func writeExe(t *testing.T, p string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSettings(t *testing.T) {
	dir := t.TempDir()
	self := writeExe(t, filepath.Join(dir, "bin", "vgpu-runtime"))
	runc := writeExe(t, filepath.Join(dir, "sbin", "runc"))
	old := DefaultRuntimes
	t.Cleanup(func() { DefaultRuntimes = old })
	DefaultRuntimes = []string{filepath.Join(dir, "nope", "runc"), runc, self}

	t.Run("defaults", func(t *testing.T) {
		inv := &Invocation{}
		if err := inv.Settings(self); err != nil {
			t.Fatal(err)
		}
		want := Invocation{Runtime: runc, Socket: DefaultOperatorSocket, StateDir: DefaultStateDir, Hook: filepath.Join(dir, "bin", "vgpu-hook")}
		if !reflect.DeepEqual(*inv, want) {
			t.Fatalf("got %+v, want %+v", *inv, want)
		}
	})
	t.Run("given", func(t *testing.T) {
		inv := &Invocation{Runtime: runc, Socket: "/s//m.sock", StateDir: "/st/", Hook: "/h/vgpu-hook"}
		if err := inv.Settings(self); err != nil {
			t.Fatal(err)
		}
		if inv.Runtime != runc || inv.Socket != "/s/m.sock" || inv.StateDir != "/st" || inv.Hook != "/h/vgpu-hook" {
			t.Fatalf("got %+v", *inv)
		}
	})
	t.Run("bare name from PATH", func(t *testing.T) {
		t.Setenv("PATH", filepath.Join(dir, "sbin"))
		inv := &Invocation{Runtime: "runc"}
		if err := inv.Settings(self); err != nil || inv.Runtime != runc {
			t.Fatalf("Settings: %v, runtime %q", err, inv.Runtime)
		}
	})
	t.Run("relative path", func(t *testing.T) {
		t.Chdir(dir)
		inv := &Invocation{Runtime: "sbin/runc"}
		if err := inv.Settings(self); err != nil || inv.Runtime != runc {
			t.Fatalf("Settings: %v, runtime %q", err, inv.Runtime)
		}
	})
	for _, tc := range []struct {
		name string
		inv  Invocation
		self string
		err  error
		msg  string
	}{
		{"itself", Invocation{Runtime: self}, self, api.ErrInvalidArgument, "this wrapper itself"},
		{"missing runtime", Invocation{Runtime: filepath.Join(dir, "missing")}, self, api.ErrUnavailable, "no such file"},
		{"missing bare runtime", Invocation{Runtime: "no-such-runtime-xyz"}, self, api.ErrUnavailable, "no-such-runtime-xyz"},
		{"relative socket", Invocation{Socket: "m.sock"}, self, api.ErrInvalidArgument, "--vgpu-socket"},
		{"relative state", Invocation{StateDir: "st"}, self, api.ErrInvalidArgument, "--vgpu-state"},
		{"relative hook", Invocation{Hook: "vgpu-hook"}, self, api.ErrInvalidArgument, "--vgpu-hook"},
		{"no hook and no self", Invocation{}, "", api.ErrInvalidArgument, "--vgpu-hook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := tc.inv
			err := inv.Settings(tc.self)
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Settings = %v, want %v naming %q", err, tc.err, tc.msg)
			}
		})
	}
	t.Run("no runc anywhere", func(t *testing.T) {
		DefaultRuntimes = []string{filepath.Join(dir, "nope")}
		inv := &Invocation{}
		if err := inv.Settings(self); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "--vgpu-runtime") {
			t.Fatalf("Settings = %v", err)
		}
	})
}

func TestSettingsTenantName(t *testing.T) {
	dir := t.TempDir()
	runc := writeExe(t, filepath.Join(dir, "runc"))
	for _, bad := range []string{"-a", "a b", "a/b", strings.Repeat("a", 64), "team\n"} {
		inv := &Invocation{Tenant: bad, Runtime: runc, Hook: "/h"}
		if err := inv.Settings(""); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "--vgpu-tenant") {
			t.Errorf("tenant %q: %v", bad, err)
		}
	}
}
