package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/systest"
	"github.com/vgpu/vgpu/internal/testenv"
	"github.com/vgpu/vgpu/mediator"
)

// topQuota gives team-a weight 1 and team-b weight 3.
const topQuota = "[namespaces]\nmoby = \"team-a\"\n[tenants.team-a]\nmemory = \"512MiB\"\n[tenants.team-b]\ncompute = 3\n"

// topMediator starts a mediator on one sim node of two 1 GiB devices, with
// topQuota, its socket in dir, and returns it and its socket.
func topMediator(t *testing.T, dir string) (*mediator.Mediator, string) {
	t.Helper()
	return systest.StartWith(t, systest.Options{Devices: 2, Size: 1 << 30, Quota: topQuota, Dir: dir})
}

// busy keeps a tenant session computing until the test ends.
func busy(t *testing.T, opt client.Options) {
	t.Helper()
	c, err := client.Dial(opt)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 18
	x, err := c.Malloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		data := make([]byte, 4*n)
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := c.Stream()
			s.CopyToDevice(x, data)
			s.Launch("saxpy", client.I64(n), client.F32(2), client.Buf(x), client.Buf(x))
			if s.Synchronize() != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done; c.Close() })
}

// tmux drives a tmux server of the test's own (-L), never the user's.
type tmux struct {
	t      *testing.T
	server string
}

func (x tmux) run(args ...string) string {
	x.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", x.server, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		x.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// waitScreen captures the pane until ok accepts it, for up to 15s.
func (x tmux) waitScreen(what string, ok func(screen string) bool) string {
	x.t.Helper()
	var screen string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		screen = x.run("capture-pane", "-p", "-t", "top")
		if ok(screen) {
			return screen
		}
	}
	x.t.Fatalf("%s: the pane shows:\n%s", what, screen)
	return ""
}

// vgpuctl top on a real terminal: an 80x24 tmux pane shows the devices,
// the tenants with their shares and the sessions of a live mediator; at 20
// columns it still draws, cut to the width; q quits with status 0. Over a
// container's socket it shows that container only.
func TestTopInTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		testenv.Missing(t, "tmux not installed")
	}
	dir, err := os.MkdirTemp("", "vgpu-top")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, sock := topMediator(t, dir)
	busy(t, client.Options{Socket: sock, Tenant: "team-a"})
	busy(t, client.Options{Socket: sock, Tenant: "team-b"})

	x := tmux{t: t, server: "vgpu-top-" + filepath.Base(dir)}
	t.Cleanup(func() { exec.Command("tmux", "-L", x.server, "kill-server").Run() })
	status := filepath.Join(dir, "status")
	start := func(socket string) {
		x.run("new-session", "-d", "-s", "top", "-x", "80", "-y", "24",
			"sh", "-c", vgpuctlBin+" --socket "+socket+" top --interval 300ms; echo $? > "+status+"; sleep 60")
	}
	start(sock)
	screen := x.waitScreen("80x24: devices, both tenants with rates, sessions", func(s string) bool {
		return strings.Contains(s, "/0 sim0") && strings.Contains(s, "/1 sim1") &&
			lineWith(s, "team-a", "%") && lineWith(s, "team-b", "%") && strings.Contains(s, "SESSION")
	})
	t.Logf("80x24:\n%s", screen)
	for i, l := range strings.Split(screen, "\n") {
		if n := len([]rune(l)); n > 80 {
			t.Fatalf("line %d is %d columns: %q", i, n, l)
		}
	}

	x.run("resize-window", "-t", "top", "-x", "20", "-y", "24")
	screen = x.waitScreen("20 columns", func(s string) bool {
		return strings.HasPrefix(s, "vgpuctl top - ") && lineWith(s, " team-a") && !lineWith(s, "MEMORY/CAP")
	})
	t.Logf("20x24:\n%s", screen)
	for i, l := range strings.Split(screen, "\n") {
		if n := len([]rune(l)); n > 20 {
			t.Fatalf("at 20 columns line %d is %d: %q", i, n, l)
		}
	}

	x.run("send-keys", "-t", "top", "q")
	if code := waitFile(t, status); code != "0" {
		t.Fatalf("vgpuctl top exited %s after q", code)
	}
	x.run("kill-session", "-t", "top")

	// Over a container's socket: that container only.
	op, err := client.DialOperator(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	reg, err := op.Register(api.Register{Container: "mine", Namespace: "moby", Memory: 256 << 20, Pid: uint32(os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	busy(t, client.Options{Socket: reg.Socket})
	os.Remove(status)
	start(reg.Socket)
	screen = x.waitScreen("a container's view", func(s string) bool {
		return strings.Contains(s, "view: container mine of tenant team-a") && lineWith(s, "vgpu0 sim", "/256M") && lineWith(s, "team-a", "%")
	})
	t.Logf("container:\n%s", screen)
	if strings.Contains(screen, "team-b") {
		t.Fatalf("the container's view shows the other tenant:\n%s", screen)
	}
	x.run("send-keys", "-t", "top", "C-c")
	if code := waitFile(t, status); code != "0" {
		t.Fatalf("vgpuctl top exited %s after Ctrl-C", code)
	}
}

// lineWith reports whether a line of screen has every one of parts.
func lineWith(screen string, parts ...string) bool {
	for _, l := range strings.Split(screen, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}

// waitFile waits up to 10s for the file to hold a line, and returns it.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("%s not written in 10s: the program did not exit", path)
	return ""
}

// A reading that fails keeps the last good one on the screen with the
// error, and the next reading dials again: a mediator started again on the
// socket is shown again.
func TestTopReaderReconnects(t *testing.T) {
	dir, err := os.MkdirTemp("", "vgpu-top")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	m, sock := topMediator(t, dir)
	dials := 0
	r := &topReader{socket: sock, every: time.Second, dial: func() (*client.Operator, error) {
		dials++
		return client.DialOperatorTimeout(sock, 5*time.Second)
	}}
	first := r.read()
	if first.Err != nil || first.Status == nil || len(first.Tenants) != 2 {
		t.Fatalf("first reading: %+v", first)
	}
	m.Close()
	os.Remove(sock)
	failed := r.read()
	if failed.Err == nil || failed.Status != first.Status {
		t.Fatalf("a reading of a stopped mediator: err %v, status %p, want the error over the last good status %p", failed.Err, failed.Status, first.Status)
	}
	if out := renderTop(nil, failed, 80, 24); !strings.Contains(out, "! ") || !strings.Contains(out, "team-a") {
		t.Fatalf("the screen after a failed reading:\n%s", out)
	}
	if down := r.read(); down.Err == nil || down.Status != first.Status { // dials, and fails
		t.Fatalf("a second reading of the stopped mediator: err %v", down.Err)
	}
	topMediator(t, dir)
	again := r.read()
	if again.Err != nil || again.Status == nil || again.Status == first.Status {
		t.Fatalf("a reading of the restarted mediator: %+v", again)
	}
	if dials != 3 { // the first, one to the stopped mediator, one to the restarted
		t.Fatalf("%d dials, want 3", dials)
	}
}
