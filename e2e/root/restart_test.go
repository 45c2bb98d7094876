package root

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// Issue #22's symptom, part 1: a container running under the vgpu runtime
// keeps its vGPU across a SIGKILL of the mediator. The mediator started
// again has the container's registration (vgpuctl tenants shows the same
// reservation), its socket is back in the directory mounted at the
// container's /run/vgpu, and a program started in the container computes
// through it; the container's end then releases it as before.
func TestDockerContainerKeepsItsVGPUAcrossAMediatorKill(t *testing.T) {
	h := vgpuEnv(t)
	args := append(dockerRun("vgpu", "-d", "-e", "VGPU_MEMORY=64MiB"), dockerImage, "/bin/sh", "-c", "exec sleep 600")
	id := strings.TrimSpace(h.docker(t, args...))
	t.Cleanup(func() { h.dockerCmd(context.Background(), "rm", "-f", id) })
	compute := func(when string) {
		t.Helper()
		if got := lines(h.docker(t, "exec", id, "/testimage")); !slices.Equal(got, []string{"ok"}) {
			t.Fatalf("%s: the program in the container printed %q, want [ok]", when, got)
		}
	}
	compute("before the kill")
	before := tenant(h.tenants(t), "team-a")
	before.Allocated, before.Charged = 0, 0 // sessions' memory, which does not survive yet
	if before.Containers != 1 || before.Reserved != 64<<20 {
		t.Fatalf("tenant team-a while the container runs: %+v", before)
	}

	h.killMediator(t)
	if err := h.serveMediator(); err != nil {
		t.Fatalf("the mediator started again: %v\n%s", err, h.med.tail(20))
	}
	after := tenant(h.tenants(t), "team-a")
	after.Allocated, after.Charged = 0, 0
	if after != before {
		t.Fatalf("tenant team-a after the mediator's kill and start: %+v, want %+v as before\n%s", after, before, h.med.tail(20))
	}
	compute("after the mediator's kill and start")

	h.docker(t, "rm", "-f", id)
	took := h.waitIdle(t, 10*time.Second, "after the container was removed")
	t.Logf("mediator idle %v after docker rm -f", took)
}
