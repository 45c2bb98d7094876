package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/daemon"
)

// The global flags work after the command, and $VGPU_SOCKET stands in for
// --socket, against a real mediator.
func TestVgpuctlGlobalFlagsAfterCommand(t *testing.T) {
	socket := startSystem(t, []string{"--memory", "1GiB"}, nil)
	for _, args := range [][]string{
		{"status", "--socket", socket},
		{"status", "--json", "--socket=" + socket, "--timeout", "5s"},
		{"tenants", "--socket", socket},
		{"kernels", "-socket", socket},
	} {
		if out, err := run(t, "vgpuctl", args...); err != nil {
			t.Errorf("vgpuctl %v: %v\n%s", args, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "vgpuctl"), "status", "--json")
	cmd.Env = append(os.Environ(), "VGPU_SOCKET="+socket)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), `"nodes"`) {
		t.Errorf("VGPU_SOCKET=%s vgpuctl status --json: %v\n%s", socket, err, out)
	}
}

// Every binary says which build it is and which protocol it speaks, and
// exits 0.
func TestEveryBinaryHasVersion(t *testing.T) {
	for _, name := range []string{"vgpu-node", "vgpu-mediator", "vgpu-hook", "vgpuctl", "vgpu-smi"} {
		out, err := run(t, name, "--version")
		if err != nil || !strings.HasPrefix(out, name+" ") || !strings.Contains(out, "(protocol ") {
			t.Errorf("%s --version: %v\n%s", name, err, out)
		}
	}
	// The runtime wrapper's line comes first; the real runtime's follows.
	fake := filepath.Join(t.TempDir(), "runc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"fake runc $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "vgpu-runtime", "--vgpu-runtime", fake, "--version")
	if err != nil || !strings.HasPrefix(out, "vgpu-runtime ") || !strings.HasSuffix(out, "\nfake runc --version\n") {
		t.Errorf("vgpu-runtime --version: %v\n%s", err, out)
	}
	for _, name := range []string{"vgpu-runtime", "vgpu-hook", "vgpu-smi"} {
		out, err := run(t, name, "--help")
		if err != nil || !strings.HasPrefix(out, "usage: "+name) {
			t.Errorf("%s --help: %v\n%s", name, err, out)
		}
	}
}

// With its node killed, vgpuctl status (and --json) still prints the
// status, exits 3 and names the node on stderr, and a registration is
// refused as unavailable, naming the node, rather than admitting a
// container that would fail at its first call. With the node back, status
// exits 0 and the container is admitted.
func TestNodeDownStatusAndAdmission(t *testing.T) {
	addr := freePort(t)
	nodeFlags := []string{"--devices", "1", "--memory", "256MiB"}
	node := startNodeAt(t, addr, nodeFlags...)
	dir := t.TempDir()
	socket := filepath.Join(dir, "m.sock")
	startProc(t, "vgpu-mediator", "--socket", socket, "--node", addr, "--state-dir", dir, "--container-dir", filepath.Join(dir, "c"),
		"--quota", "", "--containerd", "", "--log-level", "warn")
	waitFor(t, "vgpu-mediator to serve on its socket", func() bool { return daemon.Serving(socket) })
	for _, args := range [][]string{{"status"}, {"status", "--json"}} {
		if code, stdout, stderr := vgpuctlStatus(t, socket, args...); code != 0 {
			t.Fatalf("vgpuctl %v with the node up: exit %d\n%s%s", args, code, stdout, stderr)
		}
	}

	if err := node.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	node.cmd.Wait()
	for _, args := range [][]string{{"status"}, {"status", "--json"}} {
		code, stdout, stderr := vgpuctlStatus(t, socket, args...)
		if code != 3 || !strings.Contains(stderr, addr) || !strings.Contains(stdout, addr) {
			t.Errorf("vgpuctl %v with the node killed: exit %d, want 3 with the status on stdout and node %s named on stderr\nstdout:\n%s\nstderr:\n%s",
				args, code, addr, stdout, stderr)
		}
	}
	reg := api.Register{Container: "c1", Namespace: "moby", Memory: 16 << 20, Pid: uint32(os.Getpid())}
	if _, err := register(t, socket, reg); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("register with the node killed: %v, want unavailable naming node %s", err, addr)
	}

	startNodeAt(t, addr, nodeFlags...)
	if code, stdout, stderr := vgpuctlStatus(t, socket, "status"); code != 0 {
		t.Errorf("vgpuctl status with the node back: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := register(t, socket, reg); err != nil {
		t.Fatalf("register with the node back: %v", err)
	}
}

// vgpuctlStatus runs vgpuctl against socket and returns its exit status,
// stdout and stderr apart.
func vgpuctlStatus(t *testing.T, socket string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "vgpuctl"), append([]string{"--socket", socket}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("vgpuctl %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// register registers a container with the mediator at socket, as the hook does.
func register(t *testing.T, socket string, reg api.Register) (*api.RegisterReply, error) {
	t.Helper()
	op, err := client.DialOperator(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	return op.Register(reg)
}
