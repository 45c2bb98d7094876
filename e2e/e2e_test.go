// Package e2e runs the real binaries as separate processes on loopback, in
// a temporary directory: vgpu-node, vgpu-mediator, tenant programs and
// vgpuctl, the way an operator and tenants use them.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/internal/fakegpu"
)

var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vgpu-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = dir
	build := exec.Command("go", "build", "-o", dir+"/",
		"github.com/vgpu/vgpu/cmd/...", "github.com/vgpu/vgpu/examples/tenant", "github.com/vgpu/vgpu/e2e/hostile",
		"github.com/vgpu/vgpu/e2e/tenantdial")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	fakegpu.Remove()
	os.Exit(code)
}

// proc is a daemon started for a test, stopped with SIGTERM at cleanup.
type proc struct {
	cmd *exec.Cmd
	out *output
}

// output collects a process's stdout and stderr; a test may read it while
// the process still writes.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// waitLog waits until the output holds every one of lines, failing t with
// what and the output after 10 s: a process's log comes through a pipe
// and may trail what the test saw it do.
func (o *output) waitLog(t *testing.T, what string, lines ...string) {
	t.Helper()
	has := func() bool {
		out := o.String()
		for _, l := range lines {
			if !strings.Contains(out, l) {
				return false
			}
		}
		return true
	}
	if !poll(10*time.Second, has) {
		t.Fatalf("%s:\n%s", what, o)
	}
}

func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startProcAs(t, nil, name, args...)
}

// startProcAs is startProc with the process's credentials (nil: the test's).
func startProcAs(t *testing.T, cred *syscall.Credential, name string, args ...string) *proc {
	t.Helper()
	return startProcWith(t, cred, nil, name, args...)
}

// startProcWith is startProcAs with env added to the test's environment.
func startProcWith(t *testing.T, cred *syscall.Credential, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(filepath.Join(bin, name), args...), out: &output{}}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan error, 1)
			go func() { done <- p.cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s did not stop cleanly: %v\n%s", name, err, p.out)
				}
			case <-time.After(10 * time.Second):
				p.cmd.Process.Kill()
				t.Errorf("%s ignored SIGTERM for 10s\n%s", name, p.out)
			}
		}
	})
	return p
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	waitWithin(t, 10*time.Second, what, ok)
}

// waitWithin is waitFor with a time limit of d.
func waitWithin(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	if !poll(d, ok) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// poll calls ok until it holds, for at most d, and reports whether it did.
func poll(d time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// cluster starts a vgpu-node with two sim devices and a vgpu-mediator using it.
func cluster(t *testing.T) (socket string) {
	return startSystem(t, []string{"--devices", "2", "--memory", "1GiB"}, nil)
}

// startSystem starts a vgpu-node and a vgpu-mediator using it, each with
// extra flags, and returns the mediator's socket.
func startSystem(t *testing.T, nodeFlags, mediatorFlags []string) (socket string) {
	t.Helper()
	return startMediator(t, startNode(t, nodeFlags...), mediatorFlags...)
}

// startMediator starts a vgpu-mediator using the node at addr, with extra
// flags, and returns its socket.
func startMediator(t *testing.T, addr string, mediatorFlags ...string) (socket string) {
	t.Helper()
	dir := t.TempDir()
	socket = filepath.Join(dir, "mediator.sock")
	startProc(t, "vgpu-mediator", append([]string{"--socket", socket, "--node", addr, "--state-dir", dir,
		"--quota", "", "--containerd", "", "--log-level", "warn"}, mediatorFlags...)...)
	waitFor(t, "vgpu-mediator to serve on its socket", func() bool { return daemon.Serving(socket) })
	return socket
}

// startNode starts a vgpu-node with extra flags and returns its address.
func startNode(t *testing.T, flags ...string) (addr string) {
	t.Helper()
	addr = freePort(t)
	startNodeAt(t, addr, flags...)
	return addr
}

// startNodeAt starts a vgpu-node listening on addr, with extra flags, and
// waits until it accepts connections.
func startNodeAt(t *testing.T, addr string, flags ...string) *proc {
	t.Helper()
	return startNodeWith(t, nil, addr, append([]string{"--log-level", "warn"}, flags...)...)
}

// startNodeWith starts a vgpu-node listening on addr, with env added to
// the test's environment and extra flags, and waits until it accepts
// connections.
func startNodeWith(t *testing.T, env []string, addr string, flags ...string) *proc {
	t.Helper()
	p := startProcWith(t, nil, env, "vgpu-node", append([]string{"--listen", addr}, flags...)...)
	// A CUDA node creates its device memory before it listens, and the
	// fake driver fills what it creates with old bytes, as a GPU's memory
	// holds: page faults on fresh host pages, about 7 s a GiB on these
	// hosts when quiet, more under load.
	waitWithin(t, time.Minute, "vgpu-node to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return p
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, name), args...).CombinedOutput()
	return string(out), err
}

func status(t *testing.T, socket string) api.Status {
	t.Helper()
	out, err := run(t, "vgpuctl", "--socket", socket, "status", "--json")
	if err != nil {
		t.Fatalf("vgpuctl status: %v\n%s", err, out)
	}
	var st api.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out)
	}
	return st
}

