// Package kubernetes holds vgpu's Kubernetes manifests; its test checks that
// they parse into the Kubernetes kinds they are meant to be, and that the
// quota ConfigMap, the RuntimeClasses and the install step of the mediator
// DaemonSet agree with one another and with what "vgpuctl install
// containerd" really writes for them.
package kubernetes

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"go.yaml.in/yaml/v3"

	"github.com/vgpu/vgpu/integration"
	"github.com/vgpu/vgpu/isolation"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

// The fields of Kubernetes objects the test reads: small local types
// rather than k8s.io/api, which is large.
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`

	Data      map[string]string `yaml:"data"`    // ConfigMap
	Handler   string            `yaml:"handler"` // RuntimeClass
	Resources []string          `yaml:"resources"`
	Spec      struct {          // DaemonSet
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type podSpec struct {
	NodeSelector   map[string]string `yaml:"nodeSelector"`
	InitContainers []container       `yaml:"initContainers"`
	Containers     []container       `yaml:"containers"`
	Volumes        []struct {
		Name     string `yaml:"name"`
		HostPath *struct {
			Path string `yaml:"path"`
			Type string `yaml:"type"`
		} `yaml:"hostPath"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type container struct {
	Name         string   `yaml:"name"`
	Image        string   `yaml:"image"`
	Command      []string `yaml:"command"`
	Args         []string `yaml:"args"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

// wantKinds is what each manifest holds, by file.
var wantKinds = map[string][]string{
	"namespace.yaml":       {"v1/Namespace"},
	"quota-configmap.yaml": {"v1/ConfigMap"},
	"runtimeclasses.yaml":  {"node.k8s.io/v1/RuntimeClass", "node.k8s.io/v1/RuntimeClass"},
	"vgpu-node.yaml":       {"apps/v1/DaemonSet"},
	"vgpu-mediator.yaml":   {"apps/v1/DaemonSet"},
	"kustomization.yaml":   {"kustomize.config.k8s.io/v1beta1/Kustomization"},
}

// load decodes every document of every manifest, failing on YAML errors
// and on files the test does not know.
func load(t *testing.T) map[string][]object {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]object{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var o object
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			got[f] = append(got[f], o)
		}
	}
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(wantKinds))) {
		t.Fatalf("manifests %v, want %v (a new file needs its kinds in wantKinds and kustomization.yaml)",
			slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(wantKinds)))
	}
	return got
}

func TestManifestsAreTheirKinds(t *testing.T) {
	m := load(t)
	ns := m["namespace.yaml"][0].Metadata.Name
	for f, objs := range m {
		var kinds []string
		for _, o := range objs {
			kinds = append(kinds, o.APIVersion+"/"+o.Kind)
			if o.Kind != "Kustomization" && o.Metadata.Name == "" {
				t.Errorf("%s: a %s without metadata.name", f, o.Kind)
			}
			namespaced := o.Kind == "ConfigMap" || o.Kind == "DaemonSet"
			if namespaced && o.Metadata.Namespace != ns {
				t.Errorf("%s: %s %s in namespace %q, want %q", f, o.Kind, o.Metadata.Name, o.Metadata.Namespace, ns)
			}
		}
		if !slices.Equal(kinds, wantKinds[f]) {
			t.Errorf("%s holds %v, want %v", f, kinds, wantKinds[f])
		}
	}
	var others []string
	for f := range wantKinds {
		if f != "kustomization.yaml" {
			others = append(others, f)
		}
	}
	if res := m["kustomization.yaml"][0].Resources; !slices.Equal(slices.Sorted(slices.Values(res)), slices.Sorted(slices.Values(others))) {
		t.Errorf("kustomization.yaml resources %v, want every manifest: %v", res, others)
	}
	for _, f := range []string{"vgpu-node.yaml", "vgpu-mediator.yaml"} {
		checkDaemonSet(t, f, m[f][0])
	}
}

// checkDaemonSet: the selector selects the template, every mount has its
// volume, and each container runs one of vgpu's binaries.
func checkDaemonSet(t *testing.T, file string, ds object) {
	t.Helper()
	sel := ds.Spec.Selector.MatchLabels
	if len(sel) == 0 {
		t.Errorf("%s: no selector", file)
	}
	for k, v := range sel {
		if ds.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("%s: selector %s=%s does not select the pod template (labels %v)", file, k, v, ds.Spec.Template.Metadata.Labels)
		}
	}
	pod := ds.Spec.Template.Spec
	volumes := map[string]bool{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = true
	}
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		if c.Image == "" {
			t.Errorf("%s: container %s has no image", file, c.Name)
		}
		for _, vm := range c.VolumeMounts {
			if !volumes[vm.Name] {
				t.Errorf("%s: container %s mounts volume %q, which the pod does not have", file, c.Name, vm.Name)
			}
		}
	}
	for _, c := range pod.Containers {
		if len(c.Command) != 1 || !strings.HasPrefix(filepath.Base(c.Command[0]), "vgpu-") {
			t.Errorf("%s: container %s runs %q, want one of vgpu's binaries", file, c.Name, c.Command)
		}
	}
}

// flagValues returns the values of --name V and --name=V in args, in order.
func flagValues(args []string, name string) []string {
	var vs []string
	for i, a := range args {
		switch {
		case a == "--"+name && i+1 < len(args):
			vs = append(vs, args[i+1])
		case strings.HasPrefix(a, "--"+name+"="):
			vs = append(vs, strings.TrimPrefix(a, "--"+name+"="))
		}
	}
	return vs
}

// installArgs are the arguments of "vgpuctl install containerd" in the
// install step's script.
func installArgs(t *testing.T, script string) []string {
	t.Helper()
	joined := strings.ReplaceAll(script, "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		_, rest, ok := strings.Cut(line, "vgpuctl install containerd")
		if !ok {
			continue
		}
		rest, _, _ = strings.Cut(rest, ")")
		return strings.Fields(rest)
	}
	t.Fatalf("the install step does not run vgpuctl install containerd:\n%s", script)
	return nil
}

func hostPath(pod podSpec, path string) bool {
	for _, v := range pod.Volumes {
		if v.HostPath != nil && v.HostPath.Path == path {
			return true
		}
	}
	return false
}

// TestRuntimeClassesMatchTheInstall: the quota ConfigMap's tenants, the
// install step's --tenant flags and the RuntimeClasses are the same set,
// and "vgpuctl install containerd" run with the step's flags (on a
// temporary copy of a host) writes exactly those handlers into the CRI
// plugin and, for each, the tenant, socket and state directory the
// mediator DaemonSet serves, into the runtime settings file.
func TestRuntimeClassesMatchTheInstall(t *testing.T) {
	m := load(t)
	cm := m["quota-configmap.yaml"][0]
	quota, err := isolation.Parse("quota-configmap.yaml tenants.toml", []byte(cm.Data["tenants.toml"]))
	if err != nil {
		t.Fatalf("the quota ConfigMap's tenants.toml: %v", err)
	}
	tenants := slices.Sorted(maps.Keys(quota.Tenants))

	ds := m["vgpu-mediator.yaml"][0]
	pod := ds.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || len(pod.InitContainers[0].Args) != 1 {
		t.Fatalf("vgpu-mediator.yaml: want one init container with a script, have %+v", pod.InitContainers)
	}
	script := pod.InitContainers[0].Args[0]
	if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
		t.Errorf("the install step's script does not parse as sh: %v\n%s", err, out)
	}
	args := installArgs(t, script)
	if got := slices.Sorted(slices.Values(flagValues(args, "tenant"))); !slices.Equal(got, tenants) {
		t.Errorf("the install step's --tenant flags %v, want the quota file's tenants %v", got, tenants)
	}
	one := func(name string) string {
		vs := flagValues(args, name)
		if len(vs) != 1 {
			t.Fatalf("the install step gives --%s %d times, want once: %q", name, len(vs), args)
		}
		return vs[0]
	}
	med := pod.Containers[0].Args
	socket, state := one("mediator-socket"), one("state-dir")
	if got := flagValues(med, "socket"); !slices.Equal(got, []string{socket}) {
		t.Errorf("the mediator serves %v, the runtimes are told %s", got, socket)
	}
	if got := flagValues(med, "container-dir"); !slices.Equal(got, []string{state}) {
		t.Errorf("the mediator's --container-dir %v, the runtimes' state directory %s", got, state)
	}
	if got := flagValues(med, "quota"); len(got) != 1 || filepath.Base(got[0]) != "tenants.toml" {
		t.Errorf("the mediator's --quota %v, want the ConfigMap's tenants.toml", got)
	}
	for _, p := range []string{filepath.Dir(socket), flagValues(med, "state-dir")[0], filepath.Dir(one("config")), filepath.Dir(one("settings")), filepath.Dir(one("runtime-path"))} {
		if !hostPath(pod, p) {
			t.Errorf("vgpu-mediator.yaml: no hostPath volume for %s", p)
		}
	}

	// The install, on a host in a temporary directory: the same flags,
	// its paths moved below the directory.
	root := t.TempDir()
	runtimePath := filepath.Join(root, one("runtime-path"))
	os.MkdirAll(filepath.Dir(runtimePath), 0o755)
	if err := os.WriteFile(runtimePath, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(root, one("config"))
	settings := filepath.Join(root, one("settings"))
	if _, err := integration.InstallContainerd(integration.InstallOptions{
		ConfigPath: config, RuntimePath: runtimePath, Tenants: flagValues(args, "tenant"),
		SettingsPath: settings, Socket: socket, StateDir: state,
	}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]struct {
					Options struct{ BinaryName string }
				} `toml:"runtimes"`
			} `toml:"containerd"`
		} `toml:"plugins"`
	}
	raw, _ := os.ReadFile(config)
	if err := toml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	runtimes := doc.Plugins["io.containerd.grpc.v1.cri"].Containerd.Runtimes
	var handlers []string
	for _, rc := range m["runtimeclasses.yaml"] {
		handlers = append(handlers, rc.Handler)
		if rc.Metadata.Name != rc.Handler {
			t.Errorf("RuntimeClass %s has handler %s: name them alike", rc.Metadata.Name, rc.Handler)
		}
	}
	wantHandlers := slices.Sorted(maps.Keys(runtimes))
	wantHandlers = slices.DeleteFunc(wantHandlers, func(h string) bool { return h == integration.RuntimeName })
	if slices.Sort(handlers); !slices.Equal(handlers, wantHandlers) {
		t.Fatalf("RuntimeClass handlers %v; the install writes the tenants' runtimes %v", handlers, wantHandlers)
	}
	f, ok, err := runtimehook.LoadSettingsFile(settings)
	if err != nil || !ok {
		t.Fatalf("runtime settings: %v (there: %v)", err, ok)
	}
	for _, h := range handlers {
		rt := f.Runtimes[h]
		binary := runtimes[h].Options.BinaryName
		if rt.Binary != binary || "vgpu-"+rt.Tenant != h || !slices.Contains(tenants, rt.Tenant) || rt.Socket != socket || rt.StateDir != state {
			t.Errorf("handler %s runs %s; its settings %+v: want that binary, tenant %s, socket %s, state %s", h, binary, rt, strings.TrimPrefix(h, "vgpu-"), socket, state)
		}
		if target, err := os.Readlink(binary); err != nil || target != runtimePath {
			t.Errorf("handler %s: %s -> %q, %v; want a link to vgpu-runtime", h, binary, target, err)
		}
	}
}
