package integration

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// fuzzRuntimes is what the fuzz targets install: the plain runtime and
// one tenant's, so both shapes of runtimeArgs and BinaryName are covered.
func fuzzRuntimes(t *testing.T) []Runtime {
	rts, err := Runtimes("/usr/local/bin/vgpu-runtime", []string{"alice"})
	if err != nil {
		t.Fatal(err)
	}
	return rts
}

// checkEditError is the promise of both editors about a file they refuse:
// a *ConfigError, which matches api.ErrInvalidArgument, so vgpuctl reports
// a bad file and not a bug.
func checkEditError(t *testing.T, data []byte, err error) {
	t.Helper()
	var ce *ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("edit of %q: error %q (%T) is not a *ConfigError", data, err, err)
	}
}

// FuzzEditDaemonJSON installs the runtimes into arbitrary daemon.json
// text. A refused file is a *ConfigError; an accepted one comes out as a
// JSON object with the runtimes as InstallDocker documents them, every
// other top-level key and other runtime unchanged in value, the vgpu
// runtimes' other members kept, and a second install changing nothing.
func FuzzEditDaemonJSON(f *testing.F) {
	f.Add([]byte(dockerOthers))
	f.Add([]byte(""))
	f.Add([]byte("{}"))
	f.Add([]byte("{\n\t\"debug\": true\n}\n"))
	f.Add([]byte(`{"runtimes":{"vgpu":{"path":"/old","runtimeType":"io.containerd.runc.v2","options":{"a":1}},"vgpu-alice":{"path":"/usr/local/bin/vgpu-runtime","runtimeArgs":["--vgpu-socket=/s","--vgpu-tenant=bob","--vgpu-tenant","x"],"extra":null}}}`))
	f.Add([]byte(`{"runtimes":{"vgpu":{"path":"/usr/local/bin/vgpu-runtime","runtimeArgs":["--vgpu-tenant"]},"vgpu-alice":{"path":"/usr/local/bin/vgpu-runtime","runtimeArgs":"--vgpu-tenant alice"}}}`))
	f.Add([]byte(`{"runtimes":{"vgpu":{"path":1,"path":2}}}`))
	// dockerd decodes a runtime's members case insensitively ("ſ" folds
	// to "s"): these are its path, runtimeArgs and runtimeType.
	f.Add([]byte(`{"runtimes":{"vgpu":{"path":"/old","PATH":"/evil","RuntimeType":"x"},"vgpu-alice":{"pAth":"/usr/local/bin/vgpu-runtime","runtimeArgſ":["--vgpu-tenant","alice"]}}}`))
	f.Add([]byte(`{"runtimes":[],"runtimes":{}}`))
	f.Add([]byte(`{"a":1e400}`))
	f.Add([]byte(`{"k\u00e9\ud800":"<&>","runtimes":null}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rts := fuzzRuntimes(t)
		after, actions, err := editDaemonJSON("daemon.json", data, rts)
		if err != nil {
			checkEditError(t, data, err)
			return
		}
		if len(actions) != len(rts) {
			t.Fatalf("edit of %q: %d actions for %d runtimes: %q", data, len(actions), len(rts), actions)
		}
		before := map[string]any{}
		if len(strings.TrimSpace(string(data))) > 0 {
			if err := json.Unmarshal(data, &before); err != nil {
				t.Fatalf("edit accepted %q, which does not decode: %v", data, err)
			}
		}
		var got map[string]any
		if err := json.Unmarshal(after, &got); err != nil || got == nil {
			t.Fatalf("edit of %q gave %q, not a JSON object: %v", data, after, err)
		}
		for k, v := range before {
			if k != "runtimes" && !reflect.DeepEqual(got[k], v) {
				t.Fatalf("edit of %q changed %q from %v to %v", data, k, v, got[k])
			}
		}
		if len(got) != len(before) && (len(got) != len(before)+1 || before["runtimes"] != nil) {
			t.Fatalf("edit of %q: keys %v, before %v", data, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(before)))
		}
		oldRuntimes, _ := before["runtimes"].(map[string]any)
		gotRuntimes, _ := got["runtimes"].(map[string]any)
		for name, v := range oldRuntimes {
			if !slices.ContainsFunc(rts, func(rt Runtime) bool { return rt.Name == name }) && !reflect.DeepEqual(gotRuntimes[name], v) {
				t.Fatalf("edit of %q changed runtime %q from %v to %v", data, name, v, gotRuntimes[name])
			}
		}
		for _, rt := range rts {
			checkDockerRuntime(t, data, rt, oldRuntimes[rt.Name], gotRuntimes[rt.Name])
		}
		again, actions, err := editDaemonJSON("daemon.json", after, rts)
		if err != nil || string(again) != string(after) {
			t.Fatalf("second edit of %q (from %q) = %q, %v; want it unchanged", after, data, again, err)
		}
		for _, a := range actions {
			if !strings.Contains(a, "already in place") {
				t.Fatalf("second edit of %q: action %q", after, a)
			}
		}
	})
}

// checkDockerRuntime checks one vgpu runtime after an install as dockerd
// reads it (encoding/json: member names match case insensitively): its
// path, exactly its own tenant pair in runtimeArgs, no member dockerd
// refuses beside "path", and every other member of the old entry kept.
func checkDockerRuntime(t *testing.T, data []byte, rt Runtime, old, got any) {
	t.Helper()
	m, ok := got.(map[string]any)
	if !ok {
		t.Fatalf("edit of %q: runtime %q is %v, want an object", data, rt.Name, got)
	}
	field := func(name string) (any, bool) {
		var v any
		n := 0
		for k, kv := range m {
			if strings.EqualFold(k, name) {
				v, n = kv, n+1
			}
		}
		if n > 1 {
			t.Fatalf("edit of %q: runtime %q has %d members dockerd reads as %q", data, rt.Name, n, name)
		}
		return v, n == 1
	}
	if p, _ := field("path"); p != rt.Path {
		t.Fatalf("edit of %q: runtime %q is %v, want path %s", data, rt.Name, got, rt.Path)
	}
	for _, k := range pathConflicts {
		if _, ok := field(k); ok {
			t.Fatalf("edit of %q: runtime %q keeps %q beside path", data, rt.Name, k)
		}
	}
	var args []string
	if a, ok := field("runtimeArgs"); ok {
		if args, ok = stringList(a); !ok || len(args) == 0 {
			t.Fatalf("edit of %q: runtime %q runtimeArgs %v, want a non-empty list of strings", data, rt.Name, a)
		}
	}
	var tenants []string
	for i := 0; i < len(args); i++ {
		switch {
		case strings.HasPrefix(args[i], TenantFlag+"="):
			tenants = append(tenants, strings.TrimPrefix(args[i], TenantFlag+"="))
		case args[i] == TenantFlag && i+1 < len(args):
			tenants = append(tenants, args[i+1])
			i++
		case args[i] == TenantFlag:
			tenants = append(tenants, "")
		}
	}
	if want := slices.DeleteFunc([]string{rt.Tenant}, func(s string) bool { return s == "" }); !slices.Equal(tenants, want) {
		t.Fatalf("edit of %q: runtime %q runtimeArgs %q say tenants %q, want %q", data, rt.Name, args, tenants, want)
	}
	om, _ := old.(map[string]any)
	for k, v := range om {
		if !isField(k, append([]string{"path", "runtimeArgs"}, pathConflicts...)) && !reflect.DeepEqual(m[k], v) {
			t.Fatalf("edit of %q: runtime %q member %q was %v, now %v", data, rt.Name, k, v, m[k])
		}
	}
}

// FuzzEditConfigTOML installs the runtimes into arbitrary config.toml
// text. A refused file is a *ConfigError; an accepted one parses, has the
// runtimes under the CRI table of its version as InstallContainerd
// documents them, means what the old file meant everywhere else (the
// vgpu runtimes' other settings included), is the old text byte for byte
// followed by the new tables unless it says it was rewritten, and a second
// install changes nothing.
func FuzzEditConfigTOML(f *testing.F) {
	for _, s := range []string{
		debianConfig, othersConfig, "", "# nothing yet\n", "version = 1\n", "version = 3\n", "version = 4\n", `version = "2"`,
		"version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\nSystemdCgroup = true\n",
		"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\nruntime_type = \"io.containerd.runc.v1\"\nprivileged_without_host_devices = true\npod_annotations = [\"x/*\"]\n",
		"version = 2\nplugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes = { runc = { runtime_type = \"io.containerd.runc.v2\" } }\n",
		"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\npod_annotations = 1\n",
		"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\ncontainerd = \"x\"\n",
		"version = 2\nt = 1979-05-27T07:32:00Z\nd = 1979-05-27\nx = inf\n[[a]]\n[[a]]\nb = [1, 'two', {c = 3}]\n",
		"version = 2\nroot = \"\"\"\nmulti\nline\"\"\"\ndisabled_plugins = [\"cri\"]",
		"[plugins.cri.containerd.runtimes.vgpu]\n",
		"version = 2\n[x]\n[x]\n",
		"version = 2\nx = nan\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rts := fuzzRuntimes(t)
		e, err := editConfigTOML("config.toml", data, rts)
		if err != nil {
			checkEditError(t, data, err)
			return
		}
		if len(e.actions) < len(rts) {
			t.Fatalf("edit of %q: %d actions for %d runtimes: %q", data, len(e.actions), len(rts), e.actions)
		}
		before, err := parseTOML("config.toml", data)
		if err != nil {
			t.Fatalf("edit accepted %q, which does not parse: %v", data, err)
		}
		got, err := parseTOML("config.toml", e.after)
		if err != nil {
			t.Fatalf("edit of %q gave %q, which does not parse: %v", data, e.after, err)
		}
		version, _ := before["version"].(int64)
		if len(before) == 0 {
			version = 2
			if got["version"] != int64(2) {
				t.Fatalf("edit of %q: new file has version %v, want 2", data, got["version"])
			}
			delete(got, "version")
		} else if version == 0 {
			version = 1
		}
		key, ok := criRuntimesKey(version)
		if !ok {
			t.Fatalf("edit of %q accepted version %d", data, version)
		}
		for _, rt := range rts {
			checkContainerdRuntime(t, data, rt, got, key)
		}
		dropRuntimes(before, key, rts)
		dropRuntimes(got, key, rts)
		if !sameTOML(got, before) {
			t.Fatalf("edit of %q changed other settings:\n%v\nwas\n%v", data, got, before)
		}
		if !e.rewritten && !strings.HasPrefix(string(e.after), string(data)) {
			t.Fatalf("edit of %q appended to %q, which does not start with the old text", data, e.after)
		}
		again, err := editConfigTOML("config.toml", e.after, rts)
		if err != nil || string(again.after) != string(e.after) || again.rewritten {
			t.Fatalf("second edit of %q (from %q): %v; want it unchanged", e.after, data, err)
		}
	})
}

// checkContainerdRuntime checks one vgpu runtime in a parsed config after
// an install: runc.v2 running the runtime's binary, with the vgpu.io/*
// pod annotations passed.
func checkContainerdRuntime(t *testing.T, data []byte, rt Runtime, doc map[string]any, runtimesKey []string) {
	t.Helper()
	key := append(slices.Clone(runtimesKey), rt.Name)
	tab, err := table("config.toml", doc, key)
	if err != nil || tab == nil {
		t.Fatalf("edit of %q: no table %s: %v", data, tomlKey(key), err)
	}
	opts, _ := tab["options"].(map[string]any)
	pods, _ := tab["pod_annotations"].([]any)
	if tab["runtime_type"] != RuncV2 || opts["BinaryName"] != rt.Binary || !slices.Contains(pods, any(PodAnnotations)) {
		t.Fatalf("edit of %q: %s is %v", data, tomlKey(key), showTOML(tab))
	}
}

// dropRuntimes removes the settings an install owns from a parsed config:
// the vgpu runtimes' runtime_type, pod_annotations (only the vgpu.io/*
// pattern) and options.BinaryName and SystemdCgroup, then the tables left
// empty on the way up, so that what remains is what the install must keep.
func dropRuntimes(doc map[string]any, runtimesKey []string, rts []Runtime) {
	runtimes, _ := table("", doc, runtimesKey)
	for _, rt := range rts {
		tab, ok := runtimes[rt.Name].(map[string]any)
		if !ok {
			continue
		}
		delete(tab, "runtime_type")
		if l, ok := tab["pod_annotations"].([]any); ok {
			l = slices.DeleteFunc(slices.Clone(l), func(p any) bool { return p == PodAnnotations })
			if len(l) == 0 {
				delete(tab, "pod_annotations")
			} else {
				tab["pod_annotations"] = l
			}
		}
		if o, ok := tab["options"].(map[string]any); ok {
			delete(o, "BinaryName")
			delete(o, "SystemdCgroup")
			if len(o) == 0 {
				delete(tab, "options")
			}
		}
		if len(tab) == 0 {
			delete(runtimes, rt.Name)
		}
	}
	for n := len(runtimesKey); n > 0; n-- {
		parent, _ := table("", doc, runtimesKey[:n-1])
		if t, ok := parent[runtimesKey[n-1]].(map[string]any); ok && len(t) == 0 {
			delete(parent, runtimesKey[n-1])
		}
	}
}
