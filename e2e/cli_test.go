package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	for _, name := range []string{"vgpu-node", "vgpu-mediator", "vgpu-hook", "vgpuctl"} {
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
	for _, name := range []string{"vgpu-runtime", "vgpu-hook"} {
		out, err := run(t, name, "--help")
		if err != nil || !strings.HasPrefix(out, "usage: "+name) {
			t.Errorf("%s --help: %v\n%s", name, err, out)
		}
	}
}
