package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/client"
)

const restartQuota = `
[namespaces]
moby = "team-a"

[tenants.team-a]
memory = "64MiB"
`

// restartable is a vgpu-mediator that a test kills and starts again on
// the same node, socket, quota file, container and state directories.
type restartable struct {
	t        *testing.T
	node     string
	nodeProc *proc // the node, whose log a test may read
	dir      string
	socket   string
	med      *proc
	flags    []string // more flags for each start
}

func newRestartable(t *testing.T, nodeFlags ...string) *restartable {
	t.Helper()
	r := &restartable{t: t, node: freePort(t), dir: t.TempDir()}
	r.nodeProc = startNodeAt(t, r.node, append([]string{"--devices", "1", "--memory", "256MiB"}, nodeFlags...)...)
	r.socket = filepath.Join(r.dir, "m.sock")
	if err := os.WriteFile(r.quotaFile(), []byte(restartQuota), 0o644); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *restartable) quotaFile() string    { return filepath.Join(r.dir, "tenants.toml") }
func (r *restartable) containerDir() string { return filepath.Join(r.dir, "c") }
func (r *restartable) stateFile() string    { return filepath.Join(r.dir, "state", "registrations.db") }

// start starts the mediator and waits until it serves: its socket may be
// the killed one's, left behind.
func (r *restartable) start() {
	r.t.Helper()
	r.med = startProc(r.t, "vgpu-mediator", append([]string{"--socket", r.socket, "--node", r.node, "--quota", r.quotaFile(),
		"--container-dir", r.containerDir(), "--state-dir", filepath.Join(r.dir, "state"), "--containerd", "", "--log-level", "info"},
		r.flags...)...)
	waitFor(r.t, "vgpu-mediator to serve", func() bool {
		c, err := net.Dial("unix", r.socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// kill SIGKILLs the mediator: nothing of its own ending runs.
func (r *restartable) kill() {
	r.t.Helper()
	if err := r.med.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		r.t.Fatal(err)
	}
	r.med.cmd.Wait()
}

func (r *restartable) register(reg api.Register) string {
	r.t.Helper()
	op, err := client.DialOperator(r.socket)
	if err != nil {
		r.t.Fatal(err)
	}
	defer op.Close()
	reply, err := op.Register(reg)
	if err != nil {
		r.t.Fatal(err)
	}
	return reply.Socket
}

// tenantList is vgpuctl tenants --json.
func (r *restartable) tenantList() []api.TenantInfo {
	r.t.Helper()
	out, err := run(r.t, "vgpuctl", "--socket", r.socket, "tenants", "--json")
	if err != nil {
		r.t.Fatalf("vgpuctl tenants: %v\n%s", err, out)
	}
	var ts []api.TenantInfo
	if err := json.Unmarshal([]byte(out), &ts); err != nil {
		r.t.Fatalf("vgpuctl tenants --json: %v\n%s", err, out)
	}
	return ts
}

// tenants is vgpuctl tenants --json by name, without the sessions' memory.
func (r *restartable) tenants() map[string]api.TenantInfo {
	r.t.Helper()
	byName := map[string]api.TenantInfo{}
	for _, ti := range r.tenantList() {
		ti.Allocated, ti.Charged = 0, 0 // sessions' memory: the tenant program's session ended before the kill
		byName[ti.Name] = ti
	}
	return byName
}

// computeThrough runs the tenant program through socket, which allocates
// and checks its results on the device.
func computeThrough(t *testing.T, socket string) error {
	t.Helper()
	out, err := run(t, "tenant", "--socket", socket, "--n", "4096")
	if err != nil || strings.TrimSpace(out) != "ok" {
		return fmt.Errorf("tenant through %s: %v\n%s", socket, err, out)
	}
	return nil
}

// sleeping starts a process standing for a container's init.
func sleeping(t *testing.T) *exec.Cmd {
	t.Helper()
	p := exec.Command("sleep", "600")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Process.Kill()
		p.Wait()
	})
	return p
}

// TestRegistrationsSurviveMediatorKill: a SIGKILLed mediator, started again
// with the same --state-dir, has the registrations it had: vgpuctl tenants
// shows the same reservations, each container's socket is there again and
// serves its tenant. A container whose process ended while the mediator was
// down is dropped, saying so, and its reservation returned.
func TestRegistrationsSurviveMediatorKill(t *testing.T) {
	r := newRestartable(t)
	r.start()
	live, doomed := sleeping(t), sleeping(t)
	runtimeDir := vocab.HostSocketDir(r.containerDir(), "moby", "live")
	if err := os.MkdirAll(runtimeDir, 0o755); err != nil { // the runtime's, before its hook registers
		t.Fatal(err)
	}
	liveSock := r.register(api.Register{Container: "live", Namespace: "moby", Memory: 16 << 20, Devices: 1, Pid: uint32(live.Process.Pid), SocketDir: runtimeDir})
	doomedSock := r.register(api.Register{Container: "doomed", Namespace: "moby", Memory: 8 << 20, Devices: 1, Pid: uint32(doomed.Process.Pid)})
	if err := computeThrough(t, liveSock); err != nil {
		t.Fatal(err)
	}
	before := r.tenants()
	if ti := before["team-a"]; ti.Containers != 2 || ti.Reserved != 24<<20 {
		t.Fatalf("team-a before the kill: %+v", ti)
	}

	r.kill()
	r.start()
	if after := r.tenants(); after["team-a"] != before["team-a"] {
		t.Fatalf("team-a after a kill and a start: %+v, want %+v as before", after["team-a"], before["team-a"])
	}
	for _, s := range []string{liveSock, doomedSock} {
		if err := computeThrough(t, s); err != nil {
			t.Fatalf("after a kill and a start: %v", err)
		}
	}

	r.kill()
	doomed.Process.Kill()
	doomed.Wait()
	r.start()
	ti := r.tenants()["team-a"]
	if ti.Containers != 1 || ti.Reserved != 16<<20 {
		t.Fatalf("team-a after its container %q ended while the mediator was down: %+v, want only %q's 16 MiB", "doomed", ti, "live")
	}
	if out := r.med.out.String(); !strings.Contains(out, "container=doomed") || !strings.Contains(out, "is gone") {
		t.Fatalf("the dropped registration was not logged, with why:\n%s", out)
	}
	if _, err := os.Lstat(doomedSock); !os.IsNotExist(err) {
		t.Fatalf("the dropped container's socket: %v, want it removed", err)
	}
	if err := computeThrough(t, liveSock); err != nil {
		t.Fatal(err)
	}
	// Its 8 MiB are free again: the cap admits a container of 48 MiB.
	r.register(api.Register{Container: "next", Namespace: "moby", Memory: 48 << 20, Devices: 1, Pid: uint32(live.Process.Pid)})
}

// TestCorruptRegistrationStore: a mediator whose state file was damaged
// while it was down starts, says which file it could not read and why,
// serves, and keeps registrations made from then on.
func TestCorruptRegistrationStore(t *testing.T) {
	r := newRestartable(t)
	r.start()
	p := sleeping(t)
	r.register(api.Register{Container: "c1", Namespace: "moby", Memory: 16 << 20, Devices: 1, Pid: uint32(p.Process.Pid)})
	r.kill()
	b, err := os.ReadFile(r.stateFile())
	if err != nil {
		t.Fatal(err)
	}
	for i := range b[:8192] { // both meta pages
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(r.stateFile(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	r.start()
	out := r.med.out.String()
	if !strings.Contains(out, r.stateFile()) || !strings.Contains(out, "unreadable") || !strings.Contains(out, "invalid database") {
		t.Fatalf("the damaged file was not named, with its problem:\n%s", out)
	}
	if ti := r.tenants()["team-a"]; ti.Containers != 0 {
		t.Fatalf("restored from a damaged file: %+v", ti)
	}
	aside, err := filepath.Glob(r.stateFile() + ".unreadable-*")
	if err != nil || len(aside) != 1 {
		t.Fatalf("the damaged file kept aside: %v, %v", aside, err)
	}
	sock := r.register(api.Register{Container: "c2", Namespace: "moby", Memory: 16 << 20, Devices: 1, Pid: uint32(p.Process.Pid)})
	r.kill()
	r.start()
	if ti := r.tenants()["team-a"]; ti.Containers != 1 || ti.Reserved != 16<<20 {
		t.Fatalf("a registration made after the damaged file was set aside: %+v, want it restored", ti)
	}
	if err := computeThrough(t, sock); err != nil {
		t.Fatal(err)
	}
}