func idle(st api.Status) bool {
	for _, n := range st.Nodes {
		for _, d := range n.Devices {
			if d.Used != 0 {
				return false
			}
		}
	}
	return len(st.Tenants) == 0
}

func TestTwoTenantProcesses(t *testing.T) {
	socket := cluster(t)
	var wg sync.WaitGroup
	for _, tenant := range []string{"alice", "bob"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := run(t, "tenant", "--socket", socket, "--tenant", tenant, "--n", "3000000")
			if err != nil || strings.TrimSpace(out) != "ok" {
				t.Errorf("tenant %s: %v\n%s", tenant, err, out)
			}
		}()
	}
	wg.Wait()
	waitFor(t, "all memory released", func() bool { return idle(status(t, socket)) })
	st := status(t, socket)
	if len(st.Nodes) != 1 || len(st.Nodes[0].Devices) != 2 || st.Nodes[0].Devices[0].Memory != 1<<30 {
		t.Fatalf("status nodes = %+v", st.Nodes)
	}
}

func TestKilledTenantIsReleased(t *testing.T) {
	socket := cluster(t)
	cmd := exec.Command(filepath.Join(bin, "tenant"), "--socket", socket, "--tenant", "doomed", "--hold", "5m")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the tenant to hold memory", func() bool {
		st := status(t, socket)
		return len(st.Tenants) == 1 && st.Tenants[0].Mapped > 0 && st.Tenants[0].Launches == 3
	})
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, "the killed tenant's memory to be released", func() bool { return idle(status(t, socket)) })
}

func TestDemoChecksEveryResult(t *testing.T) {
	socket := cluster(t)
	out, err := run(t, "vgpuctl", "--socket", socket, "demo")
	if err != nil {
		t.Fatalf("vgpuctl demo: %v\n%s", err, out)
	}
	if n := strings.Count(out, "passed"); n != 4 {
		t.Fatalf("want 4 passed checks, got %d:\n%s", n, out)
	}
	if strings.Contains(out, "\r") { // its output is a pipe: no progress line
		t.Errorf("vgpuctl demo drew a progress line into a pipe:\n%q", out)
	}
	waitFor(t, "all memory released", func() bool { return idle(status(t, socket)) })
}

