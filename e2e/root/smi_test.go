package root

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/client"
)

// A container granted 256MiB runs vgpu-smi, which the runtime mounted
// read-only (it sits beside vgpu-runtime): the output shows its own tenant, its
// grant as its device's memory and its own session, and nothing of the
// tenant computing alongside on the host socket or of the other container
// of its tenant.
func TestDockerVgpuSmiShowsItsOwnVGPU(t *testing.T) {
	h := vgpuEnv(t)
	if err := h.missing["vgpu-smi"]; err != nil {
		t.Fatalf("this test needs vgpu-smi (cmd/vgpu-smi): %v", err)
	}
	// Another tenant, on the host socket, holding memory.
	other, err := client.Dial(client.Options{Socket: h.medSock, Tenant: "team-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Malloc(0, 48<<20); err != nil {
		t.Fatal(err)
	}
	// Another container of its own tenant, alongside.
	args := append(dockerRun("vgpu", "-d", "-e", "VGPU_MEMORY=128MiB"), dockerImage, "/tenant", "--n", "100000", "--hold", "5m")
	sibling := strings.TrimSpace(h.docker(t, args...))
	t.Cleanup(func() { h.dockerCmd(context.Background(), "rm", "-f", sibling) })

	// The tenant program holds its session while vgpu-smi looks.
	script := `/tenant --n 1000000 --hold 30s & for i in 1 2 3 4 5 6 7 8 9 10; do ` +
		`/usr/local/bin/vgpu-smi > /tmp/smi && grep -q 'Session  Devices' /tmp/smi && break; sleep 0.5; done; cat /tmp/smi; kill %1; ` +
		`if echo x 2>/dev/null > /usr/local/bin/vgpu-smi; then echo "vgpu-smi is writable"; fi`
	args = append(dockerRun("vgpu", "--rm", "-e", "VGPU_MEMORY=256MiB"), dockerImage, "/bin/sh", "-c", script)
	out := h.docker(t, args...)
	t.Logf("vgpu-smi in the container:\n%s", out)
	for _, want := range []string{"Tenant: team-a", "/ 256MiB", "Memory: ", "sim"} {
		if !strings.Contains(out, want) {
			t.Errorf("vgpu-smi's output lacks %q", want)
		}
	}
	if sessions := sessionRow.FindAllString(out, -1); len(sessions) != 1 {
		t.Errorf("vgpu-smi shows sessions %q, want the container's one", sessions)
	}
	if strings.Contains(out, "writable") {
		t.Error("the container could write the host's vgpu-smi through its mount")
	}
	for _, foreign := range []string{"team-b", "128MiB", sibling[:12]} {
		if strings.Contains(out, foreign) {
			t.Errorf("vgpu-smi in the container shows another's %q", foreign)
		}
	}
	h.dockerCmd(context.Background(), "rm", "-f", sibling)
	other.Close()
	h.waitIdle(t, 10*time.Second, "after the containers and the other tenant ended")
}

// sessionRow is a session's row in vgpu-smi's table: its id, devices and
// allocated memory.
var sessionRow = regexp.MustCompile(`(?m)^\| \d+ +\d+ +\d+MiB`)
