package main

import (
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/systest"
)

// The view of a container granted 256 MiB of a 1 GiB device, with one
// session that holds 6 MiB and ran a quarter of the sampled time.
func TestRender(t *testing.T) {
	prev := &api.SelfStatus{Devices: []api.SelfDevice{{Index: 0, DeviceTime: time.Second}}}
	cur := &api.SelfStatus{
		Tenant: "team-a", Container: "c0ffee", Namespace: "moby", Memory: 256 << 20, Resident: 256 << 20, Charged: 6 << 20,
		Compute: 2, ComputeMax: 0.5,
		Devices:  []api.SelfDevice{{Index: 0, Name: "sim0", Node: "10.0.0.7:7070", Memory: 256 << 20, Used: 6 << 20, DeviceTime: time.Second + 100*time.Millisecond, Launches: 12}},
		Sessions: []api.TenantStatus{{Tenant: "team-a", Session: 7, Devices: 1, Allocated: 6 << 20, Resident: 6 << 20, CopiedIn: 1 << 20, Launches: 12}},
	}
	out := render(prev, cur, 400*time.Millisecond)
	for _, want := range []string{"Tenant: team-a", "c0ffee (namespace moby)", "6MiB / 256MiB", "weight 2, cap 50%", "sim0", "10.0.0.7:7070", " 25% ", "No sessions"} {
		if want == "No sessions" {
			if strings.Contains(out, want) {
				t.Errorf("a container with a session says %q", want)
			}
			continue
		}
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for i, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if n := len([]rune(l)); n > 80 {
			t.Errorf("line %d is %d columns, more than 80: %q", i, n, l)
		}
		if strings.Contains(l, "~") { // nothing here is long enough to be cut
			t.Errorf("line %d is cut: %q", i, l)
		}
	}
	// One reading: no utilization; no session: no device behind it.
	empty := &api.SelfStatus{Tenant: "t", Container: "c", Memory: 1 << 30, Devices: []api.SelfDevice{{Memory: 1 << 30}}}
	out = render(nil, empty, 0)
	for _, want := range []string{"0MiB / 1024MiB", "(no session)", "No sessions", "cap none", "no cap"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// vgpu-smi, built as it ships (CGO_ENABLED=0), is a static binary without
// NVML, and over a container's socket shows that container only.
func TestSmiOverAContainerSocket(t *testing.T) {
	deps, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(deps), "go-nvml") {
		t.Fatal("vgpu-smi imports go-nvml")
	}
	dir, err := os.MkdirTemp("", "vgpu-smi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "vgpu-smi")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("vgpu-smi has a dynamic loader: it is not static")
		}
	}
	f.Close()

	_, sock := systest.StartWith(t, systest.Options{Devices: 1, Size: 1 << 30,
		Quota: "[namespaces]\nmoby = \"team-a\"\nk8s = \"team-b\"\n[tenants.team-a]\n[tenants.team-b]\n"})
	op, err := client.DialOperator(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	sockets := map[string]string{}
	for _, r := range []struct {
		ns, id string
		memory uint64
	}{{"moby", "mine", 256 << 20}, {"k8s", "theirs", 128 << 20}} {
		reply, err := op.Register(api.Register{Container: r.id, Namespace: r.ns, Memory: r.memory, Pid: uint32(os.Getpid())})
		if err != nil {
			t.Fatal(err)
		}
		sockets[r.id] = reply.Socket
		c, err := client.Dial(client.Options{Socket: reply.Socket})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Malloc(0, 8<<20); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "VGPU_SOCKET="+sockets["mine"])
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("vgpu-smi: %v\n%s", err, out)
	}
	for _, want := range []string{"Tenant: team-a", "mine (namespace moby)", "8MiB / 256MiB", "sim0"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("vgpu-smi's output lacks %q:\n%s", want, out)
		}
	}
	for _, other := range []string{"team-b", "theirs", "128MiB"} {
		if strings.Contains(string(out), other) {
			t.Errorf("vgpu-smi shows the other tenant's %q:\n%s", other, out)
		}
	}
	// --json is the mediator's answer, for scripts.
	cmd = exec.Command(bin, "--json", "--sample", "0", "--socket", sockets["mine"])
	out, err = cmd.Output()
	var self api.SelfStatus
	if err != nil || json.Unmarshal(out, &self) != nil || self.Tenant != "team-a" || self.Memory != 256<<20 || len(self.Sessions) != 1 {
		t.Fatalf("vgpu-smi --json: %v, %+v\n%s", err, self, out)
	}
	// On the host socket there is no container to show: a typed refusal.
	out, err = exec.Command(bin, "--socket", sock).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "permission denied") {
		t.Fatalf("vgpu-smi on the host socket: %v\n%s", err, out)
	}
}

// Help and version print and exit 0; bad usage exits 2.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--help"}, 0, "usage: vgpu-smi"},
		{[]string{"-h"}, 0, "usage: vgpu-smi"},
		{[]string{"--version"}, 0, "vgpu-smi "},
		{[]string{"--sample", "-1s"}, 2, "--sample"},
		{[]string{"extra"}, 2, "unexpected argument"},
	} {
		var out, errOut strings.Builder
		if code := run(tc.args, &out, &errOut); code != tc.code || !strings.Contains(out.String()+errOut.String(), tc.want) {
			t.Errorf("vgpu-smi %v: exit %d, want %d; output %q %q, want %q", tc.args, code, tc.code, out.String(), errOut.String(), tc.want)
		}
	}
}