func TestEmbeddedDefault(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "m.sock")
	med := startProc(t, "vgpu-mediator", "--socket", socket, "--embedded-memory", "512MiB", "--state-dir", "",
		"--quota", "", "--containerd", "", "--log-level", "warn")
	waitFor(t, "vgpu-mediator to serve on its socket", func() bool { return daemon.Serving(socket) })
	out, err := run(t, "tenant", "--socket", socket, "--tenant", "solo")
	if err != nil {
		t.Fatalf("tenant: %v\n%s", err, out)
	}
	// A clean stop removes the socket.
	med.cmd.Process.Signal(syscall.SIGTERM)
	if err := med.cmd.Wait(); err != nil {
		t.Fatalf("mediator exit: %v\n%s", err, med.out)
	}
	if _, err := os.Stat(socket); !os.IsNotExist(err) {
		t.Fatalf("socket left behind after stop: %v", err)
	}
}

func TestBadFlagsNameTheValue(t *testing.T) {
	out, err := run(t, "vgpu-node", "--memory", "12X")
	if err == nil || !strings.Contains(out, `"12X"`) {
		t.Fatalf("vgpu-node --memory 12X: err %v, output %q", err, out)
	}
	out, err = run(t, "vgpu-mediator", "--node", freePort(t), "--socket", filepath.Join(t.TempDir(), "s"), "--state-dir", "")
	if err == nil || !strings.Contains(out, "unavailable") {
		t.Fatalf("mediator with unreachable node: err %v, output %q", err, out)
	}
	out, err = run(t, "tenant", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if err == nil || !strings.Contains(out, "none.sock") {
		t.Fatalf("tenant without mediator: err %v, output %q", err, out)
	}
}

func TestBenchReportsRatios(t *testing.T) {
	socket := cluster(t)
	out, err := run(t, "vgpuctl", "--socket", socket, "bench", "--json", "--size", "8MiB", "--rounds", "1", "--window", "20ms", "--ops", "50", "--tenants", "1,2", "--dlrm-steps", "2")
	if err != nil {
		t.Fatalf("vgpuctl bench: %v\n%s", err, out)
	}
	r := benchJSON(t, out)
	for _, k := range []string{"h2d_ratio", "d2h_ratio", "small_op_ratio", "raw_tcp_mb_per_s", "raw_ping_pong_us", "launches_per_s", "hint_bytes_ratio"} {
		if !(r[k] > 0) {
			t.Errorf("%s = %v, want a positive measurement", k, r[k])
		}
	}
	// The node retains the sealed weights of the DLRM runs after their
	// sessions: a tenant back after a restart is not sent them again.
	if k := "dlrm_1_tenants_reload_ratio"; !(r[k] > 2) {
		t.Errorf("%s = %v: a tenant reloading its sealed weights was sent them again", k, r[k])
	}
	waitFor(t, "all memory released", func() bool { return idle(status(t, socket)) })
	retained := 0
	for _, n := range status(t, socket).Nodes {
		for _, d := range n.Devices {
			retained += d.Retained
		}
	}
	if retained == 0 {
		t.Error("no device reports the sealed weights it retained")
	}
}

// benchJSON decodes vgpuctl bench --json output: its measurements, which
// are numbers (other keys describe the run).
func benchJSON(t *testing.T, out string) map[string]float64 {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, out)
	}
	r := map[string]float64{}
	for k, v := range raw {
		if f, ok := v.(float64); ok {
			r[k] = f
		}
	}
	return r
}

// A tenant process works on a buffer 1.5 times its device's memory through
// real vgpu-node and vgpu-mediator processes and gets exact results.
func TestOversubscribedBuffer(t *testing.T) {
	socket := startSystem(t, []string{"--devices", "1", "--memory", "32MiB"},
		[]string{"--oversubscribe", "2", "--host-memory", "8MiB"})
	// Two 24 MiB vectors; each launch works on a 2 MiB window of them.
	out, err := run(t, "tenant", "--socket", socket, "--tenant", "big", "--n", fmt.Sprint(6<<20), "--window", fmt.Sprint(512<<10))
	if err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("tenant over 48 MiB on a 32 MiB device: %v\n%s", err, out)
	}
	waitFor(t, "all memory released", func() bool {
		st := status(t, socket)
		return idle(st) && st.HostRAM == 0 && st.HostSpilled == 0
	})
}
